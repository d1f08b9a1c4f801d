"""Leases that keep auto compaction off a table while a DML runs on it.

A DELETE / UPDATE / MERGE reads files, works for seconds to minutes, then commits removes
of what it read. An auto compaction that replaces those files meanwhile makes the DML
lose (it is re-run then, ``spark/dml/_retry.py``); one after each write of a busy stream
could make it lose every time. So a DML holds a lease, a small file
``<table>/_delta_staging/_dml-<id>.lease``, for as long as it runs, and auto compaction
of the table waits while a live lease exists (the next write asks again). Any process on
any store sees it: a file listing is the only shared state writers have besides the log.

A lease older than :data:`LEASE_SECONDS` counts as left behind by a crashed DML and is
ignored (VACUUM deletes it with other stale staging entries); a DML that runs longer may
still lose to a compaction, and is re-run.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs

from deltaflow.table import _uri

log = logging.getLogger(__name__)

STAGING_DIR = "_delta_staging"  # the same directory staged writes use (spark/write/_native)
_PREFIX = "_dml-"
_SUFFIX = ".lease"
LEASE_SECONDS = 3600.0


@contextlib.contextmanager
def holding(table_uri: str) -> Iterator[str | None]:
    """Hold a lease on ``table_uri`` for the block; yields its name (None if it could not
    be written, e.g. a read-only store: the DML then just runs without one)."""
    name = _write_lease(table_uri)
    try:
        yield name
    finally:
        release(table_uri, name)


def _write_lease(table_uri: str) -> str | None:
    name = f"{_PREFIX}{uuid.uuid4().hex}{_SUFFIX}"
    fs, root = _uri.filesystem(_uri.join(table_uri, STAGING_DIR))
    try:
        log_dir = _uri.filesystem(_uri.join(table_uri, "_delta_log"))[1]
        if fs.get_file_info(log_dir).type != pafs.FileType.Directory:
            return None  # no table there (the DML will say so): leave the location alone
        fs.create_dir(root, recursive=True)
        with fs.open_output_stream(f"{root.rstrip('/')}/{name}") as out:
            out.write(b"")
    except OSError:
        log.warning("could not write a DML lease under %s; running without one", table_uri)
        return None
    return name


def release(table_uri: str, name: str | None) -> None:
    """Delete lease ``name`` (idempotent)."""
    if name is None:
        return
    fs, root = _uri.filesystem(_uri.join(table_uri, STAGING_DIR))
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_file(f"{root.rstrip('/')}/{name}")


def live_leases(table_uri: str) -> list[str]:
    """The names of the table's leases younger than :data:`LEASE_SECONDS`."""
    fs, root = _uri.filesystem(_uri.join(table_uri, STAGING_DIR))
    cutoff_ns = time.time_ns() - int(LEASE_SECONDS * 1e9)
    try:
        entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=False))
    except OSError:
        return []
    return [
        e.base_name
        for e in entries
        if e.base_name.startswith(_PREFIX)
        and e.base_name.endswith(_SUFFIX)
        and (e.mtime_ns or 0) >= cutoff_ns
    ]
