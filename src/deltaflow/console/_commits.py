"""A table's commits, summarised one line each and read incrementally.

The console shows every version's operation, rows and files; reading 10,000 commit files
on every request would take seconds. A :class:`CommitLog` reads each commit file once,
keeps a small summary of it, and on later calls only reads the versions written since
(found by probing for the next file: one ``open`` when nothing changed). Older history
is read backwards, a page at a time, when someone scrolls to it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import orjson

# operationMetrics names differ between delta-spark (numOutputRows) and delta-rs
# (num_added_rows): they are compared with case and underscores removed.
_ROWS_ADDED = ("numoutputrows", "numtargetrowsinserted", "numaddedrows")
_ROWS_REMOVED = ("numdeletedrows", "numtargetrowsdeleted", "numremovedrows")
_ROWS_UPDATED = ("numupdatedrows", "numtargetrowsupdated")


@dataclass(frozen=True)
class Commit:
    """What one version did, as the history timeline shows it."""

    version: int
    timestamp: int  # ms since the epoch (commitInfo, else the file's modification time)
    operation: str
    parameters: dict[str, Any]
    metrics: dict[str, Any]
    files_added: int
    files_removed: int
    bytes_added: int
    bytes_removed: int
    rows_added: int | None
    rows_removed: int | None
    rows_updated: int | None
    data_change: bool
    transactions: tuple[tuple[str, int], ...]  # (appId, version) of streaming sinks
    engine: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "timestamp": self.timestamp,
            "operation": self.operation,
            "parameters": self.parameters,
            "metrics": self.metrics,
            "files_added": self.files_added,
            "files_removed": self.files_removed,
            "bytes_added": self.bytes_added,
            "bytes_removed": self.bytes_removed,
            "rows_added": self.rows_added,
            "rows_removed": self.rows_removed,
            "rows_updated": self.rows_updated,
            "data_change": self.data_change,
            "transactions": [{"app_id": a, "version": v} for a, v in self.transactions],
            "engine": self.engine,
        }


def summarise(version: int, text: bytes, mtime_ms: int) -> Commit:
    """The summary of one commit file's actions."""
    info: dict[str, Any] = {}
    files_added = files_removed = bytes_added = bytes_removed = 0
    stats_rows = 0
    stats_complete = True
    data_change = False
    transactions: list[tuple[str, int]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        action = orjson.loads(line)
        if "add" in action:
            add = action["add"]
            files_added += 1
            bytes_added += int(add.get("size") or 0)
            data_change = data_change or bool(add.get("dataChange", True))
            rows = _num_records(add.get("stats"))
            if rows is None:
                stats_complete = False
            else:
                stats_rows += rows
        elif "remove" in action:
            remove = action["remove"]
            files_removed += 1
            bytes_removed += int(remove.get("size") or 0)
            data_change = data_change or bool(remove.get("dataChange", True))
        elif "commitInfo" in action:
            info = action["commitInfo"] or {}
        elif "txn" in action:
            txn = action["txn"]
            transactions.append((str(txn.get("appId")), int(txn.get("version", -1))))
    metrics = {str(k): _number(v) for k, v in (info.get("operationMetrics") or {}).items()}
    folded = {k.lower().replace("_", ""): v for k, v in metrics.items()}
    rows_added = _first(folded, _ROWS_ADDED)
    if rows_added is None and not metrics and files_added and stats_complete:
        # No metrics (an older writer): the added files' row counts are the best guess.
        rows_added = stats_rows
    timestamp = info.get("inCommitTimestamp") or info.get("timestamp") or mtime_ms
    parameters = info.get("operationParameters") or {}
    return Commit(
        version=version,
        timestamp=int(timestamp),
        operation=str(info.get("operation") or "UNKNOWN"),
        parameters={str(k): v for k, v in parameters.items()},
        metrics=metrics,
        files_added=files_added,
        files_removed=files_removed,
        bytes_added=bytes_added,
        bytes_removed=bytes_removed,
        rows_added=rows_added,
        rows_removed=_first(folded, _ROWS_REMOVED),
        rows_updated=_first(folded, _ROWS_UPDATED),
        data_change=data_change,
        transactions=tuple(transactions),
        engine=info.get("engineInfo") or info.get("clientVersion"),
    )


def _num_records(stats: Any) -> int | None:
    if not stats:
        return None
    try:
        value = orjson.loads(stats).get("numRecords")
    except orjson.JSONDecodeError:
        return None
    return int(value) if isinstance(value, int) else None


def _number(value: Any) -> Any:
    """delta-spark writes metrics as strings ("12"); the page wants numbers."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def _first(metrics: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = metrics.get(name)
        if isinstance(value, int):
            return value
    return None


class CommitLog:
    """The commits of one local table, each read once, on demand.

    Only the commits a caller asks for are read: the newest ones for the table list and
    the streams page, a window of versions for a history page. A version whose file is
    gone (log cleanup) is skipped.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.log_dir = os.path.join(path, "_delta_log")
        self._commits: dict[int, Commit] = {}
        self._latest = -1
        self._floor = 0  # the oldest version with a commit file when the log was listed
        self._lock = threading.Lock()

    def latest_version(self) -> int:
        """Bring the log up to date and return its newest version (-1 for no commit)."""
        with self._lock:
            self._refresh()
            return self._latest

    def since(self, version: int, limit: int) -> list[Commit]:
        """The newest ``limit`` commits after ``version``, newest first."""
        with self._lock:
            self._refresh()
            return self._collect(self._latest, max(version + 1, self._floor), limit)

    def page(self, before: int | None, limit: int) -> list[Commit]:
        """Up to ``limit`` commits below ``before`` (the newest when None), newest first."""
        with self._lock:
            self._refresh()
            top = self._latest if before is None else min(before - 1, self._latest)
            return self._collect(top, self._floor, limit)

    def commit(self, version: int) -> Commit | None:
        """The summary of one version (read now if not yet), None if it has no file."""
        with self._lock:
            commit = self._commits.get(version)
            if commit is None and version >= 0:
                commit = self._read(version)
                if commit is not None:
                    self._commits[version] = commit
            return commit

    def _collect(self, top: int, bottom: int, limit: int) -> list[Commit]:
        out: list[Commit] = []
        version = top
        while version >= bottom and len(out) < limit:
            commit = self._commits.get(version)
            if commit is None:
                commit = self._read(version)
                if commit is None:  # removed by log cleanup: nothing older is left either
                    self._floor = version + 1
                    break
                self._commits[version] = commit
            out.append(commit)
            version -= 1
        return out

    def _refresh(self) -> None:
        if self._latest >= 0 and not os.path.exists(self._file(self._latest)):
            # The table was deleted and created again: start over.
            self._commits.clear()
            self._latest = -1
        if self._latest < 0:
            versions = self._listed_versions()
            if not versions:
                return
            self._floor, self._latest = versions[0], versions[-1]
        # Probe for the next commit file: one failed open when nothing was committed.
        while True:
            commit = self._read(self._latest + 1)
            if commit is None:
                return
            self._latest = commit.version
            self._commits[commit.version] = commit

    def _listed_versions(self) -> list[int]:
        try:
            names = os.listdir(self.log_dir)
        except FileNotFoundError:
            return []
        return sorted(
            int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()
        )

    def file(self, version: int) -> str:
        """The path of commit ``version``'s file."""
        return self._file(version)

    def _file(self, version: int) -> str:
        return os.path.join(self.log_dir, f"{version:020d}.json")

    def _read(self, version: int) -> Commit | None:
        path = self._file(version)
        try:
            with open(path, "rb") as handle:
                text = handle.read()
                mtime = os.fstat(handle.fileno()).st_mtime
        except FileNotFoundError:
            return None
        return summarise(version, text, int(mtime * 1000))
