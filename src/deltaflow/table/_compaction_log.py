"""Which commits since a version were compactions, and whether a conflict was lost to one.

A compaction (OPTIMIZE, auto compaction, REORG) commits adds and removes that all have
``dataChange=false``: it rearranges rows without changing them. Writers that lost a race
to one can often go on (a whole-table overwrite) or run again (a DML) where a loss to a
data change must fail, as in delta-spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from deltaflow.table import _log

# Conflicts a compaction can cause: it removes the files it rewrites.
_COMPACTION_CONFLICTS = ("ConcurrentDeleteRead", "ConcurrentDeleteDelete")


@dataclass(frozen=True)
class Compacted:
    """What compactions did since a version: the files they replaced (decoded paths), and
    whether every commit since then was one (no data changed)."""

    paths: frozenset[str]
    only_compactions: bool


def compacted_since(table_uri: str, read_version: int) -> Compacted:
    """The compactions (commits whose adds and removes all have ``dataChange=false``:
    OPTIMIZE, auto compaction, REORG) after ``read_version``."""
    paths: set[str] = set()
    only = True
    version = read_version + 1
    while (actions := _log.read_commit(table_uri, version)) is not None:
        files = [a.get("add") or a.get("remove") for _, a in actions]
        rearranged = any("remove" in a for _, a in actions) and not any(
            f.get("dataChange", True) for f in files if f is not None
        )
        changes = any(k in a for _, a in actions for k in ("metaData", "protocol", "cdc"))
        if rearranged and not changes:
            paths.update(unquote(a["remove"]["path"]) for _, a in actions if "remove" in a)
        else:
            only = False
        version += 1
    return Compacted(frozenset(paths), only)


def lost_to_compaction(table_uri: str, kind: str, read_version: int | None) -> bool:
    """Whether a transaction that read ``read_version`` and failed with conflict ``kind``
    lost to compactions only: files were removed since then by compactions alone.
    Re-running such a transaction on the new version gives the result it would have had."""
    if kind not in _COMPACTION_CONFLICTS or read_version is None:
        return False
    version = read_version + 1
    while (actions := _log.read_commit(table_uri, version)) is not None:
        removes = [a["remove"] for _, a in actions if "remove" in a]
        if any(r.get("dataChange", True) for r in removes):
            return False
        version += 1
    return bool(compacted_since(table_uri, read_version).paths)
