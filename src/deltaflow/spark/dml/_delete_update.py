"""DELETE and UPDATE as Spark jobs over the files they touch, committed once.

1. The driver pins a snapshot. Candidate files are those whose partition values and
   min/max stats may satisfy the condition, when the condition is SQL text the
   predicate parser reads; otherwise (a Column, a function call...) every file.
2. Job 1 reads the candidates (:func:`._target_scan.scan`: Spark's Parquet scan when it reads
   them exactly, by :mod:`._native_read`'s rules applied to these files; otherwise a
   ``mapInArrow`` over the same ``read_file`` the ``delta`` source uses: deletion
   vectors, column mapping, partition values; the Spark conf
   ``deltaflow.dml.nativeScan`` = ``auto`` | ``false`` chooses) and counts, per file,
   its rows and the rows where the condition is true.
3. Job 2 reads only files with matches and computes their new rows in Spark
   (DELETE: rows where the condition is not true; UPDATE: ``CASE WHEN`` per set
   column); Spark's Parquet writer writes them when it can (:mod:`._native_write`),
   Python tasks with :class:`FileSetWriter` otherwise. A DELETE removes wholly
   matched files without rewriting them.
   With the change data feed enabled, job 2 also writes change rows
   (``_change_type``) to ``_change_data/`` files (:mod:`._changes`, Python
   writer); a DELETE then rewrites wholly matched files too (as change rows only),
   unless every touched file is wholly matched: such a commit needs no change files.
4. One commit of removes (naming any deletion vector) + adds (+ cdc) against the
   read version, by deltaflow's log writer on local tables: it fails with
   :class:`ConcurrentWriteError` by delta-spark's rules (WriteSerializable): a
   concurrent remove of a file this read (ConcurrentDeleteRead), a concurrent
   non-blind write into the partitions the condition reads (ConcurrentAppend)...
   A concurrent blind append does not conflict. Untouched files stay.

Null semantics are SQL's: a condition that is NULL does not match.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.errors import DeltaflowError
from deltaflow.spark._options import parse_write_options
from deltaflow.spark.dml import (
    _changes,
    _dv,
    _generated,
    _local_rewrite,
    _retry,
    _target_scan,
)
from deltaflow.spark.write._plan import WritePlan, plan_write
from deltaflow.table import _commit, _constraints, _schema
from deltaflow.table._snapshot import FileEntry, Snapshot, load_snapshot
from deltaflow.table.errors import SchemaMismatchError, UnsupportedFeatureError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("deltaflow.dml")

# Commit-info key naming the operation: delta-rs writes "operation": "WRITE" for every
# commit built from actions and does not let callers set it; history() reads this one.
OPERATION_KEY = "deltaflow.operation"

# Per candidate file index: its rows and the rows the condition matched.
_Counts = dict[int, _target_scan.FileCounts]


@dataclass(frozen=True)
class DmlMetrics:
    """What one DELETE / UPDATE did; recorded in the commit info as ``operationMetrics``."""

    operation: Literal["DELETE", "UPDATE"]
    affected_rows: int = 0  # deleted or updated
    copied_rows: int = 0
    added_files: int = 0
    removed_files: int = 0
    added_bytes: int = 0
    removed_bytes: int = 0
    change_files: int = 0
    scan_time_ms: int = 0
    rewrite_time_ms: int = 0
    execution_time_ms: int = 0
    version: int | None = None  # None: nothing matched, nothing was committed
    # Deletion vector metrics (delta-spark's names), when rows were marked deleted.
    dv_metrics: tuple[tuple[str, str], ...] = ()

    def operation_metrics(self) -> dict[str, str]:
        """delta-spark's metric names; values are strings, as in delta-spark's log."""
        affected = "numDeletedRows" if self.operation == "DELETE" else "numUpdatedRows"
        values = {
            affected: self.affected_rows,
            "numCopiedRows": self.copied_rows,
            "numAddedFiles": self.added_files,
            "numRemovedFiles": self.removed_files,
            "numAddedBytes": self.added_bytes,
            "numRemovedBytes": self.removed_bytes,
            "numAddedChangeFiles": self.change_files,
            "scanTimeMs": self.scan_time_ms,
            "rewriteTimeMs": self.rewrite_time_ms,
            "executionTimeMs": self.execution_time_ms,
        }
        return {**{k: str(v) for k, v in values.items()}, **dict(self.dv_metrics)}


def delete(spark: SparkSession, uri: str, alias: str | None, condition: Any) -> DmlMetrics:
    """Delete the rows of ``uri`` where ``condition`` is true (every row when None)."""
    return _retry.run_dml(
        spark, "DELETE", uri, lambda: _run(spark, uri, alias, "DELETE", condition, {})
    )


def update(
    spark: SparkSession,
    uri: str,
    alias: str | None,
    condition: Any,
    assignments: Mapping[str, Any],
) -> DmlMetrics:
    """Set ``assignments`` (column -> SQL text or Column) on rows where ``condition`` is true."""
    if not assignments:
        raise SchemaMismatchError(
            f"update() on table {uri} needs at least one column in set={{...}}.",
            table_uri=uri,
            columns=(),
        )
    return _retry.run_dml(
        spark, "UPDATE", uri, lambda: _run(spark, uri, alias, "UPDATE", condition, assignments)
    )


def _run(
    spark: SparkSession,
    uri: str,
    alias: str | None,
    operation: Literal["DELETE", "UPDATE"],
    condition: Any,
    assignments: Mapping[str, Any],
) -> DmlMetrics:
    from pyspark.sql.types import StructType

    started = time.perf_counter()
    snapshot, plan = _prepare(uri, operation)
    struct = StructType.fromJson(_schema.logical_schema(snapshot.schema))
    resolved = _resolve_assignments(uri, struct, alias, assignments)
    generation = _generated.Generation.of(uri, snapshot.schema)
    generation.refuse_identity_update(resolved, operation)
    check_resolves(table_frame(spark, struct, alias), condition, assignments.values())
    files = _target_scan.candidate_files(snapshot, condition, alias)
    if not files:
        return DmlMetrics(operation)
    if _dv.enabled(snapshot) and condition is not None:
        return _run_with_dvs(
            spark,
            snapshot,
            plan,
            struct,
            files,
            alias,
            operation,
            condition,
            resolved,
            started,
            generation,
        )

    counts = (
        _shortcut_counts(snapshot, files) if operation == "DELETE" and condition is None else None
    )
    changes = _changes.cdf_enabled(snapshot)
    local: tuple[pa.Table, _target_scan.TargetScan] | None = None
    if counts is None and _local_rewrite.eligible(spark, snapshot, files):
        scan = _target_scan.scan(spark, snapshot, struct, files, alias)
        rows = _rewritten_rows(
            scan.df, struct, condition, resolved, operation, changes, generation, keep=True
        )
        with _target_scan.balanced_splits(spark, files), _changes.constraint_errors(plan):
            table = _changes.guarded(rows, plan, changes=changes).toArrow()
        local = (table, scan)
        counts = _local_rewrite.counts(table, scan, operation, changes=changes)
    elif counts is None:
        scan = _target_scan.scan(spark, snapshot, struct, files, alias)
        with _target_scan.balanced_splits(spark, files):
            counts = _count_matches(scan, condition)
    scanned = time.perf_counter()

    touched = [i for i, c in counts.items() if c.matched > 0]
    if not touched:
        log.info("%s on %s matched no rows; nothing to commit", operation, uri)
        return DmlMetrics(operation, scan_time_ms=_ms(started, scanned))
    if operation == "DELETE":
        rewrite = [i for i in touched if counts[i].matched < counts[i].total]
        if changes and rewrite:
            # The commit will have change files, which readers then take as all of its
            # changes: rows of wholly deleted files must be in them too.
            rewrite = touched
    else:
        rewrite = touched

    affected = sum(counts[i].matched for i in touched)
    copied = sum(counts[i].total - counts[i].matched for i in rewrite)
    written = _changes.Written([], [], 0)
    if rewrite and local is not None:
        written = _local_rewrite.write(*local, rewrite, operation, plan, changes=changes)
    elif rewrite:
        scan_df = _target_scan.scan(
            spark, snapshot, struct, [files[i] for i in rewrite], alias, keyed=False
        ).df
        rows = _rewritten_rows(scan_df, struct, condition, resolved, operation, changes, generation)
        with _target_scan.balanced_splits(spark, [files[i] for i in rewrite]):
            written = _changes.write(rows, plan, changes=changes)
        expected = copied + (affected if operation == "UPDATE" else 0)
        if written.rows != expected:
            written.delete(uri)
            raise _not_deterministic(uri, operation, written.rows, expected)
    rewritten = time.perf_counter()

    removed = [files[i] for i in touched]
    metrics = DmlMetrics(
        operation,
        affected_rows=affected,
        copied_rows=copied,
        added_files=len(written.adds),
        removed_files=len(removed),
        added_bytes=sum(a.size for a in written.adds),
        removed_bytes=sum(f.size for f in removed),
        change_files=len(written.cdc),
        scan_time_ms=_ms(started, scanned),
        rewrite_time_ms=_ms(scanned, rewritten),
    )
    read = _changes.read_set(
        snapshot,
        files,
        _target_scan.parse_condition(condition, alias),
        whole_table=condition is None,
    )
    return _commit_changes(snapshot, plan, written, removed, metrics, condition, started, read)


def _run_with_dvs(
    spark: SparkSession,
    snapshot: Snapshot,
    plan: WritePlan,
    struct: StructType,
    files: list[FileEntry],
    alias: str | None,
    operation: Literal["DELETE", "UPDATE"],
    condition: Any,
    assignments: Mapping[str, Column],
    started: float,
    generation: _generated.Generation,
) -> DmlMetrics:
    """DELETE / UPDATE marking matched rows in deletion vectors (:mod:`._dv`): job 1
    collects their row indexes per file; UPDATE (and the change data feed) then writes
    only the matched rows' new versions (change rows); one commit."""
    deleted = snapshot.deleted_rows()
    scan = _target_scan.scan(spark, snapshot, struct, files, alias, row_index=True, deleted=deleted)
    matched = _condition_column(condition)
    with _target_scan.balanced_splits(spark, files):
        matches = _dv.collect_matches(scan.df, _target_scan.FILE_INDEX, matched, scan.index)
    scanned = time.perf_counter()
    touched = [i for i, m in matches.items() if m.matched]
    if not touched:
        log.info("%s on %s matched no rows; nothing to commit", operation, snapshot.uri)
        return DmlMetrics(operation, scan_time_ms=_ms(started, scanned))
    affected = sum(matches[i].matched for i in touched)
    changes = _changes.cdf_enabled(snapshot)
    written = _changes.Written([], [], 0)
    if operation == "UPDATE" or changes:
        again = _target_scan.scan(
            spark,
            snapshot,
            struct,
            [files[i] for i in touched],
            alias,
            row_index=True,
            deleted=deleted,
            keyed=False,
        ).df
        rows = _rewritten_rows(
            again.where(matched).drop(_dv.ROW_INDEX),
            struct,
            condition,
            assignments,
            operation,
            changes,
            generation,
        )
        with _target_scan.balanced_splits(spark, [files[i] for i in touched]):
            written = _changes.write(rows, plan, changes=changes)
        expected = affected if operation == "UPDATE" else 0
        if written.rows != expected:
            written.delete(snapshot.uri)
            raise _not_deterministic(snapshot.uri, operation, written.rows, expected)
    try:
        marked = _dv.mark(snapshot, files, matches, deleted)
    except BaseException:
        written.delete(snapshot.uri)
        raise
    rewritten = time.perf_counter()
    metrics = DmlMetrics(
        operation,
        affected_rows=affected,
        added_files=len(written.adds),
        removed_files=marked.removed_whole,
        added_bytes=sum(a.size for a in written.adds),
        removed_bytes=sum(files[i].size for i in touched if matches[i].matched >= matches[i].total),
        change_files=len(written.cdc),
        scan_time_ms=_ms(started, scanned),
        rewrite_time_ms=_ms(scanned, rewritten),
        dv_metrics=tuple(marked.operation_metrics().items()),
    )
    read = _changes.read_set(
        snapshot, files, _target_scan.parse_condition(condition, alias), whole_table=False
    )
    return _commit_changes(
        snapshot, plan, written, [], metrics, condition, started, read, marked=marked
    )


def _not_deterministic(uri: str, operation: str, rows: int, expected: int) -> DeltaflowError:
    return DeltaflowError(
        f"{operation} on {uri} wrote {rows} rows where {expected} were expected: the"
        " condition or a set expression is not deterministic. Nothing was committed;"
        " use deterministic expressions.",
        table_uri=uri,
    )


def _prepare(uri: str, operation: str, *, rewrites: bool = True) -> tuple[Snapshot, WritePlan]:
    """The pinned snapshot and write plan; ``rewrites=False`` (an insert-only MERGE) only
    adds files, which append-only and change-data-feed tables allow."""
    snapshot = load_snapshot(uri)
    config = {k.lower(): (v or "").lower() for k, v in snapshot.configuration.items()}
    if rewrites and config.get("delta.appendonly") == "true":
        raise UnsupportedFeatureError(
            f"Table {uri} is append-only (delta.appendOnly=true): {operation} is not allowed."
            " Set delta.appendOnly=false with DeltaTable.setProperties() first.",
            table_uri=uri,
            feature="appendOnly",
        )
    if rewrites:
        _changes.require_log_writer(snapshot, operation)
    # plan_write checks writer features and settles column mapping and partitioning
    # exactly as an append would; the commit is pinned to the version read here.
    logical = _schema.logical_schema(snapshot.schema)
    plan = plan_write(uri, logical, "append", parse_write_options({"path": uri}), current=snapshot)
    return snapshot, dataclasses.replace(plan, read_version=snapshot.version)


def _resolve_assignments(
    uri: str, struct: StructType, alias: str | None, assignments: Mapping[str, Any]
) -> dict[str, Column]:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    names = {f.name.lower(): f.name for f in struct.fields}
    resolved: dict[str, Column] = {}
    unknown = []
    for key, value in assignments.items():
        name = key.strip("`")
        if alias and name.lower().startswith(alias.lower() + "."):
            name = name[len(alias) + 1 :]
        column = names.get(name.strip("`").lower())
        if column is None:
            unknown.append(key)
            continue
        resolved[column] = value if isinstance(value, Column) else F.expr(str(value))
    if unknown:
        raise SchemaMismatchError(
            f"update() on table {uri} sets {', '.join(unknown)}, which are not top-level columns"
            f" of the table (nested fields cannot be set yet). Columns:"
            f" {', '.join(f.name for f in struct.fields)}.",
            table_uri=uri,
            columns=tuple(unknown),
        )
    return resolved


def table_frame(spark: SparkSession, struct: StructType, alias: str | None) -> DataFrame:
    """An empty DataFrame with the table's own columns (no rows, no job)."""
    frame = spark.createDataFrame([], struct)
    return frame.alias(alias) if alias else frame


def check_resolves(frame: DataFrame, condition: Any, values: Iterable[Any] = ()) -> None:
    """Resolve the user's expressions (SQL text or Columns) against ``frame``'s columns
    before any scan.

    The scans add columns of ours (the file key ``_target_scan.FILE_INDEX``, Spark's ``_metadata``,
    MERGE's marks and row ids); an unknown or ambiguous name resolved there fails with
    Spark's suggestions and plan listing them. Resolved here, the error names only the
    user's columns. (A Column bound to another DataFrame of the table fails here as it
    would in the scan's plan: its attributes are not the scan's.)
    """
    from pyspark.sql import functions as F

    if condition is not None:
        frame.where(_condition_column(condition))
    columns = [F.expr(v) if isinstance(v, str) else v for v in values]
    if columns:
        frame.select(*columns)


def _shortcut_counts(snapshot: Snapshot, files: list[FileEntry]) -> _Counts | None:
    """DELETE without a condition removes every file: stats give the row counts, no scan."""
    if any(f.num_records is None for f in files) or snapshot.deleted_rows():
        return None
    counted = _target_scan.FileCounts
    return {i: counted(f.num_records or 0, f.num_records or 0) for i, f in enumerate(files)}


def _condition_column(condition: Any) -> Column:
    from pyspark.sql import functions as F

    if condition is None:
        return F.lit(True)
    column = F.expr(condition) if isinstance(condition, str) else condition
    return F.coalesce(column, F.lit(False))  # NULL does not match, as in SQL's WHERE


def _count_matches(scan: _target_scan.TargetScan, condition: Any) -> _Counts:
    from pyspark.sql import functions as F

    matches = F.when(_condition_column(condition), 1).otherwise(0)
    rows = (
        scan.df.groupBy(F.col(_target_scan.FILE_INDEX))
        .agg(F.count(F.lit(1)).alias("total"), F.sum(matches).alias("matched"))
        .collect()
    )
    return {
        scan.index(r[_target_scan.FILE_INDEX]): _target_scan.FileCounts(
            int(r["total"]), int(r["matched"] or 0)
        )
        for r in rows
    }


def _rewritten_rows(
    scan: DataFrame,
    struct: StructType,
    condition: Any,
    assignments: Mapping[str, Column],
    operation: str,
    changes: bool,
    generation: _generated.Generation,
    *,
    keep: bool = False,
) -> DataFrame:
    """Job 2's rows; with ``changes``, plus change rows (``_change_type`` not NULL).
    An UPDATE computes the generated columns it does not set from the new values.
    ``keep``: every row, with its ``FILE_INDEX`` and ``_local_rewrite.MATCHED`` (a DELETE
    keeps its matched rows too, for the one-job route to count)."""
    from pyspark.sql import functions as F

    cw = _changes
    matched = _condition_column(condition)
    none = F.lit(None).cast("string")
    extra = [F.col(_target_scan.FILE_INDEX), matched.alias(_local_rewrite.MATCHED)] if keep else []
    if operation == "DELETE":
        data = [F.col(_constraints.quote([f.name])) for f in struct.fields]
        if not changes:
            return scan.select(*data, *extra) if keep else scan.where(~matched).select(*data)
        kind = F.when(matched, F.lit(cw.DELETE)).otherwise(none)
        return scan.select(*data, kind.alias(cw.CHANGE_TYPE), *extra)
    if changes:
        # A matched row is written three times: the new row, its pre- and post-image.
        kinds = F.when(matched, F.array(none, F.lit(cw.PREIMAGE), F.lit(cw.POSTIMAGE))).otherwise(
            F.array(none)
        )
        scan = scan.withColumn(cw.CHANGE_TYPE, F.explode(kinds))
    is_preimage = F.col(cw.CHANGE_TYPE) == F.lit(cw.PREIMAGE) if changes else F.lit(False)
    columns = []
    for field in struct.fields:
        old = F.col(f"`{field.name}`")
        value = assignments.get(field.name)
        if value is None:
            columns.append(old)
            continue
        new = value.cast(field.dataType)
        chosen = new if condition is None else F.when(matched, new).otherwise(old)
        if changes:
            chosen = F.when(is_preimage, old).otherwise(chosen)
        columns.append(chosen.alias(field.name))
    if changes:
        columns.append(F.col(cw.CHANGE_TYPE))
    columns.extend(extra)
    regenerate = [c.name for c in generation.generated if c.name not in assignments]
    if not regenerate:
        return scan.select(*columns)
    # A row's new generated values: where the condition holds, not for pre-images.
    updated = F.lit(True) if condition is None else matched
    if changes:
        updated = updated & ~F.coalesce(is_preimage, F.lit(False))
    markers = {name: _generated.marker(i) for i, name in enumerate(regenerate)}
    columns.extend(updated.alias(m) for m in markers.values())
    return _generated.recomputed(scan.select(*columns), generation, markers)


def _commit_changes(
    snapshot: Snapshot,
    plan: WritePlan,
    written: _changes.Written,
    removed: list[FileEntry],
    metrics: DmlMetrics,
    condition: Any,
    started: float,
    read: Any,
    *,
    marked: _dv.Marked | None = None,
) -> DmlMetrics:
    """One commit of ``written`` and the removes of ``removed`` (plus, with ``marked``,
    its removes and re-added files); files written are deleted when it fails."""

    def discard() -> None:
        written.delete(snapshot.uri)
        if marked is not None:
            marked.delete_files()

    try:
        removes = _changes.removes(snapshot, removed)
    except BaseException:
        discard()
        raise
    adds: list[_commit.AddedFile] = list(written.adds)
    if marked is not None:
        removes.extend(marked.removes)
        adds.extend(marked.adds)
    metrics = dataclasses.replace(metrics, execution_time_ms=_ms(started, time.perf_counter()))
    predicate = [] if condition is None else [sql_text(condition)]
    request = _commit.CommitRequest(
        table_uri=snapshot.uri,
        schema=plan.schema,
        partition_columns=plan.partition_columns,
        adds=adds,
        removes=removes,
        cdc=written.cdc,
        mode="append",
        read_version=snapshot.version,
        read=read if _changes.uses_log_writer(snapshot.uri) else None,
        operation=metrics.operation,
        commit_info={
            OPERATION_KEY: metrics.operation,
            "operationParameters": {"predicate": json.dumps(predicate)},
            "operationMetrics": metrics.operation_metrics(),
            "readVersion": snapshot.version,
            "isBlindAppend": False,
        },
    )
    try:
        result = commit(request)
    except BaseException:
        discard()
        raise
    log.info("%s on %s: version %s, %s", metrics.operation, snapshot.uri, result.version, metrics)
    return dataclasses.replace(metrics, version=result.version)


def commit(request: _commit.CommitRequest) -> _commit.CommitResult:
    """The commit step, a seam for tests that interleave a concurrent writer."""
    return _retry.commit(request)


def sql_text(condition: Any) -> str:
    """A condition as SQL text for the commit info (Columns print as Spark shows them)."""
    if isinstance(condition, str):
        return condition
    text = str(condition)
    if text.startswith("Column<'") and text.endswith("'>"):
        return text[len("Column<'") : -2]
    return text


def _ms(start: float, end: float) -> int:
    return int((end - start) * 1000)
