"""Restore and optimize of a Delta table, as rows.

Each function returns the rows of delta-spark's command output (tuples in the order of
the matching ``*_SCHEMA``; timestamps as UTC datetimes, structs as tuples). The SQL
commands get them through the bridge (``bridge/_commands.py``); ``deltaflow.DeltaTable``
turns them into DataFrames when its session has no deltaflow SQL extension. History and
detail are in :mod:`._describe`, VACUUM in :mod:`._vacuum`; the helpers they share with
these commands (:func:`writable_table`, :func:`upkeep`) are here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs
from deltalake import CommitProperties
from deltalake import DeltaTable as _DeltaRsTable
from deltalake.exceptions import CommitFailedError, DeltaError

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.errors import RestoreFilesMissingError
from deltaflow.table import (
    _cluster_optimize,
    _clustering,
    _commit_conflicts,
    _commit_info,
    _compaction_lease,
    _log_upkeep,
    _log_write,
    _partitions,
    _predicates,
    _uri,
)
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import Snapshot, load_snapshot
from deltaflow.table.errors import (
    ConcurrentWriteError,
    UnsupportedFeatureError,
    VersionNotFoundError,
)

Row = tuple[Any, ...]
log = logging.getLogger("deltaflow.maintenance")

# OPTIMIZE waits this long for a running compaction of the table (auto compaction's are
# bounded and short) before it gives up with a retryable conflict.
OPTIMIZE_LEASE_WAIT_SECONDS = 600.0

# The output schemas of delta-spark's commands (the JVM commands declare the same ones;
# tests/spark/test_sql_commands.py checks that they agree).
_FILE_STATS = "struct<min:bigint,max:bigint,avg:double,totalFiles:bigint,totalSize:bigint>"
# delta-spark's ZOrderStats (also what a clustered table's OPTIMIZE reports there).
_CUBE_FILES = "struct<num:bigint,size:bigint>"
_ZORDER_STATS = (
    f"struct<strategyName:string,inputCubeFiles:{_CUBE_FILES},inputOtherFiles:{_CUBE_FILES},"
    f"inputNumCubes:bigint,mergedFiles:{_CUBE_FILES},numOutputCubes:bigint,"
    f"mergedNumCubes:bigint>"
)
OPTIMIZE_SCHEMA = (
    f"path string, metrics struct<numFilesAdded:bigint,numFilesRemoved:bigint,"
    f"filesAdded:{_FILE_STATS},filesRemoved:{_FILE_STATS},partitionsOptimized:bigint,"
    f"zOrderStats:{_ZORDER_STATS},"
    f"numBatches:bigint,totalConsideredFiles:bigint,totalFilesSkipped:bigint,"
    f"preserveInsertionOrder:boolean>"
)
RESTORE_SCHEMA = (
    "table_size_after_restore bigint, num_of_files_after_restore bigint,"
    " num_removed_files bigint, num_restored_files bigint, removed_files_size bigint,"
    " restored_files_size bigint"
)


# ---- maintenance --------------------------------------------------------------------


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
        table = writable_table(before.uri)
        table.restore(
            version,
            commit_properties=_parameters(parameters),
            post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
        )
        upkeep(before.uri, table)
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
    uri: str,
    *,
    where: str | None = None,
    zorder_by: list[str] | None = None,
    full: bool = False,
    predicates: list[str] | None = None,
) -> list[Row]:
    """Compact small files (``OPTIMIZE``), or Z-order them by ``zorder_by``, in the
    partitions ``where`` selects (a predicate on partition columns). On a clustered table,
    cluster the files not clustered yet (all of them with ``full``, ``OPTIMIZE ... FULL``).
    Commits with ``dataChange=false``, so streams reading the table skip it.

    ``predicates``: ``where`` as delta-spark records it in the commit's ``predicate``
    parameter (Spark's parsed expression, ``('key = a)``), which the JVM command sends;
    without it the text of ``where`` is recorded."""
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
    recorded = predicates if predicates is not None else ([where] if where else [])
    parameters = {
        "predicate": json.dumps(recorded),
        "zOrderBy": json.dumps(columns),
        "clusterBy": "[]",
        "auto": False,
    }
    with _compaction_lease.holding(snapshot.uri, OPTIMIZE_LEASE_WAIT_SECONDS) as held:
        if not held:
            raise _compaction_lease.busy(
                "OPTIMIZE", snapshot.uri, snapshot.version, OPTIMIZE_LEASE_WAIT_SECONDS
            )
        metrics = _compact(snapshot.uri, filters, columns, parameters, own_predicate=True)

    def stats(value: Any) -> Row | None:
        data = json.loads(value) if isinstance(value, str) else value
        if not data:
            return None
        keys = ("min", "max", "avg", "totalFiles", "totalSize")
        return tuple(float(data[k]) if k == "avg" else data.get(k) for k in keys)

    zorder = None
    if zorder_by:
        removed = (metrics.get("numFilesRemoved", 0), _total_size(metrics.get("filesRemoved")))
        # delta-spark's first Z-order of files ("all": none is in a Z-cube yet), one
        # output cube per partition.
        zorder = zorder_stats(
            "all", other=removed, merged=removed, output_cubes=metrics.get("partitionsOptimized", 0)
        )
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


def zorder_stats(
    strategy: str,
    *,
    cubes: tuple[int, int] = (0, 0),
    other: tuple[int, int] = (0, 0),
    input_cubes: int = 0,
    merged: tuple[int, int] = (0, 0),
    output_cubes: int = 0,
) -> Row:
    """A ``zOrderStats`` struct of OPTIMIZE's metrics: files (count, bytes) already in
    Z-cubes and others, the input cubes, the files merged and the cubes written."""
    return (strategy, cubes, other, input_cubes, merged, output_cubes, None)


def _total_size(value: Any) -> int:
    data = json.loads(value) if isinstance(value, str) else value
    return int((data or {}).get("totalSize", 0))


def _compact(
    uri: str,
    filters: Any,
    columns: list[str],
    parameters: dict[str, Any],
    *,
    own_predicate: bool = False,
    table: _DeltaRsTable | None = None,
) -> dict[str, Any]:
    """delta-rs's bin-packing (or Z-order when ``columns``), on the newest version.
    ``own_predicate``: delta-rs records its own rendering of the partition filters as
    ``predicate``, over ours, so the commit also keeps delta-spark's parameters whole
    under deltaflow's history key, which DESCRIBE HISTORY shows. ``table``: the delta-rs
    table to optimize as loaded (default: the newest version)."""
    table = table if table is not None else writable_table(uri)
    properties = _parameters(parameters)
    if own_predicate:
        shown = {k: v if isinstance(v, str) else json.dumps(v) for k, v in parameters.items()}
        properties = CommitProperties(
            custom_metadata={
                "operationParameters": parameters,
                _commit_info.HISTORY_PARAMETERS_KEY: shown,
            }
        )
    try:
        if columns:
            metrics = table.optimize.z_order(
                columns,
                partition_filters=filters,
                commit_properties=properties,
                post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
            )
        else:
            metrics = table.optimize.compact(
                partition_filters=filters,
                commit_properties=properties,
                post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
            )
    except CommitFailedError as exc:
        # Lost to a concurrent commit (a MERGE deleted files it read): delta-spark's
        # ConcurrentDeleteReadException and friends, retryable, not delta-rs's text.
        unsupported = _log_write.from_delta_rs(exc, uri, "OPTIMIZE")
        if unsupported is not None:
            raise unsupported from exc
        kind = _commit_conflicts.conflict_kind(str(exc))
        raise ConcurrentWriteError(
            f"OPTIMIZE of {uri} conflicted with a concurrent writer ({kind}): {exc}. Nothing"
            " was committed; run OPTIMIZE again (it compacts the table as it is then).",
            table_uri=uri,
            kind=kind,
            read_version=table.version(),
            attempts=1,
        ) from exc
    except DeltaError as exc:  # e.g. an identity table: a typed refusal, not delta-rs's
        unsupported = _log_write.from_delta_rs(exc, uri, "OPTIMIZE")
        if unsupported is not None:
            raise unsupported from exc
        if "is outside table root" not in str(exc):
            raise
        if columns or filters:
            raise UnsupportedFeatureError(
                f"OPTIMIZE of {uri} with {'ZORDER BY' if columns else 'WHERE'}: some of its"
                " data files live outside the table (their log paths are absolute, as a"
                " shallow clone's are), and only a plain OPTIMIZE compacts such a table"
                " (delta-rs, which Z-orders and filters for deltaflow, reads only files"
                " under the table's root). Run OPTIMIZE without it. Nothing was committed.",
                table_uri=uri,
                feature="absolutePaths",
            ) from exc
        return _compact_outside_root(uri, parameters)
    upkeep(uri, table)
    return metrics


def _compact_outside_root(uri: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """OPTIMIZE of a table with files outside its root, on deltaflow's own reader and
    log writer (``_cluster_optimize.compact``), in delta-rs's metrics' shape."""
    snapshot = load_snapshot(uri)
    result = _cluster_optimize.compact(snapshot, parameters)

    def summary(sizes: list[int]) -> dict[str, Any]:
        if not sizes:
            return {"min": 0, "max": 0, "avg": 0.0, "totalFiles": 0, "totalSize": 0}
        total = sum(sizes)
        return {
            "min": min(sizes),
            "max": max(sizes),
            "avg": total / len(sizes),
            "totalFiles": len(sizes),
            "totalSize": total,
        }

    if result.version is not None:
        _log_upkeep.after_commit(uri, result.version, configuration=snapshot.configuration)
    return {
        "numFilesAdded": len(result.files_added),
        "numFilesRemoved": len(result.files_removed),
        "filesAdded": summary(result.files_added),
        "filesRemoved": summary(result.files_removed),
        "partitionsOptimized": result.partitions,
        "numBatches": 1 if result.version is not None else 0,
        "totalConsideredFiles": result.considered,
        "totalFilesSkipped": result.considered - len(result.files_removed),
        "preserveInsertionOrder": True,
    }


def upkeep(uri: str, table: _DeltaRsTable) -> None:
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
                (
                    zorder_stats(
                        "Clustering",
                        cubes=(removed, sum(result.files_removed)),
                        merged=(removed, sum(result.files_removed)),
                        output_cubes=1,
                    )
                    if removed
                    else None
                ),
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
            # delta-spark's DELTA_NON_PARTITION_COLUMN_REFERENCE, word for word.
            raise InvalidOptionError(
                f"[DELTA_NON_PARTITION_COLUMN_REFERENCE] Predicate references non-partition"
                f" column '{operand.path[0]}'. Only the partition columns may be referenced:"
                f" [{', '.join(snapshot.partition_columns)}]. OPTIMIZE WHERE '{predicate}' on"
                f" {snapshot.uri} selects partitions; name only partition columns in it.",
                option="partitionFilter",
                valid=tuple(snapshot.partition_columns),
            )
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


# ---- internals ----------------------------------------------------------------------


def _parameters(parameters: dict[str, Any]) -> CommitProperties:
    """Commit properties adding delta-spark's ``operationParameters`` to a delta-rs
    commit (delta-rs keeps its own keys; it names the operation)."""
    return CommitProperties(custom_metadata={"operationParameters": parameters})


def writable_table(uri: str) -> _DeltaRsTable:
    return _DeltaRsTable(_uri.delta_rs_uri(uri))


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
                f"[DELTA_ZORDERING_ON_PARTITION_COLUMN] {name} is a partition column."
                f" Z-Ordering can only be performed on data columns (OPTIMIZE ZORDER BY on"
                f" {snapshot.uri}: files hold one value of it each). Z-order by data columns"
                f" and select partitions with WHERE.",
                option="zOrderBy",
                valid=tuple(n for n in names.values() if n not in snapshot.partition_columns),
            )
        columns.append(name)
    return columns
