"""One compaction at a time per table, and none inside another writer's pinned commit.

delta-rs 1.6 does not count a winning commit's ``dataChange=false`` removes as a
conflict: two OPTIMIZE runs that read the same small files both commit (every row then
appears twice), and an overwrite that read files a compaction has just replaced commits
its removes of files already gone, keeping the compacted copy of the rows it meant to
replace. Measured here with deltalake 1.6.6 on a local table.

So on local tables every delta-rs compaction (auto compaction, OPTIMIZE, REORG) and every
delta-rs commit that removes files it read holds this lease: ``<table>/_delta_staging/
_compaction-<n>.lease``, created with put-if-absent. A holder of ``n`` is alone: the next
one must create ``n + 1``, which only one process can, and only once ``n`` is released or
older than :data:`STALE_SECONDS` (a holder that crashed). Object stores have no
put-if-absent deltaflow can use, so there auto compaction does not run at all.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Iterator

from deltaflow._atomic import put_if_absent
from deltaflow.table import _uri
from deltaflow.table.errors import ConcurrentWriteError

STAGING_DIR = "_delta_staging"
_NAME = re.compile(r"^_compaction-(\d+)\.lease$")
# Compactions and commits under the lease are bounded (auto compaction's partitions and
# sizes); one older than this belongs to a process that died holding it.
STALE_SECONDS = 3600.0


def supported(table_uri: str) -> bool:
    return _uri.is_local(table_uri)


def try_acquire(table_uri: str) -> str | None:
    """The lease's file name if this call got it, None if another holder has it."""
    folder = os.path.join(_uri.local_path(table_uri), STAGING_DIR)
    os.makedirs(folder, exist_ok=True)
    held: list[tuple[int, str]] = []
    for name in os.listdir(folder):
        match = _NAME.match(name)
        if match:
            held.append((int(match.group(1)), name))
    if held:
        number, name = max(held)
        try:
            age = time.time() - os.stat(os.path.join(folder, name)).st_mtime
        except FileNotFoundError:  # released meanwhile: its number is free again
            age = STALE_SECONDS
            number -= 1
        if age < STALE_SECONDS:
            return None
        following = number + 1
    else:
        following = 0
    name = f"_compaction-{following}.lease"
    if not put_if_absent(os.path.join(folder, name), uuid.uuid4().hex.encode()):
        return None
    for number, old in held:  # older ones are released or stale: tidy them away
        if number < following:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, old))
    return name


def release(table_uri: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(_uri.local_path(table_uri), STAGING_DIR, name))


@contextlib.contextmanager
def holding(table_uri: str, wait_seconds: float) -> Iterator[bool]:
    """Hold the lease for the block, waiting up to ``wait_seconds`` for it; yields whether
    it is held (always True on object stores, where there is none to take)."""
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
