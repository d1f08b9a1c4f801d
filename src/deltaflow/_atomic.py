"""Atomic put-if-absent of a small file on a local/POSIX filesystem."""

from __future__ import annotations

import os
import uuid


def put_if_absent(final: str, payload: bytes) -> bool:
    """Create ``final`` holding ``payload``, durably; False if it exists already.

    The bytes go to a temporary file in the same directory, are fsynced, and the file is
    hard-linked to ``final``: ``link`` fails when the name exists, so two writers racing
    for one name never overwrite each other and a reader never sees a partial file.
    """
    folder, name = os.path.split(final)
    temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    with open(temp, "xb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(temp, final)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
