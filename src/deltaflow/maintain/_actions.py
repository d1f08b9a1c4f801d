"""What ``deltaflow maintain`` does to one table: a cheap check per action, then the run.

Each action reads only what it needs to decide (the snapshot's file list, the
``_delta_log`` listing, the add actions only for clustered and deletion-vector tables)
and answers a :class:`Decision`; the run reuses the code the SQL statements and auto
compaction use, so leases, conflict checks and VACUUM's rules are theirs:

* ``OPTIMIZE`` - bin-packing of the partitions holding at least ``min_small_files``
  files under half the target size (auto compaction's job, lease and commit); on a
  clustered table, incremental clustering of the files not clustered yet.
* ``REORG PURGE`` - files whose deletion vectors hide more than ``purge_ratio`` of their
  rows (delta-spark's ``optimize.maxDeletedRowsRatio``) rewritten without them.
* ``VACUUM`` - with the table's ``delta.deletedFileRetentionDuration`` (7 days unless
  the table says otherwise), only when a dry run finds something to delete.
* ``CHECKPOINT`` - when ``delta.checkpointInterval`` versions or more were committed
  since the newest checkpoint (writers outside deltaflow checkpoint less often).
* ``LOG CLEANUP`` - log entries older than ``delta.logRetentionDuration`` (and before a
  checkpoint) deleted, unless ``delta.enableExpiredLogCleanup`` is false.

Every commit carries ``auto: true`` in ``operationParameters`` and the reason under
``deltaflow.maintain`` in its commitInfo.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from deltaflow.table import _auto_compact, _log_upkeep, _partitions, _reader_leases
from deltaflow.table._snapshot import Snapshot, load_snapshot

MARKER_KEY = "deltaflow.maintain"
DEFAULT_MIN_SMALL_FILES = _auto_compact.DEFAULT_MIN_NUM_FILES  # delta-spark's minNumFiles
DEFAULT_PURGE_RATIO = 0.05  # delta-spark's spark.databricks.delta.optimize.maxDeletedRowsRatio
DEFAULT_LOG_RETENTION_HOURS = 30 * 24.0  # delta.logRetentionDuration default


@dataclass(frozen=True)
class MaintainOptions:
    """How ``deltaflow maintain`` decides; the tables' own properties come on top."""

    dry_run: bool = False
    min_small_files: int = DEFAULT_MIN_SMALL_FILES
    purge_ratio: float = DEFAULT_PURGE_RATIO
    # A VACUUM dry run lists the whole table: in loop mode, once per table this often.
    vacuum_check_seconds: float = 3600.0


@dataclass(frozen=True)
class Decision:
    run: bool
    why: str
    # What the run needs from the check (e.g. the compaction job).
    plan: Any = None


@dataclass
class TableState:
    """One table during one pass: the snapshot, reloaded after each commit."""

    uri: str
    options: MaintainOptions
    check_vacuum: bool = True
    _snapshot: Snapshot | None = field(default=None, repr=False)

    @property
    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = load_snapshot(self.uri)
        return self._snapshot

    def changed(self) -> None:
        self._snapshot = None


def marker(why: str) -> dict[str, Any]:
    """The commitInfo that marks a maintenance commit."""
    return {"operationParameters": {"auto": True}, MARKER_KEY: why}


# ---- OPTIMIZE ------------------------------------------------------------------------


def check_optimize(state: TableState) -> Decision:
    from deltaflow.table import _clustering
    from deltaflow.table._protocol import Protocol

    snapshot = state.snapshot
    setting = _log_upkeep.table_property(snapshot.configuration, _auto_compact.TABLE_PROPERTY)
    if (setting or "").strip().lower() == "false":
        return Decision(False, f"{_auto_compact.TABLE_PROPERTY}=false")
    if _clustering.is_clustered(snapshot.writer_features):
        return _check_clustering(state)
    unwritable = Protocol.of(snapshot).delta_rs_unwritable
    if unwritable:
        return Decision(
            False, f"the table uses {', '.join(sorted(unwritable))}, which OPTIMIZE cannot compact"
        )
    target = _target_size(snapshot.configuration)
    settings = _auto_compact.AutoCompactSettings(
        enabled=True, min_num_files=state.options.min_small_files, max_file_size=target
    )
    table = snapshot.delta_table
    job = _auto_compact.CompactionJob(
        snapshot.uri,
        tuple(snapshot.partition_columns),
        frozenset(_small_file_partitions(table, snapshot.partition_columns, target // 2)),
        settings,
    )
    counts = _auto_compact.small_files_per_partition(table, job) if job.partitions else {}
    eligible = _auto_compact.eligible_partitions(table, job) if counts else []
    most = max(counts.values(), default=0)
    if not eligible:
        return Decision(
            False,
            f"no partition holds {settings.min_num_files} files under {target // 2} bytes"
            f" (most: {most})",
        )
    why = (
        f"{len(eligible)} partition(s) hold {settings.min_num_files}+ files under"
        f" {target // 2} bytes (most: {most})"
    )
    return Decision(True, why, replace(job, partitions=frozenset(eligible)))


def _check_clustering(state: TableState) -> Decision:
    from deltaflow.table import _cluster_optimize

    snapshot = state.snapshot
    pending = _cluster_optimize.pending_files(snapshot)
    size = sum(f.size for f in pending)
    target = _cluster_optimize.target_file_size(snapshot.configuration)
    if len(pending) >= state.options.min_small_files or (pending and size >= target):
        return Decision(True, f"clustered table: {len(pending)} files ({size} bytes) unclustered")
    return Decision(
        False,
        f"clustered table: {len(pending)} files ({size} bytes) unclustered, under"
        f" {state.options.min_small_files} files and {target} bytes",
    )


def run_optimize(state: TableState, decision: Decision) -> str:
    from deltaflow.table import _cluster_optimize

    if decision.plan is None:  # a clustered table
        result = _cluster_optimize.cluster(
            load_snapshot(state.uri), commit_info=marker(decision.why)
        )
        if result.version is None:
            raise Skip("nothing left to cluster")
        state.changed()
        return (
            f"version {result.version}: {len(result.files_removed)} files clustered into"
            f" {len(result.files_added)}"
        )
    job = replace(decision.plan, commit_info=marker(decision.why))
    outcome = _auto_compact.run(job)
    if outcome.errors:
        raise ActionFailed("; ".join(outcome.errors))
    if outcome.version is None:  # e.g. a writer or a DML holds the table: the next pass
        raise Skip(outcome.skipped or "no small files left")
    state.changed()
    return (
        f"version {outcome.version}: {outcome.files_removed} files -> {outcome.files_added}"
        f" in {outcome.partitions} partition(s)"
    )


class ActionFailed(Exception):
    """An action that reported failure without raising."""


class Skip(Exception):
    """An action that found, once it ran, nothing it could do now (not a failure)."""


def _small_file_partitions(
    table: Any, columns: tuple[str, ...], small: int
) -> set[tuple[Any, ...]]:
    """The serialized partition values of the live files under ``small`` bytes."""
    actions = table.get_add_actions(flatten=True)
    sizes = actions.column("size_bytes").to_pylist()
    if not columns:
        return {()} if any(s < small for s in sizes) else set()
    values = [
        actions.column(f"partition.{c}").to_pylist()
        if f"partition.{c}" in actions.column_names
        else [None] * len(sizes)
        for c in columns
    ]
    return {
        tuple(_partitions.serialize_partition_value(col[row]) for col in values)
        for row, size in enumerate(sizes)
        if size < small
    }


def _target_size(configuration: Mapping[str, str | None]) -> int:
    from deltaflow.table import _cluster_optimize

    target = _log_upkeep.table_property(configuration, "delta.targetFileSize")
    if target:
        return _cluster_optimize.target_file_size({"delta.targetFileSize": target})
    return _auto_compact.DEFAULT_MAX_FILE_SIZE


# ---- REORG PURGE -----------------------------------------------------------------------


def check_purge(state: TableState) -> Decision:
    import json

    from deltaflow.table import _log_commit

    snapshot = state.snapshot
    if not snapshot.has_deletion_vectors_enabled:
        return Decision(False, "the table has no deletion vectors")
    entries = snapshot.files(stats=False)
    adds = _log_commit.add_actions_of(snapshot.uri, snapshot.version, [e.path for e in entries])
    with_dv = over = 0
    for add in adds.values():
        vector = add.get("deletionVector")
        if not vector:
            continue
        with_dv += 1
        try:
            records = int(json.loads(add.get("stats") or "{}").get("numRecords") or 0)
        except (ValueError, TypeError):
            records = 0
        deleted = int(vector.get("cardinality") or 0)
        if records and deleted / records > state.options.purge_ratio:
            over += 1
    if not over:
        return Decision(
            False,
            f"{with_dv} files have deletion vectors, none hides more than"
            f" {state.options.purge_ratio:.0%} of its rows",
        )
    return Decision(
        True,
        f"{over} files' deletion vectors hide more than {state.options.purge_ratio:.0%} of"
        " their rows",
    )


def run_purge(state: TableState, decision: Decision) -> str:
    from deltaflow.spark.commands._reorg import reorg_purge

    row = reorg_purge(state.uri, commit_info=marker(decision.why))
    metrics = row[0][1]
    state.changed()
    return f"{metrics[1]} files rewritten without their deleted rows into {metrics[0]}"


# ---- CHECKPOINT and LOG CLEANUP ------------------------------------------------------

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.[^.]+)*\.(?:parquet|json)$")


@dataclass(frozen=True)
class LogListing:
    commits: dict[int, float]  # version -> modification time (epoch seconds)
    checkpoints: dict[int, float]

    @classmethod
    def of(cls, uri: str) -> LogListing:
        commits: dict[int, float] = {}
        checkpoints: dict[int, float] = {}
        for name, modified in _log_entries(uri):
            for pattern, into in ((_COMMIT, commits), (_CHECKPOINT, checkpoints)):
                match = pattern.match(name)
                if match:
                    version = int(match.group(1))
                    into[version] = max(into.get(version, 0.0), modified)
        return cls(commits, checkpoints)


def _log_entries(uri: str) -> list[tuple[str, float]]:
    """(name, modification time in epoch seconds) of each file in the table's log."""
    from deltaflow.table import _uri

    if _uri.is_local(uri) or "://" not in uri:
        folder = os.path.join(_uri.local_path(_uri.normalize_uri(uri)), "_delta_log")
        with os.scandir(folder) as entries:
            return [(entry.name, entry.stat().st_mtime) for entry in entries]
    import pyarrow.fs as pafs

    fs, path = _uri.filesystem(_uri.join(uri, "_delta_log"))
    return [
        (info.base_name, info.mtime.timestamp() if info.mtime is not None else 0.0)
        for info in fs.get_file_info(pafs.FileSelector(path))
        if info.type == pafs.FileType.File
    ]


def check_checkpoint(state: TableState) -> Decision:
    snapshot = state.snapshot
    interval = _log_upkeep.checkpoint_interval(snapshot.configuration)
    newest = max(LogListing.of(snapshot.uri).checkpoints, default=None)
    behind = snapshot.version - (newest if newest is not None else 0)
    if snapshot.version > 0 and behind >= interval:
        where = f"version {newest}" if newest is not None else "none yet"
        return Decision(
            True, f"newest checkpoint {where}, {behind} versions behind (interval {interval})"
        )
    return Decision(
        False, f"newest checkpoint {newest}, {behind} versions behind (interval {interval})"
    )


def run_checkpoint(state: TableState, decision: Decision) -> str:
    from deltalake import DeltaTable

    from deltaflow.table import _uri

    version = state.snapshot.version
    DeltaTable(_uri.delta_rs_uri(state.uri), version=version).create_checkpoint()
    return f"checkpoint written at version {version}"


def check_log_cleanup(state: TableState) -> Decision:
    configuration = state.snapshot.configuration
    if not _log_upkeep.expired_log_cleanup_enabled(configuration):
        return Decision(False, "delta.enableExpiredLogCleanup=false")
    seconds = _reader_leases.interval_seconds(
        _log_upkeep.table_property(configuration, "delta.logRetentionDuration")
    )
    hours = DEFAULT_LOG_RETENTION_HOURS if seconds is None else seconds / 3600
    cutoff = time.time() - hours * 3600
    listing = LogListing.of(state.uri)
    # delta-rs deletes entries older than the cutoff that precede a checkpoint.
    floor = max((v for v, t in listing.checkpoints.items() if t <= cutoff), default=None)
    if floor is None:
        floor = max(listing.checkpoints, default=-1)
    expired = [v for v, t in listing.commits.items() if t <= cutoff and v < floor]
    if not expired:
        return Decision(False, f"no log entry older than {hours:g} hours before a checkpoint")
    return Decision(
        True, f"{len(expired)} log entries older than {hours:g} hours (delta.logRetentionDuration)"
    )


def run_log_cleanup(state: TableState, decision: Decision) -> str:
    from deltalake import DeltaTable

    from deltaflow.table import _uri

    before = len(LogListing.of(state.uri).commits)
    DeltaTable(_uri.delta_rs_uri(state.uri)).cleanup_metadata()
    after = len(LogListing.of(state.uri).commits)
    return f"{before - after} log entries deleted"


# ---- VACUUM -----------------------------------------------------------------------------


def check_vacuum(state: TableState) -> Decision:
    from deltaflow.spark.commands import _vacuum

    hours = _vacuum.retention_hours_of(state.snapshot.configuration)
    if not state.check_vacuum:
        return Decision(False, "checked less than vacuum_check_seconds ago")
    # The VACUUM entry point itself (its dry run): whatever rules it keeps (retention,
    # files running streams still need) decide here too.
    files = _vacuum.vacuum(state.uri, dry_run=True)
    if not files:
        return Decision(False, f"no file past the retention of {hours:g} hours")
    return Decision(True, f"{len(files)} files past the retention of {hours:g} hours")


def run_vacuum(state: TableState, decision: Decision) -> str:
    from deltaflow.spark.commands import _vacuum

    _vacuum.vacuum(state.uri, commit_info=marker(decision.why))
    state.changed()
    return "unreferenced files deleted (VACUUM START / END)"


# ---- shared -----------------------------------------------------------------------------

Check = Callable[[TableState], Decision]
Run = Callable[[TableState, Decision], str]

# In this order: rewrites first; VACUUM before the checkpoint, because a checkpoint drops
# tombstones past the retention and delta-rs's VACUUM finds removed files only through
# tombstones; the checkpoint then covers this pass's commits.
ACTIONS: tuple[tuple[str, Check, Run], ...] = (
    ("OPTIMIZE", check_optimize, run_optimize),
    ("REORG PURGE", check_purge, run_purge),
    ("VACUUM", check_vacuum, run_vacuum),
    ("CHECKPOINT", check_checkpoint, run_checkpoint),
    ("LOG CLEANUP", check_log_cleanup, run_log_cleanup),
)
