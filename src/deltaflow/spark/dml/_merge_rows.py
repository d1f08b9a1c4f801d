"""MERGE's row-level plan: the join, the clause each row takes, the rows written.

The Spark side of :mod:`deltaflow.spark.dml._merge` (steps 2 to 4 of its docstring):
the target LEFT OUTER source join with each row's action (the index of the first clause
that applies, :data:`COPY` for none), job 1's per-file aggregate
(:func:`outcomes`), the inserts (:func:`unmatched_source`) and job 2's output rows with
one ``CASE`` per column (:func:`output_rows`). The ``__deltaflow_*`` helper columns
never reach the table or a user's error message: :func:`output_rows` selects the table
columns (and ``_change_type``) only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any

import numpy as np

from deltaflow.spark.dml import _changes, _delete_update, _dv, _generated, _target_scan
from deltaflow.spark.dml._merge_builder import (
    BY_SOURCE_KINDS,
    DELETE_KINDS,
    MATCHED_KINDS,
    NOT_MATCHED_KINDS,
    MergeClause,
    MergeSpec,
)
from deltaflow.table.errors import SchemaMismatchError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

ROW_ID = "__deltaflow_row_id"
TARGET_MARK = "__deltaflow_target"
SOURCE_MARK = "__deltaflow_source"
ACTION = "__deltaflow_action"
SOURCE_ID = "__deltaflow_source_id"
MATCHED_ID = "__deltaflow_matched_id"
RANK = "__deltaflow_rank"
UPDATE_KINDS = ("matchedUpdate", "notMatchedBySourceUpdate")
COPY = -1  # a target row no clause applies to: written unchanged if its file is rewritten


@dataclass(frozen=True)
class FileOutcome:
    max_pairs: int = 0  # joined rows per target row (>1: several source rows matched it)
    max_applied: int = 0  # matched clauses applied per target row
    updated: tuple[int, int] = (0, 0)  # matched, by source
    deleted: tuple[int, int] = (0, 0)
    unchanged: int = 0
    # With deletion vectors: the Parquet row indexes of the rows updated or deleted.
    changed_rows: np.ndarray = dataclass_field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def touched(self) -> bool:
        return sum(self.updated) + sum(self.deleted) > 0


def joined(
    target: DataFrame,
    marked: DataFrame,
    condition: Column,
    clauses: tuple[MergeClause, ...],
    *,
    inner: bool = False,
) -> DataFrame:
    """Target rows joined with the source rows matching them (left outer), and the action.

    Left outer, not full outer: Spark can then broadcast a small source and stream the
    target through a hash join without shuffling it; source rows that match nothing are
    found apart (:func:`unmatched_source`). ``inner``: matched target rows only (job 1
    when the unmatched rows' number comes from the log, see :func:`outcomes`).
    """
    from pyspark.sql import functions as F

    target = target.withColumn(ROW_ID, F.monotonically_increasing_id()).withColumn(
        TARGET_MARK, F.lit(True)
    )
    # The bare condition: a NULL join condition matches nothing already, and wrapping it
    # (coalesce) would hide its equality keys from Spark, turning a hash join into a
    # nested-loop join (10k x 1M rows: minutes instead of seconds).
    joined = target.join(marked, on=condition, how="inner" if inner else "left_outer")
    return joined.withColumn(ACTION, _action_column(clauses))


def _action_column(clauses: tuple[MergeClause, ...]) -> Column:
    """The index of the first clause that applies to a target row; COPY: none applies."""
    from pyspark.sql import functions as F

    return F.when(
        F.col(SOURCE_MARK).isNotNull(), first_clause(clauses, MATCHED_KINDS, F.lit(COPY))
    ).otherwise(first_clause(clauses, BY_SOURCE_KINDS, F.lit(COPY)))


def first_clause(
    clauses: tuple[MergeClause, ...], kinds: tuple[str, ...], otherwise: Column
) -> Column:
    """The index of the first clause of ``kinds`` whose condition is true, else ``otherwise``."""
    from pyspark.sql import functions as F

    result = otherwise
    for index in reversed(range(len(clauses))):
        clause = clauses[index]
        if clause.kind in kinds:
            condition = _delete_update._condition_column(clause.condition)
            result = F.when(condition, F.lit(index)).otherwise(result)
    return result


def per_row(
    joined: DataFrame, clauses: tuple[MergeClause, ...], sources: bool, *, inner: bool = False
) -> DataFrame:
    """Job 1's first step: one row per matched pair, and one per file for its unmatched
    target rows together (those appear once each in a left outer join, so summing them
    is exact): a small aggregate, however big the target. Plain sums and counts keep it
    a hash aggregate (a list of source ids per target row would be a sort-based one).

    ``inner`` (an inner join: matched pairs only, each once): the same columns without
    the aggregate, whose shuffle would group nothing (:func:`outcomes` sums per target
    row either way)."""
    from pyspark.sql import functions as F

    def of(kinds: tuple[str, ...]) -> Column:
        ids = [i for i, c in enumerate(clauses) if c.kind in kinds]
        hit = F.col(ACTION).isin(ids) if ids else F.lit(False)
        return F.when(hit, 1).otherwise(0)

    flags = {
        "applied": of(MATCHED_KINDS),
        "m_upd": of(("matchedUpdate",)),
        "s_upd": of(("notMatchedBySourceUpdate",)),
        "m_del": of(("matchedDelete",)),
        "s_del": of(("notMatchedBySourceDelete",)),
        "chg": of((*UPDATE_KINDS, *DELETE_KINDS)),
    }
    matched = F.col(SOURCE_MARK).isNotNull()
    source_id = F.col(SOURCE_ID) if sources else F.lit(None).cast("long")
    # With deletion vectors the scan carries row indexes: kept per (matched) target row.
    indexed = _dv.ROW_INDEX in joined.columns
    row_index = [F.col(_dv.ROW_INDEX)] if indexed else []
    if inner:
        return joined.select(
            F.col(_target_scan.FILE_INDEX),
            F.col(ROW_ID),
            *row_index,
            source_id.alias(SOURCE_ID),
            F.lit(1).cast("long").alias("n"),
            *[v.cast("long").alias(k) for k, v in flags.items()],
        )
    keys = [F.when(matched, F.col(_dv.ROW_INDEX)).alias(_dv.ROW_INDEX)] if indexed else []
    return joined.groupBy(
        F.col(_target_scan.FILE_INDEX),
        F.when(matched, F.col(ROW_ID)).alias(ROW_ID),
        F.when(matched, source_id).alias(SOURCE_ID),
        *keys,
    ).agg(F.count(F.lit(1)).alias("n"), *[F.sum(v).alias(k) for k, v in flags.items()])


def outcomes(
    pairs: DataFrame, scan: _target_scan.TargetScan, live: Mapping[int, int] | None = None
) -> dict[int, FileOutcome]:
    """Job 1: per target file what the clauses do (from :func:`per_row`'s pairs).

    ``live``: the rows of each candidate file, when the pairs come from an inner join
    (matched target rows only); a file's unmatched rows are then its rows less the
    matched ones, all unchanged (no not-matched-by-source clause may exist then).
    """
    from pyspark.sql import functions as F

    indexed = _dv.ROW_INDEX in pairs.columns
    per_row = pairs.groupBy(F.col(_target_scan.FILE_INDEX), F.col(ROW_ID)).agg(
        *([F.first(_dv.ROW_INDEX).alias(_dv.ROW_INDEX)] if indexed else []),
        F.sum("n").alias("n"),
        *[F.sum(k).alias(k) for k in ("applied", "m_upd", "s_upd", "m_del", "s_del", "chg")],
        F.max("chg").alias("max_chg"),
    )
    single = F.col(ROW_ID).isNotNull()  # one matched target row; else a file's unmatched rows

    def changed(k: str) -> Column:
        # A matched target row counts once, however many of its pairs change it.
        return F.when(single, F.least(F.col(k), F.lit(1))).otherwise(F.col(k))

    rows = (
        per_row.groupBy(_target_scan.FILE_INDEX)
        .agg(
            F.max(F.when(single, F.col("n")).otherwise(F.lit(1))).alias("pairs"),
            F.max("applied").alias("applied"),
            *[F.sum(changed(k)).alias(k) for k in ("m_upd", "s_upd", "m_del", "s_del")],
            F.sum(
                F.when(single, 1 - F.least(F.col("max_chg"), F.lit(1))).otherwise(
                    F.col("n") - F.col("chg")
                )
            ).alias("same"),
            F.sum(F.when(single, 1).otherwise(0)).alias("matched_rows"),
            *(
                [
                    F.collect_list(
                        F.when(single & (F.col("max_chg") > 0), F.col(_dv.ROW_INDEX))
                    ).alias("changed_rows")
                ]
                if indexed
                else []
            ),
        )
        .collect()
    )
    found = {}
    for r in rows:
        index = scan.index(r[_target_scan.FILE_INDEX])
        unmatched = 0 if live is None else live[index] - int(r["matched_rows"] or 0)
        found[index] = FileOutcome(
            max_pairs=int(r["pairs"] or 0),
            max_applied=int(r["applied"] or 0),
            updated=(int(r["m_upd"] or 0), int(r["s_upd"] or 0)),
            deleted=(int(r["m_del"] or 0), int(r["s_del"] or 0)),
            unchanged=int(r["same"] or 0) + unmatched,
            changed_rows=np.asarray(r["changed_rows"] if indexed else [], dtype=np.int64),
        )
    return found


def collect_pairs(pairs: DataFrame, limit: int) -> list[Any] | None:
    """The matched pairs of an inner job 1 (:func:`per_row` with ``inner``), collected
    in one job when at most ``limit``; None when there are more.

    For a small source this replaces :func:`outcomes`' two aggregate stages (and the
    separate count of inserts): :func:`outcomes_of_pairs` sums the pairs on the driver.
    """
    # Spark's limit collects scan a few partitions per job and then more in further
    # jobs; all of them at once is one job.
    settings = {"spark.sql.limit.initialNumPartitions": str(2**30)}  # as _merge_keys
    with _target_scan.session_conf(pairs.sparkSession, settings):
        rows = pairs.limit(limit + 1).collect()
    return rows if len(rows) <= limit else None


def outcomes_of_pairs(
    rows: list[Any], index_of: Callable[[Any], int], live: Mapping[int, int]
) -> tuple[dict[int, FileOutcome], set[int]]:
    """:func:`outcomes` computed on the driver from :func:`collect_pairs`' rows (each a
    matched pair, so every target row here is matched), and the matched source ids."""
    per_row: dict[tuple[Any, Any], list[int]] = {}
    indexes: dict[tuple[Any, Any], Any] = {}
    sources: set[int] = set()
    indexed = bool(rows) and _dv.ROW_INDEX in rows[0].asDict()
    flags = ("applied", "m_upd", "s_upd", "m_del", "s_del", "chg")
    for r in rows:
        key = (r[_target_scan.FILE_INDEX], r[ROW_ID])
        sums = per_row.setdefault(key, [0] * (len(flags) + 2))
        sums[0] += int(r["n"])
        for i, name in enumerate(flags, start=1):
            sums[i] += int(r[name])
        sums[-1] = max(sums[-1], int(r["chg"]))  # max_chg
        if indexed:
            indexes[key] = r[_dv.ROW_INDEX]
        if r[SOURCE_ID] is not None:
            sources.add(int(r[SOURCE_ID]))
    by_file: dict[Any, list[tuple[tuple[Any, Any], list[int]]]] = {}
    for key, sums in per_row.items():
        by_file.setdefault(key[0], []).append((key, sums))
    found = {}
    for file_key, members in by_file.items():
        index = index_of(file_key)

        def total(i: int, members: list[tuple[tuple[Any, Any], list[int]]] = members) -> int:
            return sum(min(sums[i], 1) for _, sums in members)

        changed = [indexes[key] for key, sums in members if indexed and sums[-1] > 0]
        found[index] = FileOutcome(
            max_pairs=max(sums[0] for _, sums in members),
            max_applied=max(sums[1] for _, sums in members),
            updated=(total(2), total(3)),
            deleted=(total(4), total(5)),
            unchanged=sum(1 - min(sums[-1], 1) for _, sums in members) + live[index] - len(members),
            changed_rows=np.asarray(sorted(changed), dtype=np.int64),
        )
    return found, sources


def unmatched_source(
    marked: DataFrame, per_row: DataFrame, clauses: tuple[MergeClause, ...]
) -> DataFrame:
    """Source rows no target row matched and a not-matched clause inserts, with the action."""
    from pyspark.sql import functions as F

    matched = per_row.where(F.col(SOURCE_ID).isNotNull()).select(F.col(SOURCE_ID).alias(MATCHED_ID))
    rows = marked.join(matched, on=F.col(SOURCE_ID) == F.col(MATCHED_ID), how="left_anti")
    rows = rows.withColumn(ACTION, first_clause(clauses, NOT_MATCHED_KINDS, F.lit(None)))
    return rows.where(F.col(ACTION).isNotNull())


def source_counts(marked: DataFrame, inserts: DataFrame) -> tuple[int, int]:
    """The source's rows and the inserts among them, counted in one job."""
    from pyspark.sql import functions as F

    def flags(source: int, insert: int) -> list[Column]:
        return [F.lit(source).alias("source"), F.lit(insert).alias("inserts")]

    both = marked.select(*flags(1, 0)).unionByName(inserts.select(*flags(0, 1)))
    row = both.agg(F.sum("source"), F.sum("inserts")).collect()[0]
    return int(row[0] or 0), int(row[1] or 0)


def output_rows(
    rows: DataFrame,
    spec: MergeSpec,
    output: StructType,
    values: list[dict[str, Column]],
    target: DataFrame | None,
    dedupe: bool,
    changes: bool = False,
    generation: _generated.Generation | None = None,
) -> DataFrame:
    """Job 2's rows: with ``target``, every row of the touched files ``rows`` holds
    (copied / updated / deleted); without, the inserts. With ``changes``, plus change
    rows (``_change_type`` not NULL). Generated columns a clause does not set are
    computed from the row's new values (:mod:`._generated`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    cw = _changes
    kinds = (*MATCHED_KINDS, *BY_SOURCE_KINDS) if target is not None else NOT_MATCHED_KINDS
    clauses = [i for i, c in enumerate(spec.clauses) if c.kind in kinds]
    known = {f.name.lower() for f in target.schema.fields} if target is not None else set()
    deletes = [i for i, c in enumerate(spec.clauses) if c.kind in DELETE_KINDS]
    updates = [i for i, c in enumerate(spec.clauses) if c.kind in UPDATE_KINDS]
    keep = F.col(ACTION).isNotNull()
    if not changes and deletes:
        keep = keep & ~F.col(ACTION).isin(deletes)
    rows = rows.where(keep)
    if dedupe:
        # A target row matched by several source rows none of whose clauses applied
        # appears once per match: write it once.
        order = F.when(F.col(ACTION) == COPY, 1).otherwise(0)
        rank = F.row_number().over(Window.partitionBy(ROW_ID).orderBy(order))
        rows = rows.withColumn(RANK, rank).where(F.col(RANK) == 1)
    keeps_old = F.lit(False)
    if changes:
        none = F.lit(None).cast("string")
        target_row = F.col(TARGET_MARK).isNotNull()
        change_kinds = (
            F.when(target_row & F.col(ACTION).isin(deletes), F.array(F.lit(cw.DELETE)))
            .when(
                target_row & F.col(ACTION).isin(updates),
                F.array(none, F.lit(cw.PREIMAGE), F.lit(cw.POSTIMAGE)),
            )
            .when(target_row, F.array(none))
            .otherwise(F.array(none, F.lit(cw.INSERT)))
        )
        rows = rows.withColumn(cw.CHANGE_TYPE, F.explode(change_kinds))
        keeps_old = F.col(cw.CHANGE_TYPE).isin(cw.PREIMAGE, cw.DELETE)

    columns = []
    for field in output.fields:
        old = (
            target[f"`{field.name}`"]
            if target is not None and field.name.lower() in known
            else F.lit(None).cast(field.dataType)
        )
        value = old
        for index in reversed(clauses):
            assigned = values[index].get(field.name)
            if assigned is not None:
                value = F.when(F.col(ACTION) == index, assigned).otherwise(value)
        if changes:
            value = F.when(keeps_old, old).otherwise(value)
        columns.append(value.cast(field.dataType).alias(field.name))
    if changes:
        columns.append(F.col(cw.CHANGE_TYPE))
    markers = _regenerate_markers(spec, values, clauses, generation, keeps_old)
    if not markers:
        return rows.select(*columns)
    assert generation is not None
    columns.extend(flag.alias(name) for name, flag in markers.values())
    named = {column: name for column, (name, _) in markers.items()}
    return _generated.recomputed(rows.select(*columns), generation, named)


def _regenerate_markers(
    spec: MergeSpec,
    values: list[dict[str, Column]],
    clauses: list[int],
    generation: _generated.Generation | None,
    keeps_old: Column,
) -> dict[str, tuple[str, Column]]:
    """Generated column -> (marker name, marker): true on rows an update or insert
    clause writes without setting the column (pre-images and deleted rows keep theirs)."""
    from pyspark.sql import functions as F

    out: dict[str, tuple[str, Column]] = {}
    for index, column in enumerate(generation.generated if generation else ()):
        writers = [
            i
            for i in clauses
            if spec.clauses[i].kind not in DELETE_KINDS
            and column.name.lower() not in {k.lower() for k in values[i]}
        ]
        if writers:
            flag = F.col(ACTION).isin(writers) & ~F.coalesce(keeps_old, F.lit(False))
            out[column.name] = (_generated.marker(index), F.coalesce(flag, F.lit(False)))
    return out


def clause_values(
    spec: MergeSpec,
    clause: MergeClause,
    output: StructType,
    source: DataFrame,
    generation: _generated.Generation | None = None,
) -> dict[str, Column]:
    """Output column -> the value ``clause`` gives it (missing: unchanged / NULL; a
    generated column: computed, an identity column an insert leaves out: generated)."""
    if clause.kind in DELETE_KINDS:
        return {}
    values = _given_values(spec, clause, output, source, generation)
    if generation is None:
        return values
    if clause.kind == "notMatchedInsert":
        generation.refuse_explicit_inserts(values)
        return {**values, **generation.identity_values(values)}
    generation.refuse_identity_update(values, "MERGE")
    return values


def _given_values(
    spec: MergeSpec,
    clause: MergeClause,
    output: StructType,
    source: DataFrame,
    generation: _generated.Generation | None,
) -> dict[str, Column]:
    from pyspark.sql import functions as F

    implicit = generation.implicit() if generation else frozenset()
    insert = clause.kind == "notMatchedInsert"
    if clause.assignments is None:
        values: dict[str, Column] = {}
        missing = []
        by_name = {f.name.lower(): f.name for f in source.schema.fields}
        for field in output.fields:
            name = by_name.get(field.name.lower())
            if name is not None:
                values[field.name] = source[f"`{name}`"]
            elif not spec.schema_evolution and field.name.lower() not in implicit:
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
    resolved = _delete_update._resolve_assignments(
        spec.uri, output, spec.target_alias, dict(clause.assignments)
    )
    if insert:
        unknown = [
            f.name
            for f in output.fields
            if f.name not in resolved and f.name.lower() not in implicit
        ]
        return {**{n: F.lit(None) for n in unknown}, **resolved}
    return resolved
