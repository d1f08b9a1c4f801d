"""The deletion vector files a table still references, for VACUUM.

delta-rs 1.6.6 does not expose the ``deletionVector`` of ``add`` or ``remove`` actions (and
its full VACUUM takes live deletion vector files for orphans), so deltaflow replays the
log itself: the newest checkpoint at or before the version, then every JSON commit up to
it, each action keyed by (path, deletion vector id) as the protocol reconciles them. A
file is referenced when the version's live files use it or a tombstone of that version
removed at or after the retention's cutoff carries it (a reader of a version inside the
retention may still need it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

from deltaflow.table import _log_commit, _uri
from deltaflow.table._deletion_vectors import DeletionVectorDescriptor

_DV_FILE = re.compile(r"deletion_vector_[0-9a-fA-F-]{36}\.bin$")


def is_dv_file(path: str) -> bool:
    """Whether ``path`` names a deletion vector file (by the name writers give them)."""
    return bool(_DV_FILE.search(path.rsplit("/", 1)[-1]))


class DvFiles:
    """The deletion vector files the log references inside the retention, read from the
    log once, when first asked (a VACUUM plan with no deletion vector file never reads)."""

    def __init__(self, table_uri: str, removed_since_ms: int) -> None:
        self._uri = table_uri
        self._since = removed_since_ms
        self._files: set[str] | None = None

    def referenced(self, file_uri: str) -> bool:
        if self._files is None:
            self._files = referenced_files(self._uri, self._since)
        return file_key(file_uri) in self._files


def referenced_files(table_uri: str, removed_since_ms: int) -> set[str]:
    """URIs (unquoted) of the deletion vector files the newest version's live files, or
    its tombstones with a ``deletionTimestamp`` at or after ``removed_since_ms``,
    reference. The newest version when called (not a snapshot's read earlier): a commit
    since may reference more."""
    log_dir = _log_commit.log_location(table_uri, "VACUUM")
    version = _log_commit.latest_version(log_dir)
    live: dict[tuple[str, str], Mapping[str, Any]] = {}
    removed: dict[tuple[str, str], Mapping[str, Any]] = {}
    checkpoint = _log_commit.newest_checkpoint(log_dir, version)
    start = 0
    if checkpoint is not None:
        start = checkpoint[0] + 1
        _replay(_checkpoint_actions(checkpoint[1]), live, removed)
    for v in range(start, version + 1):
        _replay(_log_commit.read_actions(log_dir, v), live, removed)
    kept = list(live.values()) + [
        r for r in removed.values() if int(r.get("deletionTimestamp") or 0) >= removed_since_ms
    ]
    out = set()
    for action in kept:
        descriptor = DeletionVectorDescriptor.from_json(dict(action["deletionVector"]))
        if not descriptor.is_inline:
            out.add(file_key(descriptor.absolute_path(table_uri)))
    return out


def file_key(uri: str) -> str:
    """One spelling of a file's URI, to compare delta-rs's paths with the log's."""
    return unquote(_uri.normalize_uri(uri))


def _replay(
    actions: Iterable[Mapping[str, Any]],
    live: dict[tuple[str, str], Mapping[str, Any]],
    removed: dict[tuple[str, str], Mapping[str, Any]],
) -> None:
    """Apply one commit's (or a checkpoint's) adds and removes; only those carrying a
    deletion vector matter here."""
    for action in actions:
        for kind in ("add", "remove"):
            entry = action.get(kind)
            if not entry or not entry.get("deletionVector"):
                continue
            dv = DeletionVectorDescriptor.from_json(dict(entry["deletionVector"]))
            key = (unquote(entry["path"]), dv.unique_id)
            if kind == "add":
                live[key] = entry
                removed.pop(key, None)
            else:
                live.pop(key, None)
                removed[key] = entry


def _checkpoint_actions(files: list[str]) -> Iterable[Mapping[str, Any]]:
    """The add and remove actions of a (possibly multi-part or v2) checkpoint."""
    for path in _log_commit.checkpoint_parts(files):
        table = _log_commit.read_parquet(path)
        for kind in ("add", "remove"):
            if kind not in table.column_names:
                continue
            for entry in table.column(kind).to_pylist():
                if entry:
                    yield {kind: entry}
