"""MERGE as Spark jobs over the files it touches, committed once (delta-spark semantics).

1. The driver pins a snapshot. Candidate target files are pruned by the conjuncts of
   the merge condition that name only the target (``t.kind = 'a'``), when the
   condition is SQL text the predicate parser reads; otherwise every file.
2. The candidates are read with the same ``mapInArrow`` scan as DELETE / UPDATE
   (``_dml._scan``), each row carrying its file index and a row id, and joined with
   the source: full outer with insert clauses, else target-left.
3. Every joined row gets the index of the first clause that applies (clauses in
   order, NULL conditions do not match): matched, not-matched (source only) or
   not-matched-by-source (target only). Job 1 aggregates per target file: rows
   updated / deleted / copied, inserts, and source rows per target row (a target row
   that more than one source row would modify fails with
   :class:`MultipleSourceRowMatchingTargetRowError`, nothing committed).
4. Job 2 computes the output rows with one ``CASE`` per column: every row of a
   touched file (copied, updated, or dropped when deleted) plus the inserts. Files
   with no updated or deleted row are left as they are. Tasks write with
   :class:`FileSetWriter`.
5. One commit of removes + adds, pinned to the read version when it removes files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.errors import DeltaflowError
from deltaflow.spark import _dml, _file_writer, _replace_where
from deltaflow.spark._merge_builder import (
    BY_SOURCE_KINDS,
    DELETE_KINDS,
    MATCHED_KINDS,
    NOT_MATCHED_KINDS,
    MergeClause,
    MergeSpec,
)
from deltaflow.spark._options import parse_write_options
from deltaflow.spark._writer import WritePlan, plan_write
from deltaflow.spark.errors import MultipleSourceRowMatchingTargetRowError
from deltaflow.table import _commit, _predicates, _schema
from deltaflow.table._snapshot import FileEntry, Snapshot
from deltaflow.table.errors import SchemaMismatchError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("deltaflow.merge")

ROW_ID = "__deltaflow_row_id"
TARGET_MARK = "__deltaflow_target"
SOURCE_MARK = "__deltaflow_source"
ACTION = "__deltaflow_action"
RANK = "__deltaflow_rank"
# Distinct source values of a partition-equality key collected to the driver for file
# pruning; above this the condition alone decides (every file is read).
MAX_PRUNING_VALUES = 1000
COPY = -1  # a target row no clause applies to: written unchanged if its file is rewritten


@dataclass(frozen=True)
class MergeMetrics:
    """What one MERGE did; delta-spark's names in the commit info's ``operationMetrics``."""

    source_rows: int = 0
    inserted: int = 0
    matched_updated: int = 0
    matched_deleted: int = 0
    by_source_updated: int = 0
    by_source_deleted: int = 0
    copied: int = 0
    added_files: int = 0
    removed_files: int = 0
    added_bytes: int = 0
    removed_bytes: int = 0
    execution_time_ms: int = 0
    version: int | None = None  # None: nothing changed, nothing was committed

    def operation_metrics(self) -> dict[str, str]:
        values = {
            "numSourceRows": self.source_rows,
            "numTargetRowsInserted": self.inserted,
            "numTargetRowsUpdated": self.matched_updated + self.by_source_updated,
            "numTargetRowsMatchedUpdated": self.matched_updated,
            "numTargetRowsNotMatchedBySourceUpdated": self.by_source_updated,
            "numTargetRowsDeleted": self.matched_deleted + self.by_source_deleted,
            "numTargetRowsMatchedDeleted": self.matched_deleted,
            "numTargetRowsNotMatchedBySourceDeleted": self.by_source_deleted,
            "numTargetRowsCopied": self.copied,
            "numOutputRows": self.inserted
            + self.matched_updated
            + self.by_source_updated
            + self.copied,
            "numTargetFilesAdded": self.added_files,
            "numTargetFilesRemoved": self.removed_files,
            "numTargetBytesAdded": self.added_bytes,
            "numTargetBytesRemoved": self.removed_bytes,
            "numTargetChangeFilesAdded": 0,
            "executionTimeMs": self.execution_time_ms,
        }
        return {k: str(v) for k, v in values.items()}


@dataclass(frozen=True)
class _FileOutcome:
    max_pairs: int = 0  # joined rows per target row (>1: several source rows matched it)
    max_applied: int = 0  # matched clauses applied per target row
    updated: tuple[int, int] = (0, 0)  # matched, by source
    deleted: tuple[int, int] = (0, 0)
    unchanged: int = 0
    inserted: int = 0

    @property
    def touched(self) -> bool:
        return sum(self.updated) + sum(self.deleted) > 0


def execute(spark: SparkSession, spec: MergeSpec) -> MergeMetrics:
    """Run ``spec``: at most one commit; nothing is committed when nothing changes."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    started = time.perf_counter()
    rewrites = any(c.kind not in NOT_MATCHED_KINDS for c in spec.clauses)
    snapshot, plan = _dml._prepare(spec.uri, "MERGE", rewrites=rewrites)
    struct = StructType.fromJson(_schema.logical_schema(snapshot.schema))
    source = spec.source
    plan, output = _evolve(spec, snapshot, plan, struct, source)
    # Resolved before any job, so a bad assignment fails fast.
    values = [_clause_values(spec, clause, output, source) for clause in spec.clauses]
    files = snapshot.files()
    if not any(c.kind in BY_SOURCE_KINDS for c in spec.clauses):
        # Rows the condition cannot match are "not matched by source": pruning files by
        # the condition is only sound when no such clause exists.
        files = _candidate_files(snapshot, files, spec, source)

    scan = _dml._scan(spark, snapshot, struct, files, spec.target_alias)
    target = scan.withColumn(ROW_ID, F.monotonically_increasing_id()).withColumn(
        TARGET_MARK, F.lit(True)
    )
    marked = source.withColumn(SOURCE_MARK, F.lit(True))
    inserts = any(c.kind in NOT_MATCHED_KINDS for c in spec.clauses)
    how = "full_outer" if inserts else "left_outer"
    joined = target.join(marked, on=_dml._condition_column(spec.condition), how=how)
    joined = joined.withColumn(ACTION, _action_column(spec.clauses))

    outcomes = _outcomes(joined, spec.clauses)
    _check_multiple_matches(spec, outcomes)
    inserted = outcomes.pop(None, _FileOutcome()).inserted
    touched = sorted(i for i, o in outcomes.items() if i is not None and o.touched)
    source_rows = source.count()
    if not touched and not inserted:
        log.info("MERGE into %s changed nothing; nothing to commit", spec.uri)
        return MergeMetrics(source_rows=source_rows)
    _dml._refuse_deletion_vectors(snapshot, [files[i] for i in touched])

    chosen = [outcomes[i] for i in touched]
    metrics = MergeMetrics(
        source_rows=source_rows,
        inserted=inserted,
        matched_updated=sum(o.updated[0] for o in chosen),
        by_source_updated=sum(o.updated[1] for o in chosen),
        matched_deleted=sum(o.deleted[0] for o in chosen),
        by_source_deleted=sum(o.deleted[1] for o in chosen),
        copied=sum(o.unchanged for o in chosen),
    )
    dedupe = any(o.max_pairs > 1 for o in chosen)
    rows = _output_rows(joined, spec, output, touched, values, target, dedupe)
    adds, written = _dml._write(rows, plan)
    expected = int(metrics.operation_metrics()["numOutputRows"])
    if written != expected:
        _file_writer.delete_files(spec.uri, adds)
        raise DeltaflowError(
            f"MERGE into {spec.uri} wrote {written} rows where {expected} were expected: the"
            " source or an expression is not deterministic. Nothing was committed; use a"
            " deterministic source (e.g. write it to a table first).",
            table_uri=spec.uri,
        )
    removed = [files[i] for i in touched]
    metrics = dataclasses.replace(
        metrics,
        added_files=len(adds),
        removed_files=len(removed),
        added_bytes=sum(a.size for a in adds),
        removed_bytes=sum(f.size for f in removed),
    )
    return _commit_merge(snapshot, plan, adds, removed, metrics, spec, started)


def _evolve(
    spec: MergeSpec, snapshot: Snapshot, plan: WritePlan, struct: StructType, source: DataFrame
) -> tuple[WritePlan, StructType]:
    """The write plan and output schema: the table's, plus new source columns with
    schema evolution (added through mergeSchema's metadata commit)."""
    from pyspark.sql.types import StructType

    known = {f.name.lower() for f in struct.fields}
    star = any(c.assignments is None for c in spec.clauses)
    new = [f for f in source.schema.fields if f.name.lower() not in known]
    if not (spec.schema_evolution and star and new):
        return plan, struct
    output = StructType([*struct.fields, *new])
    options = parse_write_options({"path": spec.uri, "mergeSchema": "true"})
    evolved = plan_write(spec.uri, output.jsonValue(), "append", options)
    return dataclasses.replace(evolved, read_version=snapshot.version), output


def _candidate_files(
    snapshot: Snapshot, files: list[FileEntry], spec: MergeSpec, source: DataFrame
) -> list[FileEntry]:
    """Files that may hold matching rows, pruned by the condition's conjuncts that name
    only the target (``t.kind = 'a'``) and by equalities of a target partition column
    with a source column (``t.kind = s.kind``: the source's distinct values)."""
    alias = spec.target_alias
    if not isinstance(spec.condition, str) or alias is None:
        return files
    try:
        node = _predicates.parse(spec.condition, option="condition")
    except DeltaflowError:
        return files
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    pruning = [c for c in _conjuncts(node) if _columns_under(c, alias) is True]
    for conjunct in _conjuncts(node):
        in_list = _source_values(conjunct, alias, partitions, source)
        if in_list is not None:
            pruning.append(in_list)
    if not pruning:
        return files
    combined: Any = pruning[0]
    for c in pruning[1:]:
        combined = _predicates.And(combined, c)
    combined = _dml._strip_alias(combined, alias)

    def may_match(entry: FileEntry) -> bool:
        try:
            return _predicates.may_match(combined, _replace_where._stats_lookup(entry, partitions))
        except (TypeError, ValueError, DeltaflowError):
            return True  # values of another type than the column's: read the file

    kept = [f for f in files if may_match(f)]
    log.info("MERGE into %s: %d of %d files may match", snapshot.uri, len(kept), len(files))
    return kept


def _source_values(
    conjunct: Any, alias: str, partitions: dict[str, str], source: DataFrame
) -> Any | None:
    """``t.p IN (<distinct source values>)`` for ``t.p = s.c`` on a partition column."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    if not isinstance(conjunct, _predicates.Compare) or conjunct.op != "=":
        return None
    sides = [s for s in (conjunct.left, conjunct.right) if isinstance(s, _predicates.Column)]
    if len(sides) != 2:
        return None
    target = [s for s in sides if _columns_under(s, alias) is True]
    other = [s for s in sides if _columns_under(s, alias) is not True]
    if len(target) != 1 or len(other) != 1 or len(target[0].path) != 2:
        return None
    if target[0].path[1].lower() not in partitions:
        return None
    name = ".".join(f"`{part}`" for part in other[0].path)
    try:
        values = source.select(F.col(name)).distinct().limit(MAX_PRUNING_VALUES + 1).collect()
    except AnalysisException:
        return None  # not a source column: no pruning; the join reports real errors
    if len(values) > MAX_PRUNING_VALUES:
        return None
    # NULL never equals anything; no values at all: no target row can match.
    literals = tuple(_predicates.Literal(r[0]) for r in values if r[0] is not None)
    column = target[0]
    if not literals:
        return _predicates.And(_predicates.IsNull(column), _predicates.IsNull(column, True))
    return _predicates.InList(column, literals)


def _conjuncts(node: Any) -> list[Any]:
    if isinstance(node, _predicates.And):
        return [*_conjuncts(node.left), *_conjuncts(node.right)]
    return [node]


def _columns_under(node: Any, alias: str) -> bool | None:
    """True when every column of ``node`` is qualified by ``alias`` (None: no columns)."""
    if isinstance(node, _predicates.Column):
        return len(node.path) > 1 and node.path[0].lower() == alias.lower()
    children: list[Any] = []
    if isinstance(node, tuple):
        children = list(node)
    elif dataclasses.is_dataclass(node) and not isinstance(node, _predicates.Literal):
        children = [getattr(node, f.name) for f in dataclasses.fields(node)]
    found: bool | None = None
    for child in children:
        result = _columns_under(child, alias)
        if result is False:
            return False
        if result is True:
            found = True
    return found


def _action_column(clauses: tuple[MergeClause, ...]) -> Column:
    """The index of the first clause that applies to a joined row; COPY; or NULL (dropped)."""
    from pyspark.sql import functions as F

    def first(kinds: tuple[str, ...], otherwise: Column) -> Column:
        result = otherwise
        for index in reversed(range(len(clauses))):
            clause = clauses[index]
            if clause.kind in kinds:
                condition = _dml._condition_column(clause.condition)
                result = F.when(condition, F.lit(index)).otherwise(result)
        return result

    target, source = F.col(TARGET_MARK).isNotNull(), F.col(SOURCE_MARK).isNotNull()
    none = F.lit(None).cast("int")
    return (
        F.when(target & source, first(MATCHED_KINDS, F.lit(COPY)))
        .when(source, first(NOT_MATCHED_KINDS, none))
        .otherwise(first(BY_SOURCE_KINDS, F.lit(COPY)))
    )


def _outcomes(
    joined: DataFrame, clauses: tuple[MergeClause, ...]
) -> dict[int | None, _FileOutcome]:
    """Job 1: per target file (None: source-only rows) what the clauses do."""
    from pyspark.sql import functions as F

    def of(kinds: tuple[str, ...]) -> Column:
        ids = [i for i, c in enumerate(clauses) if c.kind in kinds]
        hit = F.col(ACTION).isin(ids) if ids else F.lit(False)
        return F.when(hit, 1).otherwise(0)

    per_row = joined.groupBy(_dml.FILE_INDEX, ROW_ID).agg(
        F.count(F.col(TARGET_MARK)).alias("pairs"),
        F.sum(of(MATCHED_KINDS)).alias("applied"),
        F.max(of(("matchedUpdate",))).alias("m_upd"),
        F.max(of(("notMatchedBySourceUpdate",))).alias("s_upd"),
        F.max(of(("matchedDelete",))).alias("m_del"),
        F.max(of(("notMatchedBySourceDelete",))).alias("s_del"),
        F.sum(of(NOT_MATCHED_KINDS)).alias("ins"),
    )
    changed = F.greatest(*[F.col(c) for c in ("m_upd", "s_upd", "m_del", "s_del")])
    rows = (
        per_row.groupBy(_dml.FILE_INDEX)
        .agg(
            F.max("pairs").alias("pairs"),
            F.max("applied").alias("applied"),
            *[F.sum(c).alias(c) for c in ("m_upd", "s_upd", "m_del", "s_del", "ins")],
            F.sum(F.when(F.col(ROW_ID).isNotNull() & (changed == 0), 1).otherwise(0)).alias("same"),
        )
        .collect()
    )
    return {
        r[_dml.FILE_INDEX]: _FileOutcome(
            max_pairs=int(r["pairs"] or 0),
            max_applied=int(r["applied"] or 0),
            updated=(int(r["m_upd"] or 0), int(r["s_upd"] or 0)),
            deleted=(int(r["m_del"] or 0), int(r["s_del"] or 0)),
            unchanged=int(r["same"] or 0),
            inserted=int(r["ins"] or 0),
        )
        for r in rows
    }


def _check_multiple_matches(spec: MergeSpec, outcomes: Mapping[int | None, _FileOutcome]) -> None:
    matched = [c for c in spec.clauses if c.kind in MATCHED_KINDS]
    # delta-spark: several matches are unambiguous when the only matched clause is an
    # unconditional delete; every matched pair deletes the same row.
    if len(matched) == 1 and matched[0].kind == "matchedDelete" and matched[0].condition is None:
        return
    if any(o.max_applied > 1 for o in outcomes.values()):
        raise MultipleSourceRowMatchingTargetRowError(
            f"MERGE into {spec.uri} failed: several source rows matched the same target row"
            " and a WHEN MATCHED clause would modify it, which is ambiguous. Nothing was"
            " committed. Deduplicate the source on the merge keys (e.g. dropDuplicates or a"
            " window keeping the latest row) before merging.",
            table_uri=spec.uri,
        )


def _output_rows(
    joined: DataFrame,
    spec: MergeSpec,
    output: StructType,
    touched: list[int],
    values: list[dict[str, Column]],
    target: DataFrame,
    dedupe: bool,
) -> DataFrame:
    """Job 2's rows: every row of a touched file (copied / updated / deleted) + inserts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    known = {f.name.lower() for f in target.schema.fields}
    deletes = [i for i, c in enumerate(spec.clauses) if c.kind in DELETE_KINDS]
    keep = F.col(ACTION).isNotNull() & ~F.col(ACTION).isin(deletes)
    in_touched = F.col(_dml.FILE_INDEX).isin(touched) if touched else F.lit(False)
    rows = joined.where(keep & (F.col(TARGET_MARK).isNull() | in_touched))
    if dedupe:
        # A target row matched by several source rows none of whose clauses applied
        # appears once per match: write it once.
        order = F.when(F.col(ACTION) == COPY, 1).otherwise(0)
        rank = F.row_number().over(Window.partitionBy(ROW_ID).orderBy(order))
        rows = rows.withColumn(RANK, rank).where(F.col(ROW_ID).isNull() | (F.col(RANK) == 1))

    columns = []
    for field in output.fields:
        old = (
            target[f"`{field.name}`"]
            if field.name.lower() in known
            else F.lit(None).cast(field.dataType)
        )
        value = old
        for index in reversed(range(len(spec.clauses))):
            assigned = values[index].get(field.name)
            if assigned is not None:
                value = F.when(F.col(ACTION) == index, assigned).otherwise(value)
        columns.append(value.cast(field.dataType).alias(field.name))
    return rows.select(*columns)


def _clause_values(
    spec: MergeSpec, clause: MergeClause, output: StructType, source: DataFrame
) -> dict[str, Column]:
    """Output column -> the value ``clause`` gives it (missing: unchanged / NULL)."""
    from pyspark.sql import functions as F

    if clause.kind in DELETE_KINDS:
        return {}
    insert = clause.kind == "notMatchedInsert"
    if clause.assignments is None:
        values: dict[str, Column] = {}
        missing = []
        by_name = {f.name.lower(): f.name for f in source.schema.fields}
        for field in output.fields:
            name = by_name.get(field.name.lower())
            if name is not None:
                values[field.name] = source[f"`{name}`"]
            elif not spec.schema_evolution:
                missing.append(field.name)
        if missing:
            what = "insertAll" if insert else "updateAll"
            raise SchemaMismatchError(
                f"MERGE into {spec.uri}: {what} needs every table column in the source;"
                f" missing: {', '.join(missing)}. Add them to the source, list the columns"
                " with whenMatchedUpdate(set=...) / whenNotMatchedInsert(values=...), or"
                " call withSchemaEvolution().",
                table_uri=spec.uri,
                columns=tuple(missing),
            )
        return values
    resolved = _dml._resolve_assignments(
        spec.uri, output, spec.target_alias, dict(clause.assignments)
    )
    if insert:
        unknown = [f.name for f in output.fields if f.name not in resolved]
        return {**{n: F.lit(None) for n in unknown}, **resolved}
    return resolved


def _commit_merge(
    snapshot: Snapshot,
    plan: WritePlan,
    adds: list[_commit.AddedFile],
    removed: list[FileEntry],
    metrics: MergeMetrics,
    spec: MergeSpec,
    started: float,
) -> MergeMetrics:
    physical = _schema.top_level_physical_names(snapshot.schema)
    removes = [
        _commit.RemovedFile(
            path=f.path,
            size=f.size,
            partition_values=_replace_where.serialized_partition_values(f, physical),
        )
        for f in removed
    ]
    metrics = dataclasses.replace(metrics, execution_time_ms=_dml._ms(started, time.perf_counter()))

    def predicates(kinds: tuple[str, ...]) -> str:
        chosen = [c for c in spec.clauses if c.kind in kinds]
        described = [
            {
                "actionType": c.kind.removeprefix("matched")
                .removeprefix("notMatchedBySource")
                .removeprefix("notMatched")
                .lower(),
                **({} if c.condition is None else {"predicate": _dml.sql_text(c.condition)}),
            }
            for c in chosen
        ]
        return json.dumps(described)

    request = _commit.CommitRequest(
        table_uri=snapshot.uri,
        schema=plan.schema,
        partition_columns=plan.partition_columns,
        adds=adds,
        removes=removes,
        mode="append",
        read_version=snapshot.version,
        new_columns=plan.new_columns,
        commit_info={
            _dml.OPERATION_KEY: "MERGE",
            "operationParameters": {
                "predicate": json.dumps([_dml.sql_text(spec.condition)]),
                "matchedPredicates": predicates(MATCHED_KINDS),
                "notMatchedPredicates": predicates(NOT_MATCHED_KINDS),
                "notMatchedBySourcePredicates": predicates(BY_SOURCE_KINDS),
            },
            "operationMetrics": metrics.operation_metrics(),
            "readVersion": snapshot.version,
            "isBlindAppend": False,
        },
    )
    try:
        result = commit(request)
    except BaseException:
        _file_writer.delete_files(snapshot.uri, adds)
        raise
    log.info("MERGE into %s: version %s, %s", snapshot.uri, result.version, metrics)
    return dataclasses.replace(metrics, version=result.version)


def commit(request: _commit.CommitRequest) -> _commit.CommitResult:
    """The commit step, a seam for tests that interleave a concurrent writer."""
    return _commit.commit(request)
