"""One compaction at a time per table, and none inside another writer's pinned commit.

delta-rs 1.6 does not count a winning commit's ``dataChange=false`` removes as a
conflict: two OPTIMIZE runs that read the same small files both commit (every row then
appears twice), and an overwrite that read files a compaction has just replaced commits
its removes of files already gone, keeping the compacted copy of the rows it meant to
replace. Measured here with deltalake 1.6.6 on a local table.

So every delta-rs compaction (auto compaction, OPTIMIZE, REORG) and every delta-rs commit
that removes files it read holds this lease: ``<table>/_delta_staging/_compaction-<n>.lease``,
created with put-if-absent (:mod:`deltaflow.table._conditional_put`: a hard link locally,
``If-None-Match: *`` on S3, GCS and Azure). A holder of ``n`` is alone: the next one must
create ``n + 1``, which only one process can, and only once ``n`` is released or older
than :data:`STALE_SECONDS` (a holder that crashed; on object stores the age is the
store's Last-Modified, so clocks may disagree by far less than that). On a store without
put-if-absent there is no lease and auto compaction does not run.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs

from deltaflow.table import _conditional_put, _uri
from deltaflow.table.errors import ConcurrentWriteError

STAGING_DIR = "_delta_staging"
_NAME = re.compile(r"^_compaction-(\d+)\.lease$")
# Compactions and commits under the lease are bounded (auto compaction's partitions and
# sizes); one older than this belongs to a process that died holding it.
STALE_SECONDS = 3600.0


def supported(table_uri: str) -> bool:
    return _conditional_put.supported(table_uri)


def try_acquire(table_uri: str) -> str | None:
    """The lease's file name if this call got it, None if another holder has it."""
    folder = _uri.join(table_uri, STAGING_DIR)
    fs, root = _uri.filesystem(folder)
    if _uri.is_local(table_uri):
        fs.create_dir(root, recursive=True)
    entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    held: list[tuple[int, str, int | None]] = []
    for entry in entries:
        match = _NAME.match(entry.base_name)
        if match:
            held.append((int(match.group(1)), entry.base_name, entry.mtime_ns))
    if held:
        number, name, mtime_ns = max(held)
        age = STALE_SECONDS if mtime_ns is None else time.time() - mtime_ns / 1e9
        if age < STALE_SECONDS:
            return None
        following = number + 1
    else:
        following = 0
    name = f"_compaction-{following}.lease"
    if not _conditional_put.put_if_absent(_uri.join(folder, name), uuid.uuid4().hex.encode()):
        return None
    for number, old, _ in held:  # older ones are released or stale: tidy them away
        if number < following:
            _delete(table_uri, old)
    return name


def release(table_uri: str, name: str) -> None:
    _delete(table_uri, name)


def _delete(table_uri: str, name: str) -> None:
    fs, path = _uri.filesystem(_uri.join(table_uri, f"{STAGING_DIR}/{name}"))
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


@contextlib.contextmanager
def holding(table_uri: str, wait_seconds: float) -> Iterator[bool]:
    """Hold the lease for the block, waiting up to ``wait_seconds`` for it; yields whether
    it is held (always True on a store without put-if-absent, where there is none)."""
    if not supported(table_uri):
        yield True
        return
    deadline = time.monotonic() + wait_seconds
    name = try_acquire(table_uri)
    while name is None and time.monotonic() < deadline:
        # A compaction holds it; they are short, so poll briefly.
        time.sleep(0.05)
        name = try_acquire(table_uri)
    try:
        yield name is not None
    finally:
        if name is not None:
            release(table_uri, name)


def busy(
    what: str, table_uri: str, read_version: int | None, waited: float
) -> ConcurrentWriteError:
    """The retryable error of a ``what`` (an operation) that waited ``waited`` seconds for
    the lease in vain: nothing was changed, running it again is safe."""
    return ConcurrentWriteError(
        f"{what} on {table_uri} waited {waited:.0f} s for a compaction of the table to"
        " finish, in vain. Nothing was changed; run it again.",
        table_uri=table_uri,
        kind="ConcurrentTransaction",
        read_version=read_version,
        attempts=1,
    )
