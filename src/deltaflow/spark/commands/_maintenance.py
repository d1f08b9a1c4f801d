"""History, detail, vacuum, restore and optimize of a Delta table, as rows.

Each function returns the rows of delta-spark's command output (tuples in the order of
the matching ``*_SCHEMA``; timestamps as UTC datetimes, structs as tuples). The SQL
commands get them through the bridge (``bridge/_commands.py``); ``deltaflow.DeltaTable``
turns them into DataFrames when its session has no deltaflow SQL extension.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs
from deltalake import CommitProperties
from deltalake import DeltaTable as _DeltaRsTable
from deltalake.exceptions import DeltaError

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.dml._delete_update import OPERATION_KEY
from deltaflow.spark.errors import RestoreFilesMissingError, RetentionTooShortError
from deltaflow.spark.write._native import delete_stale_staging
from deltaflow.table import (
    _cluster_optimize,
    _clustering,
    _compaction_lease,
    _dv_references,
    _log_upkeep,
    _log_write,
    _partitions,
    _predicates,
    _reader_leases,
    _uri,
    _vacuum_guard,
)
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import Snapshot, load_snapshot
from deltaflow.table.errors import VersionNotFoundError

Row = tuple[Any, ...]
log = logging.getLogger("deltaflow.maintenance")

# delta-spark's conf that lets VACUUM keep removed files for less than the table's
# retention; the check protects readers and lagging streams that still need them.
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
DEFAULT_RETENTION_HOURS = 168.0  # delta.deletedFileRetentionDuration default: 7 days
# OPTIMIZE waits this long for a running compaction of the table (auto compaction's are
# bounded and short) before it gives up with a retryable conflict.
OPTIMIZE_LEASE_WAIT_SECONDS = 600.0

# The output schemas of delta-spark's commands (the JVM commands declare the same ones;
# tests/spark/test_sql_commands.py checks that they agree).
HISTORY_SCHEMA = (
    "version bigint, timestamp timestamp, userId string, userName string, operation string,"
    " operationParameters map<string,string>,"
    " job struct<jobId:string,jobName:string,jobRunId:string,runId:string,jobOwnerId:string,"
    "triggerType:string>,"
    " notebook struct<notebookId:string>, clusterId string, readVersion bigint,"
    " isolationLevel string, isBlindAppend boolean, operationMetrics map<string,string>,"
    " userMetadata string, engineInfo string"
)
DETAIL_SCHEMA = (
    "format string, id string, name string, description string, location string,"
    " createdAt timestamp, lastModified timestamp, partitionColumns array<string>,"
    " clusteringColumns array<string>, numFiles bigint, sizeInBytes bigint,"
    " properties map<string,string>, minReaderVersion int, minWriterVersion int,"
    " tableFeatures array<string>"
)
_FILE_STATS = "struct<min:bigint,max:bigint,avg:double,totalFiles:bigint,totalSize:bigint>"
OPTIMIZE_SCHEMA = (
    f"path string, metrics struct<numFilesAdded:bigint,numFilesRemoved:bigint,"
    f"filesAdded:{_FILE_STATS},filesRemoved:{_FILE_STATS},partitionsOptimized:bigint,"
    f"zOrderStats:struct<strategyName:string,inputCubeFiles:struct<num:bigint,size:bigint>>,"
    f"numBatches:bigint,totalConsideredFiles:bigint,totalFilesSkipped:bigint,"
    f"preserveInsertionOrder:boolean>"
)
RESTORE_SCHEMA = (
    "table_size_after_restore bigint, num_of_files_after_restore bigint,"
    " num_removed_files bigint, num_restored_files bigint, removed_files_size bigint,"
    " restored_files_size bigint"
)
VACUUM_SCHEMA = "path string"

# ---- inspection ---------------------------------------------------------------------


def history(uri: str, limit: int | None = None) -> list[Row]:
    """The table's commits, newest first (``DESCRIBE HISTORY``)."""
    if limit is not None and limit < 1:
        raise InvalidOptionError(
            f"DESCRIBE HISTORY of {uri}: LIMIT must be at least 1, got {limit}.",
            option="limit",
        )
    rows = [_history_row(c, uri) for c in load_snapshot(uri).history(limit)]
    rows.sort(key=lambda r: r[0], reverse=True)
    return rows


def detail(uri: str, name: str | None = None) -> list[Row]:
    """One row describing the table (``DESCRIBE DETAIL``); ``name`` is its catalog name."""
    snapshot = load_snapshot(uri)
    metadata = snapshot.delta_table.metadata()
    files = snapshot.files(stats=False)
    last = snapshot.history(1)
    row: Row = (
        "delta",
        metadata.id,
        name if name is not None else metadata.name,
        metadata.description,
        snapshot.uri,
        _timestamp(metadata.created_time),
        _timestamp(last[0]["timestamp"]) if last else None,
        list(snapshot.partition_columns),
        _clustering.clustering_columns(
            snapshot.uri, snapshot.schema, snapshot.writer_features, snapshot.version
        ),
        len(files),
        sum(f.size for f in files),
        {k: v for k, v in snapshot.configuration.items() if v is not None},
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        _table_features(snapshot),
    )
    return [row]


# ---- maintenance --------------------------------------------------------------------


def vacuum(
    uri: str,
    retention_hours: float | None = None,
    *,
    dry_run: bool = False,
    check_retention: bool = True,
    commit_info: Mapping[str, Any] | None = None,
) -> list[Row]:
    """Delete the table directory's files that no version inside the retention
    references and that are older than the retention (``VACUUM``, delta-spark's full mode).

    That covers files the log removed, files never committed (a crashed writer's or
    stream attempt's), expired ``_change_data/`` files and orphaned deletion vectors;
    other ``_``- or ``.``-prefixed directories are left alone. A file younger than the
    retention is never deleted, so a concurrent writer's uncommitted files are safe.

    Without ``retention_hours`` the table's ``delta.deletedFileRetentionDuration`` (7 days
    by default) applies. A shorter one is refused with :class:`RetentionTooShortError`
    unless ``check_retention`` is false (delta-spark's
    ``spark.databricks.delta.retentionDurationCheck.enabled``). A real run also deletes
    the staging directories of writes killed before their commit (``_delta_staging/``),
    once nothing was written in them for the retention. Returns the table's path, or
    with ``dry_run`` the files that would be deleted (nothing is deleted then).
    ``commit_info``: more commitInfo keys for the VACUUM START / END commits
    (``deltaflow maintain`` marks its runs with them).

    Files a running stream still needs are kept whatever the retention: every version at
    or after the lowest live reader lease's (:mod:`deltaflow.table._vacuum_guard`) keeps
    its files; what was kept for them is logged, and a real run deletes expired leases.
    """
    snapshot = load_snapshot(uri)
    minimum = retention_hours_of(snapshot.configuration)
    if retention_hours is not None:
        check_retention_value(snapshot.uri, retention_hours)
    if check_retention and retention_hours is not None and retention_hours < minimum:
        raise RetentionTooShortError(
            f"VACUUM of {snapshot.uri} with a retention of {retention_hours:g} hours is below"
            f" the table's {minimum:g} hours: files that running queries or lagging streams"
            f" still need could be deleted. If you are sure, set the Spark conf"
            f" {RETENTION_CHECK_CONF}=false.",
            table_uri=snapshot.uri,
            retention_hours=float(retention_hours),
            minimum_hours=minimum,
        )
    # delta-rs takes whole hours; rounding up keeps files at least as long as asked.
    hours = None if retention_hours is None else math.ceil(retention_hours)
    # delta-rs refuses to log VACUUM START/END on tables it cannot write (clustered ones):
    # there it only lists the files, and deltaflow deletes them (the log entries are
    # optional provenance, delta-spark's vacuum.logging).
    unwritable = bool(Protocol.of(snapshot).delta_rs_unwritable)
    table = _writable(snapshot.uri)
    readers = _vacuum_guard.guard(snapshot.uri, snapshot.version, snapshot.configuration)
    keep = list(readers.keep_versions) or None
    plan: dict[str, Any] = {
        "retention_hours": hours,
        "enforce_retention_duration": check_retention,
    }
    # Full mode, as delta-spark: every file in the table directory that no version inside
    # the retention references and that is older than the retention by its modification
    # time (crashed writers' files, expired _change_data/ files), not only the files the
    # log removed. delta-rs's full mode does that, except that it takes live deletion
    # vector files for orphans: on tables with deletion vectors delta-rs runs in its lite
    # mode and deltaflow deletes the other files it lists, deletion vectors excepted; so
    # it does on object stores, where delta-rs also lists directory marker objects (the
    # table's own ``prefix/``), which must not be deleted.
    full = _uri.is_local(snapshot.uri) and not Protocol.of(snapshot).features & {"deletionVectors"}
    # Tombstones removed since then keep their deletion vectors (computed before delta-rs
    # lists, so the cutoff errs early: more kept, never less).
    removed_since_ms = int(time.time() * 1000 - (minimum if hours is None else hours) * 3.6e6)
    dvs = _dv_references.DvFiles(snapshot.uri, removed_since_ms)
    unguarded = None
    if keep:  # to say what the leases keep: the plan without them (lists, deletes nothing)
        unguarded = _full_plan(table, snapshot.uri, plan, None, dvs)
    orphans = [] if full and not unwritable else _full_plan(table, snapshot.uri, plan, keep, dvs)
    removed = table.vacuum(
        **plan,
        dry_run=dry_run or unwritable,
        full=full,
        post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
        commit_properties=CommitProperties(custom_metadata=dict(commit_info))
        if commit_info
        else None,
        keep_versions=keep,
    )
    files = sorted(set(removed) | set(orphans))
    _report_readers(snapshot.uri, readers, unguarded, files, dry_run=dry_run)
    if not dry_run and not unwritable:
        _upkeep(snapshot.uri, table)
    if not dry_run:
        # delta-rs's run deleted (and logged) what it listed; the rest is deltaflow's.
        _delete_files(snapshot.uri, files if unwritable else sorted(set(orphans) - set(removed)))
    if dry_run:
        return [(_file_uri(snapshot.uri, f),) for f in sorted(files)]
    # delta-rs leaves _-prefixed directories alone, so the staging directories of
    # writes killed before their commit are ours to remove, by the same retention.
    delete_stale_staging(snapshot.uri, minimum if hours is None else hours)
    for lease in readers.expired:  # their readers died without releasing them
        _reader_leases.delete_lease(snapshot.uri, lease.lease_id)
    return [(snapshot.uri,)]


def _full_plan(
    table: _DeltaRsTable,
    table_uri: str,
    plan: Mapping[str, Any],
    keep: list[int] | None,
    dvs: _dv_references.DvFiles,
) -> list[str]:
    """The files delta-rs's full-mode VACUUM would delete, minus the deletion vector files
    a version inside the retention references (delta-rs 1.6.6's full mode counts no
    deletion vector as referenced, so it would delete live ones; with reader leases
    (``keep``) every deletion vector file stays, the leased versions' are not replayed),
    and minus directory markers (names ending in ``/``), which are no files of the table."""
    files = table.vacuum(**plan, dry_run=True, full=True, keep_versions=keep)
    out = []
    for f in files:
        if not f or f.endswith("/"):
            continue
        if _dv_references.is_dv_file(f) and (keep or dvs.referenced(_file_uri(table_uri, f))):
            continue
        out.append(f)
    return out


def _report_readers(
    uri: str,
    readers: _vacuum_guard.ReaderGuard,
    unguarded: list[str] | None,
    files: list[str],
    *,
    dry_run: bool,
) -> None:
    """Log what the running readers' leases kept (and which leases expired)."""
    for lease in readers.expired:
        log.info("VACUUM of %s: ignoring expired %s", uri, lease.describe())
    oldest = readers.oldest
    if oldest is None:
        return
    kept = sorted(set(unguarded or ()) - set(files))
    others = len(readers.live) - 1
    log.info(
        "VACUUM%s of %s keeps %d removed file(s) past the retention for running readers: %s%s%s",
        " DRY RUN" if dry_run else "",
        uri,
        len(kept),
        oldest.describe(),
        f" and {others} more lease(s)" if others else "",
        f"; e.g. {kept[0]}" if kept else "",
        # For tools and tests: the files kept and the leases that kept them.
        extra={"kept_files": kept, "reader_leases": [lease.lease_id for lease in readers.live]},
    )


def check_retention_value(uri: str, retention_hours: float) -> None:
    """Refuse a negative or non-finite VACUUM retention (:class:`InvalidOptionError`)."""
    if not math.isfinite(retention_hours) or retention_hours < 0:
        raise InvalidOptionError(
            f"VACUUM of {uri}: the retention must be a number of hours of 0 or more, got"
            f" {retention_hours}.",
            option="retentionHours",
        )


def restore(uri: str, *, version: int | None = None, timestamp: str | None = None) -> list[Row]:
    """Make an earlier version's files the table's current ones, in a new commit
    (``RESTORE``): by ``version``, or the latest version committed at or before
    ``timestamp`` (as ``timestampAsOf``). Refused with :class:`RestoreFilesMissingError`
    when VACUUM already deleted files of that version."""
    before = load_snapshot(uri)
    if version is None:
        if timestamp is None:
            raise InvalidOptionError(
                f"RESTORE of {uri} needs a version or a timestamp.", option="version"
            )
        version = load_snapshot(uri, timestamp=timestamp).version
    if not 0 <= version < before.version:
        raise VersionNotFoundError(
            f"Cannot restore {before.uri} to version {version}: restore needs a version from 0"
            f" to {before.version - 1} (the latest is {before.version}). DESCRIBE HISTORY lists"
            f" the versions.",
            table_uri=before.uri,
            version=version,
            latest=before.version,
        )
    target = {f.path: f.size for f in load_snapshot(uri, version=version).files(stats=False)}
    current = {f.path: f.size for f in before.files(stats=False)}
    restored = {p: s for p, s in target.items() if p not in current}
    _check_files_exist(before.uri, version, restored)
    removed = {p: s for p, s in current.items() if p not in target}
    row = (
        sum(target.values()),
        len(target),
        len(removed),
        len(restored),
        sum(removed.values()),
        sum(restored.values()),
    )
    # delta-spark's RESTORE parameters: version and timestamp (null when by version).
    parameters = {"version": version, "timestamp": timestamp}
    if Protocol.of(before).delta_rs_unwritable:  # delta-rs refuses: deltaflow's log writer
        metrics = dict(zip(_RESTORE_METRICS, (str(v) for v in row), strict=True))
        target_snapshot = load_snapshot(uri, version=version)
        _log_write.restore(before, target_snapshot, parameters, metrics)
    else:
        table = _writable(before.uri)
        table.restore(
            version,
            commit_properties=_parameters(parameters),
            post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
        )
        _upkeep(before.uri, table)
    return [row]


# delta-spark's RESTORE operationMetrics, in the order of the command's output row.
_RESTORE_METRICS = (
    "tableSizeAfterRestore",
    "numOfFilesAfterRestore",
    "numRemovedFiles",
    "numRestoredFiles",
    "removedFilesSize",
    "restoredFilesSize",
)


def optimize(
    uri: str, *, where: str | None = None, zorder_by: list[str] | None = None, full: bool = False
) -> list[Row]:
    """Compact small files (``OPTIMIZE``), or Z-order them by ``zorder_by``, in the
    partitions ``where`` selects (a predicate on partition columns). On a clustered table,
    cluster the files not clustered yet (all of them with ``full``, ``OPTIMIZE ... FULL``).
    Commits with ``dataChange=false``, so streams reading the table skip it."""
    snapshot = load_snapshot(uri)
    if _clustering.is_clustered(snapshot.writer_features):
        return _optimize_clustered(snapshot, where=where, zorder_by=zorder_by, full=full)
    if full:
        raise InvalidOptionError(
            f"OPTIMIZE {snapshot.uri} FULL: FULL reclusters a clustered table, and this table"
            " is not clustered. Run OPTIMIZE without FULL, or ALTER TABLE ... CLUSTER BY"
            " (columns) first.",
            option="full",
        )
    filters = partition_filters(snapshot, where) if where else None
    # delta-spark's OPTIMIZE parameters next to delta-rs's own (predicate, targetSize).
    columns = _zorder_columns(snapshot, zorder_by) if zorder_by else []
    parameters = {"zOrderBy": json.dumps(columns), "clusterBy": "[]", "auto": False}
    with _compaction_lease.holding(snapshot.uri, OPTIMIZE_LEASE_WAIT_SECONDS) as held:
        if not held:
            raise _compaction_lease.busy(
                "OPTIMIZE", snapshot.uri, snapshot.version, OPTIMIZE_LEASE_WAIT_SECONDS
            )
        metrics = _compact(snapshot.uri, filters, columns, parameters)

    def stats(value: Any) -> Row | None:
        data = json.loads(value) if isinstance(value, str) else value
        if not data:
            return None
        keys = ("min", "max", "avg", "totalFiles", "totalSize")
        return tuple(float(data[k]) if k == "avg" else data.get(k) for k in keys)

    zorder = ("ZOrder", (0, 0)) if zorder_by else None
    return [
        (
            snapshot.uri,
            (
                metrics.get("numFilesAdded", 0),
                metrics.get("numFilesRemoved", 0),
                stats(metrics.get("filesAdded")),
                stats(metrics.get("filesRemoved")),
                metrics.get("partitionsOptimized", 0),
                zorder,
                metrics.get("numBatches", 0),
                metrics.get("totalConsideredFiles", 0),
                metrics.get("totalFilesSkipped", 0),
                metrics.get("preserveInsertionOrder", True),
            ),
        )
    ]


def _compact(
    uri: str, filters: Any, columns: list[str], parameters: dict[str, Any]
) -> dict[str, Any]:
    """delta-rs's bin-packing (or Z-order when ``columns``), on the newest version."""
    table = _writable(uri)
    try:
        if columns:
            metrics = table.optimize.z_order(
                columns,
                partition_filters=filters,
                commit_properties=_parameters(parameters),
                post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
            )
        else:
            metrics = table.optimize.compact(
                partition_filters=filters,
                commit_properties=_parameters(parameters),
                post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
            )
    except DeltaError as exc:  # e.g. an identity table: a typed refusal, not delta-rs's
        unsupported = _log_write.from_delta_rs(exc, uri, "OPTIMIZE")
        if unsupported is not None:
            raise unsupported from exc
        raise
    _upkeep(uri, table)
    return metrics


def _upkeep(uri: str, table: _DeltaRsTable) -> None:
    """Checkpoint / expired log cleanup after a delta-rs maintenance commit (their own
    hook is off so that checkpoints land on delta-spark's versions)."""
    _log_upkeep.after_commit(uri, table.version(), configuration=table.metadata().configuration)


def _optimize_clustered(
    snapshot: Snapshot, *, where: str | None, zorder_by: list[str] | None, full: bool
) -> list[Row]:
    """OPTIMIZE of a clustered table: :mod:`deltaflow.table._cluster_optimize`."""
    columns = _clustering.clustering_columns(
        snapshot.uri, snapshot.schema, snapshot.writer_features, snapshot.version
    )
    if zorder_by:
        raise InvalidOptionError(
            f"OPTIMIZE {snapshot.uri} ZORDER BY: the table is clustered (by"
            f" {', '.join(columns) or 'no columns'}), and a clustered table is ordered by its"
            " clustering columns only. Run OPTIMIZE without ZORDER BY, or change the columns"
            " with ALTER TABLE ... CLUSTER BY (columns).",
            option="zOrderBy",
        )
    if where:
        raise InvalidOptionError(
            f"OPTIMIZE {snapshot.uri} WHERE: a clustered table has no partitions to select."
            " Run OPTIMIZE without WHERE: it clusters only the files not clustered yet.",
            option="partitionFilter",
        )
    result = _cluster_optimize.cluster(snapshot, full=full)

    def stats(sizes: list[int]) -> Row | None:
        if not sizes:
            return None
        return (min(sizes), max(sizes), sum(sizes) / len(sizes), len(sizes), sum(sizes))

    removed = len(result.files_removed)
    return [
        (
            snapshot.uri,
            (
                len(result.files_added),
                removed,
                stats(result.files_added),
                stats(result.files_removed),
                0,
                ("Clustering", (removed, sum(result.files_removed))) if removed else None,
                1 if removed else 0,
                result.considered,
                result.considered - removed,
                False,
            ),
        )
    ]


def partition_filters(snapshot: Snapshot, predicate: str) -> list[tuple[str, str, Any]]:
    """An OPTIMIZE ``WHERE`` (a conjunction on partition columns) as delta-rs filters."""
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    out: list[tuple[str, str, Any]] = []

    def invalid(detail: str) -> InvalidOptionError:
        return InvalidOptionError(
            f"OPTIMIZE WHERE '{predicate}' on {snapshot.uri}: {detail}. Use comparisons and IN"
            f" on partition columns joined by AND; partition columns:"
            f" {', '.join(snapshot.partition_columns) or 'none'}.",
            option="partitionFilter",
            valid=tuple(snapshot.partition_columns),
        )

    def column(operand: Any) -> str:
        if not isinstance(operand, _predicates.Column) or len(operand.path) != 1:
            raise invalid("each condition needs a partition column on one side")
        name = partitions.get(operand.path[0].lower())
        if name is None:
            raise invalid(f"'{operand.path[0]}' is not a partition column")
        return name

    def literal(operand: Any) -> str | None:
        if not isinstance(operand, _predicates.Literal):
            raise invalid("each condition needs a literal on one side")
        return _partitions.serialize_partition_value(operand.value)

    def visit(node: Any) -> None:
        if isinstance(node, _predicates.And):
            visit(node.left)
            visit(node.right)
        elif isinstance(node, _predicates.Compare) and node.op in ("=", "<>", "<", "<=", ">", ">="):
            left, right, op = node.left, node.right, node.op
            if isinstance(left, _predicates.Literal):
                flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
                left, right, op = right, left, flipped.get(op, op)
            out.append((column(left), "!=" if op == "<>" else op, literal(right)))
        elif isinstance(node, _predicates.InList):
            values = [literal(v) for v in node.values]
            out.append((column(node.operand), "not in" if node.negated else "in", values))
        elif isinstance(node, _predicates.IsNull):
            # delta-rs spells a null partition value as an empty string.
            out.append((column(node.operand), "!=" if node.negated else "=", ""))
        else:
            raise invalid("only AND of comparisons, IN and IS [NOT] NULL are supported")

    visit(_predicates.parse(predicate, option="partitionFilter"))
    return out


def retention_hours_of(configuration: Mapping[str, str | None]) -> float:
    """The table's ``delta.deletedFileRetentionDuration`` in hours (168 when unset)."""
    raw = configuration.get("delta.deletedFileRetentionDuration")
    match = re.fullmatch(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*", (raw or "").lower())
    if match is None:
        return DEFAULT_RETENTION_HOURS
    per_unit = {"week": 168.0, "day": 24.0, "hour": 1.0, "minute": 1 / 60, "second": 1 / 3600}
    unit = match.group(2).rstrip("s")
    if unit not in per_unit:
        return DEFAULT_RETENTION_HOURS
    return float(match.group(1)) * per_unit[unit]


# ---- internals ----------------------------------------------------------------------


def _parameters(parameters: dict[str, Any]) -> CommitProperties:
    """Commit properties adding delta-spark's ``operationParameters`` to a delta-rs
    commit (delta-rs keeps its own keys; it names the operation)."""
    return CommitProperties(custom_metadata={"operationParameters": parameters})


def _writable(uri: str) -> _DeltaRsTable:
    return _DeltaRsTable(_uri.delta_rs_uri(uri))


def _delete_files(table_uri: str, files: list[str]) -> None:
    fs, _ = _uri.filesystem(table_uri)
    for path in files:
        uri = _file_uri(table_uri, path)
        target = _uri.local_path(uri) if _uri.is_local(uri) else _uri.filesystem(uri)[1]
        with contextlib.suppress(FileNotFoundError):  # deleted by a concurrent VACUUM
            fs.delete_file(target)


def _file_uri(table_uri: str, path: str) -> str:
    """A file delta-rs names (relative to the root, or absolute) as a URI."""
    if "://" in path or path.startswith("/"):
        return _uri.normalize_uri(path)
    return _uri.join(table_uri, path)


def _check_files_exist(table_uri: str, version: int, files: Mapping[str, int]) -> None:
    if not files:
        return
    fs, root = _uri.filesystem(table_uri)
    paths = {f"{root.rstrip('/')}/{unquote(p)}": p for p in sorted(files)}
    infos = fs.get_file_info(list(paths))
    missing = [paths[i.path] for i in infos if i.type == pafs.FileType.NotFound]
    if missing:
        raise RestoreFilesMissingError(
            f"Cannot restore {table_uri} to version {version}: {len(missing)} of the data files"
            f" it needs are gone (VACUUM deleted them once they were older than the table's"
            f" retention), e.g. {unquote(missing[0])}. Restore a later version whose files"
            f" still exist (DESCRIBE HISTORY lists them); no commit was made.",
            table_uri=table_uri,
            version=version,
            path=unquote(missing[0]),
            missing=len(missing),
        )


def _zorder_columns(snapshot: Snapshot, requested: list[str]) -> list[str]:
    names = {f["name"].lower(): f["name"] for f in snapshot.schema.get("fields", [])}
    columns = []
    for column in requested:
        name = names.get(column.lower())
        if name is None:
            raise InvalidOptionError(
                f"OPTIMIZE ZORDER BY {column} on {snapshot.uri}: there is no such column."
                f" Columns: {', '.join(names.values())}.",
                option="zOrderBy",
                valid=tuple(names.values()),
            )
        if name in snapshot.partition_columns:
            raise InvalidOptionError(
                f"OPTIMIZE ZORDER BY {name} on {snapshot.uri}: {name} is a partition column;"
                f" files hold one value of it each, so Z-ordering by it does nothing. Z-order"
                f" by data columns and select partitions with WHERE.",
                option="zOrderBy",
                valid=tuple(n for n in names.values() if n not in snapshot.partition_columns),
            )
        columns.append(name)
    return columns


def _history_row(commit: dict[str, Any], uri: str) -> Row:
    from deltaflow.spark.dml import _merge_native

    operation = commit.get(OPERATION_KEY) or commit.get("operation")
    # A MERGE delta-rs committed (the small-source route): delta-spark's names.
    parameters = _merge_native.history_parameters(commit)
    metrics = _merge_native.history_metrics(commit, uri)
    return (
        commit.get("version"),
        _timestamp(commit.get("timestamp")),
        commit.get("userId"),
        commit.get("userName"),
        operation,
        _string_map(parameters if parameters is not None else commit.get("operationParameters")),
        None,
        None,
        commit.get("clusterId"),
        commit.get("readVersion"),
        commit.get("isolationLevel"),
        commit.get("isBlindAppend"),
        _string_map(metrics if metrics is not None else commit.get("operationMetrics")),
        commit.get("userMetadata"),
        commit.get("engineInfo"),
    )


def _string_map(values: Any) -> dict[str, str] | None:
    if not isinstance(values, dict):
        return None
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def _timestamp(ms: Any) -> dt.datetime | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.timezone.utc)


def _table_features(snapshot: Snapshot) -> list[str]:
    """DESCRIBE DETAIL's tableFeatures: the features listed or implied by legacy versions."""
    from deltaflow.table._protocol import Protocol

    protocol = Protocol(
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        frozenset(snapshot.reader_features),
        frozenset(snapshot.writer_features),
    )
    return sorted(protocol.features)
