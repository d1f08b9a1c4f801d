"""Atomic put-if-absent of a small file on a local/POSIX filesystem."""

from __future__ import annotations

import os
import time
import uuid

from deltaflow import _step_times


def put_if_absent(final: str, payload: bytes) -> bool:
    """Create ``final`` holding ``payload``, durably; False if it exists already.

    The bytes go to a temporary file in the same directory, are fsynced, and the file is
    hard-linked to ``final``: ``link`` fails when the name exists, so two writers racing
    for one name never overwrite each other and a reader never sees a partial file. After
    the link the directory is fsynced too, so the new name (the commit) survives a power
    loss, not only the bytes behind it.
    """
    folder, name = os.path.split(final)
    temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    started = time.perf_counter()
    with open(temp, "xb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    linked = time.perf_counter()
    _step_times.add("write+fsync", linked - started)
    try:
        os.link(temp, final)
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
        _step_times.add("link", time.perf_counter() - linked)
    synced = time.perf_counter()
    fsync_directory(folder or ".")
    _step_times.add("dir fsync", time.perf_counter() - synced)
    return True


def fsync_directory(folder: str) -> None:
    """fsync a directory, making the names created in it durable (POSIX)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
