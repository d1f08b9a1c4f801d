"""The change data feed: which files hold the row changes of a range of versions.

Semantics follow delta-spark's ``CDCReader`` (and the protocol's "Change Data Files"):

- a commit with ``cdc`` actions changes exactly the rows of those files, which carry
  ``_change_type`` as a column (partition values come from the action);
- otherwise ``add`` actions with ``dataChange=true`` are ``insert`` rows and
  ``remove`` actions with ``dataChange=true`` are ``delete`` rows (the removed file
  is read again; its own deletion vector still applies);
- a path removed and re-added in one commit (deletion vectors) changes only the rows
  where the two DVs differ: rows in the new DV but not the old are deleted, rows in
  the old but not the new are re-inserted (RESTORE);
- a MERGE whose metrics say it inserted, updated and deleted nothing contributes no
  rows, and commits with ``dataChange=false`` only contribute nothing;
- a ``remove`` whose rows are read again must say its partition values: on a partitioned
  table one without them (written without ``extendedFileMetadata``) is refused with
  :class:`ChangeDataNotRecordedError`, where delta-spark raises
  ``DELTA_REMOVE_FILE_CDC_MISSING_EXTENDED_METADATA``, instead of emitting deletes with
  null partition columns. (delta-spark refuses such removes on any table; without
  partition columns nothing is missing, so they are read here.)

``_commit_timestamp`` is the in-commit timestamp when the commit has one, otherwise the
commit file's modification time, made strictly increasing across versions as delta-spark
does (``DeltaHistoryManager.monotonizeCommitTimestamps``).

Nothing here imports Spark: planning runs on the driver and hands the Spark layer a list
of :class:`ChangeFile`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow.fs as pafs

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _deletion_vectors, _uri
from deltaflow.table._log import PartitionParser, read_commit, relative_path
from deltaflow.table._snapshot import Snapshot, load_snapshot, parse_timestamp
from deltaflow.table.errors import (
    ChangeDataFilesMissingError,
    ChangeDataNotRecordedError,
    VersionNotFoundError,
)

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
CDF_PROPERTY = "delta.enableChangeDataFeed"

ChangeKind = Literal["cdc", "add", "remove"]
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class RowSelection:
    """Which rows of a data file a change reads.

    Every row except those of ``drop`` (a deletion vector descriptor); or, when ``keep``
    is set, only the rows of ``keep`` that are not in ``keep_minus``.
    """

    drop: dict[str, Any] | None = None
    keep: dict[str, Any] | None = None
    keep_minus: dict[str, Any] | None = None


_ALL_ROWS = RowSelection()


@dataclass(frozen=True)
class ChangeFile:
    """One file of change rows, at its place in the log."""

    version: int
    index: int  # line of the action in the commit file (a stream's position within a version)
    kind: ChangeKind
    path: str  # relative to the table root and percent-decoded, or an absolute URI
    size: int
    partition_values: dict[str, Any]  # logical column name -> typed value
    timestamp_ms: int
    selection: RowSelection = _ALL_ROWS

    @property
    def change_type(self) -> str | None:
        """The ``_change_type`` of every row, or None for cdc files (a column in the file)."""
        return {"add": "insert", "remove": "delete"}.get(self.kind)


@dataclass(frozen=True)
class CommitChanges:
    version: int
    changes: tuple[ChangeFile, ...]
    cdf_enabled: bool | None  # from a metaData action of the commit; None without one


def cdf_enabled(configuration: dict[str, Any] | None) -> bool:
    return str((configuration or {}).get(CDF_PROPERTY, "false")).strip().lower() == "true"


# ---------------------------------------------------------------- commit timestamps


class CommitTimestamps:
    """Commit timestamps as delta-spark reports them, from one listing of ``_delta_log``.

    A version right after a known one is found with one stat of its commit file, not a
    listing: its time is ``max(mtime, previous + 1)``, which is what the listing gives
    (by induction over the versions). A stream that follows a table's commits then pays
    one stat per commit, not a listing of the whole log (which grows without bound).
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._by_version: dict[int, int] = {}
        self._fs: tuple[pafs.FileSystem, str] | None = None

    def get(self, version: int) -> int | None:
        if version not in self._by_version and not self._stat_next(version):
            self.refresh()
        return self._by_version.get(version)

    def _stat_next(self, version: int) -> bool:
        previous = self._by_version.get(version - 1)
        if previous is None:
            return False
        if self._fs is None:
            self._fs = _uri.filesystem(self.uri)
        fs, root = self._fs
        info = fs.get_file_info(f"{root}/_delta_log/{version:020d}.json")
        if info.type == pafs.FileType.NotFound or info.mtime_ns is None:
            return False
        self._by_version[version] = max(info.mtime_ns // 1_000_000, previous + 1)
        return True

    def all(self) -> dict[int, int]:
        self.refresh()
        return dict(self._by_version)

    def refresh(self) -> None:
        fs, root = _uri.filesystem(self.uri)
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True))
        listed: list[tuple[int, int]] = []
        for info in infos:
            match = _COMMIT_FILE.match(info.base_name)
            if match and info.mtime_ns is not None:
                listed.append((int(match.group(1)), info.mtime_ns // 1_000_000))
        listed.sort()
        out: dict[int, int] = {}
        previous: int | None = None
        for version, ts in listed:
            if previous is not None and ts <= previous:
                ts = previous + 1
            out[version] = ts
            previous = ts
        self._by_version = out


def in_commit_timestamp(actions: Sequence[tuple[int, dict[str, Any]]]) -> int | None:
    for _, action in actions:
        info = action.get("commitInfo")
        if isinstance(info, dict) and info.get("inCommitTimestamp") is not None:
            return int(info["inCommitTimestamp"])
    return None


# ------------------------------------------------------------------- the log


def commit_changes(
    version: int,
    actions: Sequence[tuple[int, dict[str, Any]]],
    timestamp_ms: int,
    partitions: PartitionParser,
    *,
    table_uri: str,
    partition_columns: Sequence[str] = (),
) -> CommitChanges:
    """The change files of one commit (see the module docstring for the rules) of the
    table at ``table_uri``, partitioned by ``partition_columns`` (logical names)."""
    timestamp_ms = in_commit_timestamp(actions) or timestamp_ms
    enabled: bool | None = None
    commit_info: dict[str, Any] = {}
    cdc: list[ChangeFile] = []
    adds: dict[str, tuple[int, dict[str, Any]]] = {}
    removes: dict[str, tuple[int, dict[str, Any]]] = {}
    for index, action in actions:
        if "metaData" in action:
            enabled = cdf_enabled(action["metaData"].get("configuration"))
        elif "commitInfo" in action:
            commit_info = action["commitInfo"] or {}
        elif "cdc" in action:
            c = action["cdc"]
            cdc.append(
                ChangeFile(
                    version,
                    index,
                    "cdc",
                    relative_path(c["path"]),
                    int(c.get("size") or 0),
                    partitions.parse(c.get("partitionValues")),
                    timestamp_ms,
                )
            )
        elif "add" in action and action["add"].get("dataChange", True):
            adds[action["add"]["path"]] = (index, action["add"])
        elif "remove" in action and action["remove"].get("dataChange", True):
            removes[action["remove"]["path"]] = (index, action["remove"])
    if cdc:
        return CommitChanges(version, tuple(cdc), enabled)
    if _is_no_op_merge(commit_info):
        return CommitChanges(version, (), enabled)

    def change(
        kind: ChangeKind, entry: tuple[int, dict[str, Any]], sel: RowSelection
    ) -> ChangeFile:
        index, a = entry
        values = partitions.parse(a.get("partitionValues"))
        if kind == "remove" and not set(partition_columns) <= values.keys():
            raise _remove_without_partition_values(table_uri, version, a["path"])
        return ChangeFile(
            version,
            index,
            kind,
            relative_path(a["path"]),
            int(a.get("size") or 0),
            values,
            timestamp_ms,
            sel,
        )

    out: list[ChangeFile] = []
    for path, entry in removes.items():
        if path not in adds:
            out.append(change("remove", entry, RowSelection(drop=entry[1].get("deletionVector"))))
    for path, entry in adds.items():
        if path not in removes:
            out.append(change("add", entry, RowSelection(drop=entry[1].get("deletionVector"))))
            continue
        removed = removes[path]
        old_dv, new_dv = removed[1].get("deletionVector"), entry[1].get("deletionVector")
        if old_dv is None and new_dv is None:  # a plain rewrite in place: all out, all in
            out.append(change("remove", removed, _ALL_ROWS))
            out.append(change("add", entry, _ALL_ROWS))
            continue
        if new_dv is not None:  # rows newly marked deleted
            out.append(change("remove", removed, RowSelection(keep=new_dv, keep_minus=old_dv)))
        if old_dv is not None:  # rows no longer marked deleted (RESTORE)
            out.append(change("add", entry, RowSelection(keep=old_dv, keep_minus=new_dv)))
    out.sort(key=lambda f: (f.index, f.kind))
    return CommitChanges(version, tuple(out), enabled)


def _remove_without_partition_values(
    uri: str, version: int, path: str
) -> ChangeDataNotRecordedError:
    return ChangeDataNotRecordedError(
        f"The change data of version {version} of {uri} cannot be read: its remove of"
        f" {path} has no partition values (a writer without extendedFileMetadata), so the"
        " deleted rows' partition columns are unknown (delta-spark:"
        " DELTA_REMOVE_FILE_CDC_MISSING_EXTENDED_METADATA). Read the feed from a version"
        f" after {version} (startingVersion), or read the table itself.",
        table_uri=uri,
        version=version,
        start=version,
        end=version,
    )


def _is_no_op_merge(commit_info: dict[str, Any]) -> bool:
    # delta-spark's CDCReader.shouldSkipFileActionsInCommit: a MERGE that rewrote files
    # without changing any row reports zero for all three metrics.
    if commit_info.get("operation") != "MERGE":
        return False
    metrics = commit_info.get("operationMetrics") or {}
    names = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
    return all(str(metrics.get(name)) == "0" for name in names)


# --------------------------------------------------------------- version ranges


@dataclass(frozen=True)
class ChangeRange:
    """Versions ``start`` to ``end`` inclusive; empty when ``end < start``."""

    start: int
    end: int

    @property
    def is_empty(self) -> bool:
        return self.end < self.start


def resolve_range(
    snapshot: Snapshot,
    *,
    starting_version: int | None,
    starting_timestamp: str | None,
    ending_version: int | None,
    ending_timestamp: str | None,
    timestamps: CommitTimestamps | None = None,
) -> ChangeRange:
    """The versions a batch change feed read covers, checked as delta-spark does.

    ``snapshot`` is the table as the query sees it (latest, or ``versionAsOf``): an
    ending version past it is clamped to it; a starting version past it is an error.
    """
    uri, latest = snapshot.uri, snapshot.version
    timestamps = timestamps or CommitTimestamps(uri)
    start_ts = end_ts = None
    if starting_version is not None:
        start = starting_version
    elif starting_timestamp is not None:
        start_ts = _parse(uri, starting_timestamp, "startingTimestamp")
        start = _version_at_or_after(uri, timestamps, start_ts, latest)
    else:
        raise InvalidOptionError(
            f"No startingVersion or startingTimestamp provided for the change data feed read of"
            f" {uri}. Add .option('startingVersion', <version>) (0 for the whole history) or"
            " .option('startingTimestamp', '<timestamp>').",
            option="startingVersion",
        )
    if start > latest:
        raise VersionNotFoundError(
            f"The change data feed of {uri} cannot start at version {start}: the latest version"
            f" is {latest}. Use a startingVersion at or below {latest}.",
            table_uri=uri,
            version=start,
            latest=latest,
        )
    if ending_version is not None:
        end = ending_version
    elif ending_timestamp is not None:
        end_ts = _parse(uri, ending_timestamp, "endingTimestamp")
        end = _version_at_or_before(uri, timestamps, end_ts, latest)
    else:
        end = latest
    if start_ts is not None and end_ts is not None:
        if start_ts > end_ts:
            raise _end_before_start(uri, start, end)
        if end == start - 1:  # both timestamps fall between the same two commits
            return ChangeRange(start, end)
    if end < start:
        raise _end_before_start(uri, start, end)
    return ChangeRange(start, min(end, latest))


def _end_before_start(uri: str, start: int, end: int) -> InvalidOptionError:
    return InvalidOptionError(
        f"The change data feed range of {uri} from version {start} to version {end} is invalid:"
        " the end comes before the start. Swap the bounds or widen the range.",
        option="endingVersion",
    )


def _parse(uri: str, value: str, option: str) -> int:
    try:
        return int(parse_timestamp(value).timestamp() * 1000)
    except ValueError:
        raise InvalidOptionError(
            f"Option '{option}' of the change data feed read of {uri} is not a timestamp:"
            f" {value!r}. Use 'YYYY-MM-DD', 'YYYY-MM-DD HH:MM:SS' or ISO 8601 with an offset.",
            option=option,
        ) from None


def _fmt(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


def _timeline(uri: str, timestamps: CommitTimestamps, latest: int) -> list[tuple[int, int]]:
    listed = sorted((v, ts) for v, ts in timestamps.all().items() if v <= latest)
    if not listed:
        raise VersionNotFoundError(
            f"The log of {uri} has no commit files to resolve a timestamp against.", table_uri=uri
        )
    return listed


def _version_at_or_after(uri: str, timestamps: CommitTimestamps, wanted: int, latest: int) -> int:
    """delta-spark's ``getStartingVersionFromTimestamp``: the first commit at or after."""
    timeline = _timeline(uri, timestamps, latest)
    for version, ts in timeline:
        if ts >= wanted:
            return version
    last_version, last_ts = timeline[-1]
    raise VersionNotFoundError(
        f"The startingTimestamp {_fmt(wanted)} is after the latest commit of {uri} (version"
        f" {last_version}, committed at {_fmt(last_ts)}). Use a timestamp at or before"
        f" {_fmt(last_ts)}.",
        table_uri=uri,
        timestamp=_fmt(wanted),
        latest=last_version,
    )


def _version_at_or_before(uri: str, timestamps: CommitTimestamps, wanted: int, latest: int) -> int:
    """delta-spark's time travel by timestamp: the last commit at or before."""
    timeline = _timeline(uri, timestamps, latest)
    first_version, first_ts = timeline[0]
    last_version, last_ts = timeline[-1]
    if wanted < first_ts:
        raise VersionNotFoundError(
            f"The endingTimestamp {_fmt(wanted)} is before the earliest available commit of"
            f" {uri} (version {first_version}, committed at {_fmt(first_ts)}).",
            table_uri=uri,
            timestamp=_fmt(wanted),
            earliest=first_version,
        )
    if wanted > last_ts:
        raise VersionNotFoundError(
            f"The endingTimestamp {_fmt(wanted)} is after the latest commit of {uri} (version"
            f" {last_version}, committed at {_fmt(last_ts)}). Use a timestamp at or before"
            f" {_fmt(last_ts)}, or endingVersion={last_version}, or leave the end open.",
            table_uri=uri,
            timestamp=_fmt(wanted),
            latest=last_version,
        )
    return max(v for v, ts in timeline if ts <= wanted)


# -------------------------------------------------------------------- planning


def not_recorded(uri: str, version: int, start: int, end: int) -> ChangeDataNotRecordedError:
    return ChangeDataNotRecordedError(
        f"Error getting change data for range [{start}, {end}] of {uri} as change data was not"
        f" recorded for version [{version}]: delta.enableChangeDataFeed was not 'true' then."
        " Read a range that starts after the feed was enabled (the commit of"
        " DeltaTable.forPath(spark, path).setProperties({'delta.enableChangeDataFeed':"
        " 'true'}) marks that version), or read the table itself, without readChangeFeed.",
        table_uri=uri,
        version=version,
        start=start,
        end=end,
    )


def plan_changes(snapshot: Snapshot, span: ChangeRange) -> list[ChangeFile]:
    """Every change file of the versions in ``span``, in log order.

    Raises :class:`ChangeDataNotRecordedError` if the feed was off at the start or
    turned off inside the range, and :class:`VersionNotFoundError` if a commit file of
    the range was removed by log cleanup.
    """
    if span.is_empty:
        return []
    uri = snapshot.uri
    start_config = (
        snapshot.configuration
        if span.start == snapshot.version
        else load_snapshot(
            uri,
            version=span.start,
            storage_options=snapshot.storage_options,
            check_readable=False,
        ).configuration
    )
    if not cdf_enabled(start_config):
        raise not_recorded(uri, span.start, span.start, span.end)
    timestamps = CommitTimestamps(uri)
    partitions = PartitionParser(snapshot.schema)
    files: list[ChangeFile] = []
    for version in range(span.start, span.end + 1):
        actions = read_commit(uri, version)
        if actions is None:
            raise VersionNotFoundError(
                f"Commit {version} of {uri} is gone (log cleanup), so the change data feed from"
                f" version {span.start} to {span.end} cannot be read. Start after it.",
                table_uri=uri,
                version=version,
                latest=snapshot.version,
            )
        commit = commit_changes(
            version,
            actions,
            timestamps.get(version) or 0,
            partitions,
            table_uri=uri,
            partition_columns=snapshot.partition_columns,
        )
        if commit.cdf_enabled is False:
            raise not_recorded(uri, version, span.start, span.end)
        files.extend(commit.changes)
    return files


def file_uri(table_uri: str, path: str) -> str:
    return _uri.join(table_uri, path)


def check_files_exist(table_uri: str, files: Iterable[ChangeFile]) -> None:
    """Raise :class:`ChangeDataFilesMissingError` for the first file that is gone."""
    listed = list(files)
    if not listed:
        return
    fs, _ = _uri.filesystem(table_uri)
    paths = [_uri.filesystem(file_uri(table_uri, f.path))[1] for f in listed]
    for change, info in zip(listed, fs.get_file_info(paths), strict=True):
        if info.type == pafs.FileType.NotFound:
            raise files_missing(table_uri, change)


def files_missing(table_uri: str, change: ChangeFile) -> ChangeDataFilesMissingError:
    what = {"cdc": "change data", "add": "added", "remove": "removed"}[change.kind]
    return ChangeDataFilesMissingError(
        f"The change data feed of {table_uri} at version {change.version} needs the {what} file"
        f" {change.path}, which no longer exists: VACUUM removed it. Read a later range"
        " (startingVersion after the files' retention), or keep files longer with"
        " delta.deletedFileRetentionDuration.",
        table_uri=table_uri,
        version=change.version,
        path=change.path,
    )


def resolve_selection(
    table_uri: str, selection: RowSelection
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(rows to drop, rows to keep) as int64 arrays, reading the deletion vectors."""

    def rows(descriptor: dict[str, Any] | None) -> np.ndarray | None:
        if descriptor is None:
            return None
        dv = _deletion_vectors.DeletionVectorDescriptor.from_json(descriptor)
        return _deletion_vectors.read_deleted_rows(table_uri, dv).astype(np.int64)

    if selection.keep is not None:
        keep = rows(selection.keep)
        minus = rows(selection.keep_minus)
        assert keep is not None
        if minus is not None:
            keep = np.setdiff1d(keep, minus, assume_unique=True)
        return None, keep
    return rows(selection.drop), None
