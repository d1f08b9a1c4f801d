"""How a commit's conflicts with concurrent writers are named and handled.

delta-rs reports a lost commit race only in its message: :func:`conflict_kind` maps it to
delta-spark's kind (``ConcurrentAppend``, ``ConcurrentDeleteRead``, ...) and
:func:`conflict_error` makes it a typed :class:`ConcurrentWriteError`. A commit that
removes files also checks the compactions committed since the version it read
(:func:`past_compactions`), which delta-rs misses; :func:`busy_error` is its answer when a
running compaction holds the table's lease too long. Used by :mod:`._commit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote

from deltalake import DeltaTable

from deltaflow.table import _compaction_lease, _compaction_log
from deltaflow.table.errors import ConcurrentWriteError

if TYPE_CHECKING:
    from deltaflow.table._commit import CommitRequest


# delta-rs retries a commit whose version was taken after re-checking conflicts;
# 15 attempts cover bursts of concurrent appenders without hiding a livelock.
MAX_COMMIT_RETRIES = 15


_CONFLICT_KINDS = (
    "ConcurrentAppend",
    "ConcurrentDeleteRead",
    "ConcurrentDeleteDelete",
    "MetadataChanged",
    "ConcurrentTransaction",
    "ProtocolChanged",
)
# delta-rs names the conflict only in its message; these phrases map it to delta-spark's kind.
_CONFLICT_PHRASES = (
    ("added new data", "ConcurrentAppend"),
    ("deleted data this operation read", "ConcurrentDeleteRead"),
    ("deleted the same data", "ConcurrentDeleteDelete"),
    ("metadata changed", "MetadataChanged"),
    ("protocol changed", "ProtocolChanged"),
    ("concurrent transaction failed", "ConcurrentTransaction"),
)


# How long a commit that removes files waits for a running compaction to finish.
LEASE_WAIT_SECONDS = 120.0


def past_compactions(request: CommitRequest, table: DeltaTable, location: str) -> DeltaTable:
    """The table to commit ``request`` on, given the compactions since its read version.

    A whole-table overwrite that lost only to compactions commits on the newest version
    (it replaces every row either way); removes of files a compaction replaced are a
    ``ConcurrentDeleteRead`` (a DML is re-run then, spark/dml/_retry.py)."""
    if request.read_version is None:
        return table
    replaced = _compaction_log.compacted_since(request.table_uri, request.read_version)
    if not replaced.paths:
        return table
    if request.mode == "overwrite" and not request.removes and replaced.only_compactions:
        return DeltaTable(location, storage_options=request.storage_options)
    lost = sorted({unquote(r.path) for r in request.removes} & replaced.paths)
    if lost or request.mode == "overwrite":
        raise ConcurrentWriteError(
            f"Commit to {request.table_uri} read files that a compaction since version"
            f" {request.read_version} replaced (e.g. {(lost or sorted(replaced.paths))[0]})."
            " Nothing was committed; retry the operation on the current version of the table.",
            table_uri=request.table_uri,
            kind="ConcurrentDeleteRead",
            read_version=request.read_version,
            attempts=1,
        )
    return table


def busy_error(request: CommitRequest) -> ConcurrentWriteError:
    return _compaction_lease.busy(
        "Commit", request.table_uri, request.read_version, LEASE_WAIT_SECONDS
    )


# A blind append that delta-rs fails for a concurrent delete is retried on the newest
# version this many times (each attempt itself retries MAX_COMMIT_RETRIES times).
MAX_APPEND_REBASES = 10


def conflict_error(request: CommitRequest, kind: str, exc: Exception) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"Commit to {request.table_uri} conflicted with a concurrent writer ({kind}): {exc}."
        " Nothing was committed; retry the operation on the current version of the table.",
        table_uri=request.table_uri,
        kind=kind,
        read_version=request.read_version,
        attempts=MAX_COMMIT_RETRIES,
    )


def conflict_kind(message: str) -> str:
    """delta-spark's name for the conflict a delta-rs commit failure describes."""
    lowered = message.lower()
    for phrase, kind in _CONFLICT_PHRASES:
        if phrase in lowered:
            return kind
    return next((k for k in _CONFLICT_KINDS if k.lower() in lowered), "Conflict")
