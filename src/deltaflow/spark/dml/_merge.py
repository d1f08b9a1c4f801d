"""MERGE as Spark jobs over the files it touches, committed once (delta-spark semantics).

1. The driver pins a snapshot. The source is materialized once (persisted; with
   insert clauses, with a row id per source row), as delta-spark's
   ``merge.materializeSource`` does. Candidate target files are pruned by the conjuncts
   of the merge condition that name only the target (``t.kind = 'a'``) and by its
   equalities of a target column with a source column (``t.id = s.id``: the source's
   key values against each file's min/max stats, :mod:`._merge_keys`), when the
   condition is SQL text the predicate parser reads; otherwise every file.
2. The candidates are read (``_target_scan.scan``: Spark's Parquet scan when it reads them
   exactly, else the Python ``mapInArrow`` scan), each row carrying its file key and a
   row id, and joined with the source: target LEFT OUTER source, so that Spark can
   broadcast a small source and stream the target through a hash join without a
   shuffle.
3. Every joined row gets the index of the first clause that applies (clauses in
   order, NULL conditions do not match): matched or not-matched-by-source (target
   only). Job 1 aggregates the joined rows into one row per matched pair plus one per
   file for its unmatched rows, then per target file: rows updated / deleted / copied,
   and source rows per target row (a target row that more than one source row would
   modify fails with :class:`MultipleSourceRowMatchingTargetRowError`, nothing
   committed). The inserts are the source rows whose id no pair has (an anti join
   against job 1's small aggregate, not the target), kept for job 2. A source of at
   most ``SMALL_SOURCE_ROWS`` rows (counted while pruning) skips the aggregate: job 1
   collects its matched pairs and the driver sums them, and the inserts are the source
   rows whose id is not among the pairs' (no job of their own to count them).
4. Job 2 reads only the touched files again and computes the output rows with one
   ``CASE`` per column: every row of a touched file (copied, updated, or dropped when
   deleted), unioned with the inserts. Files with no updated or deleted row are left as
   they are. Spark's Parquet writer writes them when it can (``_native_write``), Python
   tasks (:class:`FileSetWriter`) otherwise.
   With the change data feed enabled and any target row updated or deleted, the
   same job writes change rows to ``_change_data/`` (``update_preimage`` /
   ``update_postimage`` / ``delete`` / ``insert``, :mod:`._changes`), on the
   Python writer.
5. One commit of removes + adds (+ cdc) against the read version, by deltaflow's
   log writer on local tables, with delta-spark's conflict rules: the files read and
   the condition's target-only / partition conjuncts are the read set, so a
   concurrent blind append never fails a MERGE, a concurrent delete of a file it read
   does (ConcurrentDeleteRead). An insert-only MERGE is checked the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltaflow.errors import DeltaflowError
from deltaflow.spark._options import parse_write_options
from deltaflow.spark.dml import (
    _changes,
    _delete_update,
    _dv,
    _generated,
    _merge_keys,
    _merge_rows,
    _retry,
    _target_scan,
)
from deltaflow.spark.dml._merge_builder import (
    BY_SOURCE_KINDS,
    DELETE_KINDS,
    MATCHED_KINDS,
    NOT_MATCHED_KINDS,
    MergeSpec,
)
from deltaflow.spark.errors import MultipleSourceRowMatchingTargetRowError
from deltaflow.spark.write._plan import WritePlan, plan_write
from deltaflow.table import _commit, _schema
from deltaflow.table._snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("deltaflow.merge")

# A source of at most this many rows (known while pruning by its keys) has job 1's
# matched pairs collected to the driver, at most MAX_COLLECTED_PAIRS of them (more:
# Spark aggregates them as for a large source).
SMALL_SOURCE_ROWS = 10_000
MAX_COLLECTED_PAIRS = 20_000


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
    change_files: int = 0
    execution_time_ms: int = 0
    version: int | None = None  # None: nothing changed, nothing was committed
    dv_metrics: tuple[tuple[str, str], ...] = ()  # deletion vectors, delta-spark's names

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
            "numTargetChangeFilesAdded": self.change_files,
            "executionTimeMs": self.execution_time_ms,
        }
        return {**{k: str(v) for k, v in values.items()}, **dict(self.dv_metrics)}


@dataclass
class _Merge:
    """One MERGE under way: what both jobs and the commit share."""

    spark: SparkSession
    spec: MergeSpec
    snapshot: Snapshot
    plan: WritePlan
    struct: StructType
    output: StructType  # the table's columns after schema evolution
    values: list[dict[str, Column]]  # per clause: column -> the value it assigns
    files: list[FileEntry]  # the candidate target files
    read_node: Any  # the target-only conjuncts the candidates were pruned by
    condition: Column
    inserts: bool  # any not-matched clause
    marked: DataFrame  # the source, marked (and numbered, with inserts)
    cached: list[DataFrame] = field(default_factory=list)
    # Deletion vectors: changed target rows are marked deleted, not their files rewritten
    # (not with not-matched-by-source clauses, whose rows job 1 counts per file only).
    dv: bool = False
    deleted: dict[str, Any] = field(default_factory=dict)  # the snapshot's deleted rows
    # Deletion vectors with an inner job 1: its joined (matched) rows, persisted, and the
    # target scan they came from; job 2 computes the new rows from them, no second scan.
    matched: tuple[DataFrame, DataFrame] | None = None
    # The table's generated and identity columns (computed where clauses leave them out).
    generation: _generated.Generation | None = None
    source_rows: int | None = None  # counted while pruning by the source's keys


@dataclass(frozen=True)
class _Found:
    """Job 1's answer: what the clauses do to each candidate file, and the inserts."""

    outcomes: dict[int, _merge_rows.FileOutcome]
    touched: list[int]  # indexes into _Merge.files of files with a changed row
    new_rows: DataFrame | None
    inserted: int
    source_rows: int


def execute(spark: SparkSession, spec: MergeSpec) -> MergeMetrics:
    """Run ``spec``: at most one commit; nothing is committed when nothing changes. Run
    again when the commit lost only to a compaction (``_retry.run_dml``)."""
    from deltaflow.spark.dml import _merge_native

    def once() -> MergeMetrics:
        # A small source and an exactly expressible MERGE: delta-rs runs it (see
        # _merge_native); otherwise, Spark jobs.
        native = _merge_native.try_merge(spark, spec)
        return native if native is not None else _execute_once(spark, spec)

    return _retry.run_dml(spark, "MERGE", spec.uri, once)


def _execute_once(spark: SparkSession, spec: MergeSpec) -> MergeMetrics:
    started = time.perf_counter()
    merge = _start(spark, spec)
    try:
        found = _job1(merge)
        if not found.touched and not found.inserted:
            log.info("MERGE into %s changed nothing; nothing to commit", spec.uri)
            return MergeMetrics(source_rows=found.source_rows)
        # Only inserts: readers of the change feed take the added files as inserts.
        changes = bool(found.touched) and _changes.cdf_enabled(merge.snapshot)
        chosen = [found.outcomes[i] for i in found.touched]
        metrics = MergeMetrics(
            source_rows=found.source_rows,
            inserted=found.inserted,
            matched_updated=sum(o.updated[0] for o in chosen),
            by_source_updated=sum(o.updated[1] for o in chosen),
            matched_deleted=sum(o.deleted[0] for o in chosen),
            by_source_deleted=sum(o.deleted[1] for o in chosen),
            copied=0 if merge.dv else sum(o.unchanged for o in chosen),
        )
        rows = _job2_rows(merge, found, changes, dedupe=any(o.max_pairs > 1 for o in chosen))
        with _target_scan.balanced_splits(spark, merge.files):
            written = _changes.write(rows, merge.plan, changes=changes)
    finally:
        for df in merge.cached:
            df.unpersist()
    expected = int(metrics.operation_metrics()["numOutputRows"])
    if written.rows != expected:
        written.delete(spec.uri)
        raise DeltaflowError(
            f"MERGE into {spec.uri} wrote {written.rows} rows where {expected} were expected:"
            " the source or an expression is not deterministic. Nothing was committed; use a"
            " deterministic source (e.g. write it to a table first).",
            table_uri=spec.uri,
        )
    snapshot, plan, files, touched = merge.snapshot, merge.plan, merge.files, found.touched
    if merge.dv:
        return _commit_marked(merge, found, written, metrics, started)
    removed = [files[i] for i in touched]
    metrics = dataclasses.replace(
        metrics,
        added_files=len(written.adds),
        removed_files=len(removed),
        added_bytes=sum(a.size for a in written.adds),
        removed_bytes=sum(f.size for f in removed),
        change_files=len(written.cdc),
    )
    read = _changes.read_set(snapshot, files, merge.read_node, whole_table=False)
    return _commit_merge(snapshot, plan, written, removed, metrics, spec, started, read)


def _start(spark: SparkSession, spec: MergeSpec) -> _Merge:
    """Pin the snapshot, evolve the schema, resolve the clauses, pick candidate files."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    rewrites = any(c.kind not in NOT_MATCHED_KINDS for c in spec.clauses)
    snapshot, plan = _delete_update._prepare(spec.uri, "MERGE", rewrites=rewrites)
    struct = StructType.fromJson(_schema.logical_schema(snapshot.schema))
    source = spec.source
    plan, output = _evolve(spec, snapshot, plan, struct, source)
    # Resolved before any job, so a bad assignment fails fast.
    generation = _generated.Generation.of(spec.uri, snapshot.schema)
    values = [
        _merge_rows.clause_values(spec, clause, output, source, generation)
        for clause in spec.clauses
    ]
    _check_resolves(spark, spec, struct)
    files = snapshot.files()
    condition = F.expr(spec.condition) if isinstance(spec.condition, str) else spec.condition
    inserts = any(c.kind in NOT_MATCHED_KINDS for c in spec.clauses)
    marked = source.withColumn(_merge_rows.SOURCE_MARK, F.lit(True))
    if inserts:
        # Inserts are the source rows no target row matched, found by the source row
        # ids job 1 saw matched.
        marked = marked.withColumn(_merge_rows.SOURCE_ID, F.monotonically_increasing_id())
    # The source is materialized once (as delta-spark's merge.materializeSource does),
    # so the key values files are pruned by, its rows and its ids are the same in each job.
    marked.persist(StorageLevel.MEMORY_AND_DISK)
    read_node: Any = None
    keys: _merge_keys.SourceKeys | None = None
    try:
        if not any(c.kind in BY_SOURCE_KINDS for c in spec.clauses):
            # Rows the condition cannot match are "not matched by source": pruning files
            # by the condition is only sound when no such clause exists.
            files, read_node, keys = _merge_keys.candidate_files(
                snapshot, files, spec, struct, marked
            )
        dv = rewrites and _dv.enabled(snapshot)
        dv = dv and not any(c.kind in BY_SOURCE_KINDS for c in spec.clauses)
        deleted = snapshot.deleted_rows() if dv else {}
    except BaseException:
        marked.unpersist()
        raise
    merge = _Merge(
        spark,
        spec,
        snapshot,
        plan,
        struct,
        output,
        values,
        files,
        read_node,
        condition,
        inserts,
        marked,
        dv=dv,
        deleted=deleted,
        generation=generation,
        source_rows=None if keys is None else keys.rows,
    )
    merge.cached.append(marked)
    return merge


def _job1(merge: _Merge) -> _Found:
    """Job 1: what the clauses do per candidate file; the inserts (see the docstring)."""
    from pyspark import StorageLevel

    spec = merge.spec
    live = _live_rows(merge)
    if not merge.files and live is not None and merge.source_rows is not None:
        # The source's keys are in no file: nothing to read, every source row unmatched.
        return _found_on_driver(merge, [], int, live)
    scan = _target_scan.scan(
        merge.spark,
        merge.snapshot,
        merge.struct,
        merge.files,
        spec.target_alias,
        row_index=merge.dv,
        deleted=merge.deleted,
    )
    joined = _merge_rows.joined(
        scan.df, merge.marked, merge.condition, spec.clauses, inner=live is not None
    )
    if merge.dv and live is not None:
        # Only matched target rows leave the probe: keep them (all columns) for job 2,
        # which then writes their new versions without reading the target again.
        joined = joined.persist(StorageLevel.MEMORY_AND_DISK)
        merge.cached.append(joined)
        merge.matched = (joined, scan.df)
    pairs = _merge_rows.per_row(joined, spec.clauses, merge.inserts, inner=live is not None)
    with _target_scan.balanced_splits(merge.spark, merge.files):
        small = live is not None and merge.source_rows is not None
        small = small and (merge.source_rows or 0) <= SMALL_SOURCE_ROWS
        collected = _merge_rows.collect_pairs(pairs, MAX_COLLECTED_PAIRS) if small else None
        if collected is not None and live is not None:
            return _found_on_driver(merge, collected, scan.index, live)
        if merge.inserts:
            merge.cached.append(pairs.persist(StorageLevel.MEMORY_AND_DISK))
        outcomes = _merge_rows.outcomes(pairs, scan, live)
        _check_multiple_matches(spec, outcomes)
        new_rows = None
        if merge.inserts:
            # Not persisted: its inputs (the marked source, the pairs) are, so job 2 sees
            # the same rows; one job counts both the source and the inserts.
            new_rows = _merge_rows.unmatched_source(merge.marked, pairs, spec.clauses)
            source_rows, inserted = _merge_rows.source_counts(merge.marked, new_rows)
        elif merge.source_rows is not None:
            source_rows, inserted = merge.source_rows, 0
        else:
            source_rows, inserted = spec.source.count(), 0
    touched = sorted(i for i, o in outcomes.items() if o.touched)
    return _Found(outcomes, touched, new_rows, inserted, source_rows)


def _found_on_driver(
    merge: _Merge, collected: list[Any], index_of: Callable[[Any], int], live: Mapping[int, int]
) -> _Found:
    """Job 1's answer from its matched pairs collected to the driver (a small source):
    no aggregate stages, and the inserts known without a job of their own when every
    not-matched clause inserts unconditionally."""
    from pyspark.sql import functions as F

    spec = merge.spec
    outcomes, matched = _merge_rows.outcomes_of_pairs(collected, index_of, live)
    _check_multiple_matches(spec, outcomes)
    source_rows = merge.source_rows or 0
    new_rows = None
    inserted = 0
    if merge.inserts:
        ids = F.col(_merge_rows.SOURCE_ID)
        unmatched = merge.marked.where(~ids.isin(sorted(matched))) if matched else merge.marked
        new_rows = unmatched.withColumn(
            _merge_rows.ACTION,
            _merge_rows.first_clause(spec.clauses, NOT_MATCHED_KINDS, F.lit(None)),
        ).where(F.col(_merge_rows.ACTION).isNotNull())
        first = next(c for c in spec.clauses if c.kind in NOT_MATCHED_KINDS)
        # An unconditional first insert clause inserts every unmatched source row.
        unconditional = first.condition is None
        inserted = source_rows - len(matched) if unconditional else new_rows.count()
    touched = sorted(i for i, o in outcomes.items() if o.touched)
    return _Found(outcomes, touched, new_rows, inserted, source_rows)


def _live_rows(merge: _Merge) -> dict[int, int] | None:
    """Rows per candidate file (index -> count) from the log, when job 1 may join
    INNER: no not-matched-by-source clause (unmatched target rows are then copied
    unchanged, so only their number matters) and every file's ``numRecords`` known.

    The inner join keeps only matched target rows after the broadcast probe: job 1
    then aggregates the matches, not every target row (10M rows in ``bench_merge``).
    None: join LEFT OUTER and count unmatched rows in Spark.
    """
    if any(c.kind in BY_SOURCE_KINDS for c in merge.spec.clauses):
        return None
    if any(f.num_records is None for f in merge.files):
        return None
    deleted = merge.snapshot.deleted_rows()  # {} unless deletion vectors are enabled
    return {
        i: (f.num_records or 0) - len(deleted.get(f.path, ())) for i, f in enumerate(merge.files)
    }


def _job2_rows(merge: _Merge, found: _Found, changes: bool, *, dedupe: bool) -> DataFrame:
    """Job 2's rows: every row of the touched files (copied, updated or dropped), and the
    inserts; with ``changes``, the change rows too."""
    from pyspark.sql import functions as F

    spec = merge.spec
    parts = []
    if found.touched:
        rows = (
            _changed_rows(merge, found, changes, dedupe)
            if merge.dv
            else _rewrite_rows(merge, found, changes, dedupe)
        )
        parts.append(rows)
    if found.new_rows is not None and found.inserted:
        inserts = found.new_rows.withColumn(_merge_rows.TARGET_MARK, F.lit(None).cast("boolean"))
        if merge.generation is not None:
            inserts = merge.generation.with_identity_values(inserts)
        parts.append(
            _merge_rows.output_rows(
                inserts, spec, merge.output, merge.values, None, False, changes, merge.generation
            )
        )
    return parts[0] if len(parts) == 1 else parts[0].union(parts[1])


def _changed_rows(merge: _Merge, found: _Found, changes: bool, dedupe: bool) -> DataFrame:
    """With deletion vectors: only the new versions of updated rows (and change rows of
    deleted ones); the old rows are marked deleted, unchanged rows stay where they are."""
    from pyspark.sql import functions as F

    spec = merge.spec
    if merge.matched is not None:
        joined, target = merge.matched
    else:
        touched_files = [merge.files[i] for i in found.touched]
        target = _target_scan.scan(
            merge.spark,
            merge.snapshot,
            merge.struct,
            touched_files,
            spec.target_alias,
            keyed=False,
            row_index=True,
            deleted=merge.deleted,
        ).df
        joined = _merge_rows.joined(target, merge.marked, merge.condition, spec.clauses, inner=True)
    kinds = (*_merge_rows.UPDATE_KINDS, *(DELETE_KINDS if changes else ()))
    chosen = [i for i, c in enumerate(spec.clauses) if c.kind in kinds]
    joined = joined.where(F.col(_merge_rows.ACTION).isin(chosen))
    return _merge_rows.output_rows(
        joined, spec, merge.output, merge.values, target, dedupe, changes, merge.generation
    )


def _rewrite_rows(merge: _Merge, found: _Found, changes: bool, dedupe: bool) -> DataFrame:
    """Every row of the touched files (copied, updated or dropped): job 2 reads only the
    touched files again (the JVM scan reads just those)."""
    spec = merge.spec
    touched_files = [merge.files[i] for i in found.touched]
    rescan = _target_scan.scan(
        merge.spark, merge.snapshot, merge.struct, touched_files, spec.target_alias, keyed=False
    ).df
    joined = _merge_rows.joined(rescan, merge.marked, merge.condition, spec.clauses)
    return _merge_rows.output_rows(
        joined, spec, merge.output, merge.values, rescan, dedupe, changes, merge.generation
    )


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


def _check_resolves(spark: SparkSession, spec: MergeSpec, struct: StructType) -> None:
    """The condition and clauses resolved against the user's columns only (the target's
    and the source's), so that a misspelt name is reported without ours
    (:func:`_delete_update.check_resolves`). Inserts see the source's columns only."""
    from pyspark.sql import functions as F

    target = _delete_update.table_frame(spark, struct, spec.target_alias)
    source = spec.source.limit(0)
    condition = F.expr(spec.condition) if isinstance(spec.condition, str) else spec.condition
    both = target.join(source, on=condition, how="left_outer")
    for clause in spec.clauses:
        frame = source if clause.kind in NOT_MATCHED_KINDS else both
        values = [v for _, v in clause.assignments or ()]
        _delete_update.check_resolves(frame, clause.condition, values)


def _check_multiple_matches(
    spec: MergeSpec, outcomes: Mapping[int, _merge_rows.FileOutcome]
) -> None:
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


def _commit_marked(
    merge: _Merge,
    found: _Found,
    written: _changes.Written,
    metrics: MergeMetrics,
    started: float,
) -> MergeMetrics:
    """The commit of a MERGE with deletion vectors: changed rows marked deleted."""
    matches = {
        i: _dv.FileMatches(
            sum(o.updated) + sum(o.deleted) + o.unchanged, o.changed_rows.astype("int64")
        )
        for i, o in found.outcomes.items()
        if i in set(found.touched)
    }
    try:
        marked = _dv.mark(merge.snapshot, merge.files, matches, merge.deleted)
    except BaseException:
        written.delete(merge.spec.uri)
        raise
    whole = [merge.files[i] for i, m in matches.items() if m.matched >= m.total]
    metrics = dataclasses.replace(
        metrics,
        added_files=len(written.adds),
        removed_files=len(whole),
        added_bytes=sum(a.size for a in written.adds),
        removed_bytes=sum(f.size for f in whole),
        change_files=len(written.cdc),
        dv_metrics=tuple(
            (k.replace("numDeletionVectors", "numTargetDeletionVectors"), v)
            for k, v in marked.operation_metrics().items()
        ),
    )
    read = _changes.read_set(merge.snapshot, merge.files, merge.read_node, whole_table=False)
    return _commit_merge(
        merge.snapshot, merge.plan, written, [], metrics, merge.spec, started, read, marked
    )


def _commit_merge(
    snapshot: Snapshot,
    plan: WritePlan,
    written: _changes.Written,
    removed: list[FileEntry],
    metrics: MergeMetrics,
    spec: MergeSpec,
    started: float,
    read: Any,
    marked: _dv.Marked | None = None,
) -> MergeMetrics:
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
    metrics = dataclasses.replace(
        metrics, execution_time_ms=_delete_update._ms(started, time.perf_counter())
    )

    def predicates(kinds: tuple[str, ...]) -> str:
        chosen = [c for c in spec.clauses if c.kind in kinds]
        described = [
            {
                "actionType": c.kind.removeprefix("matched")
                .removeprefix("notMatchedBySource")
                .removeprefix("notMatched")
                .lower(),
                **(
                    {}
                    if c.condition is None
                    else {"predicate": _delete_update.sql_text(c.condition)}
                ),
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
        cdc=written.cdc,
        mode="append",
        read_version=snapshot.version,
        read=read if _changes.uses_log_writer(snapshot.uri) else None,
        operation="MERGE",
        new_columns=plan.new_columns,
        # Schema evolution of a column-mapped table: new ids and maxColumnId, in this commit.
        evolves_in_commit=plan.evolves_in_commit,
        configuration=plan.configuration,
        # Inserts may hand out identity values: the commit moves the high water marks.
        identity_generated=plan.identity_generated,
        commit_info={
            _delete_update.OPERATION_KEY: "MERGE",
            "operationParameters": {
                "predicate": json.dumps([_delete_update.sql_text(spec.condition)]),
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
        discard()
        raise
    log.info("MERGE into %s: version %s, %s", snapshot.uri, result.version, metrics)
    return dataclasses.replace(metrics, version=result.version)


def commit(request: _commit.CommitRequest) -> _commit.CommitResult:
    """The commit step, a seam for tests that interleave a concurrent writer."""
    return _retry.commit(request)
