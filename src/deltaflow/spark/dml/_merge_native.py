"""The delta-rs MERGE route: a small-source MERGE run by delta-rs in the driver process.

A MERGE as Spark jobs (:mod:`._merge`) scans and rewrites the touched files through
Spark's JVM row pipeline; on a 2-core machine that costs 13-18 s for 100k rows upserted
into a 10M-row table, where delta-rs's native MERGE takes about 2 s. So when a MERGE can
be expressed exactly in delta-rs and its source is small enough to collect, the source
is collected to Arrow on the driver and delta-rs runs the MERGE and commits it; every
other MERGE runs as Spark jobs, which stay the route for large sources.

"Exactly" is checked strictly; anything else falls back to the Spark jobs, silently
(logged at debug level with the reason):

* the route is on: ``spark.deltaflow.merge.nativeMaxSourceRows`` (default
  :data:`DEFAULT_MAX_SOURCE_ROWS`; 0 turns the route off) bounds the source's rows, and
  :data:`MAX_SOURCE_BYTES` its size, estimated by Spark's plan statistics before and
  measured in Arrow after collecting;
* the table uses no feature delta-rs would write differently or that deltaflow's layer
  handles itself: no column mapping, generated or identity columns,
  CHECK constraints, invariants, append-only, clustering, type widening, variant or
  timestamp_ntz columns, NOT NULL columns; the change data feed is fine (delta-rs writes
  the same change rows), and so are deletion vectors (delta-rs's scan applies them and it
  rewrites the touched files whole, where the Spark jobs would write new vectors);
* no schema evolution; both aliases given and distinct; every name a plain identifier;
* every condition and assignment translates exactly (:mod:`._merge_sql`); ``*All``
  clauses find each target column in the source with the same type or one that widens to
  it without loss (INT to BIGINT, FLOAT to DOUBLE...: a CAST, as Spark's MERGE widens);
* the metrics split (matched vs not-matched-by-source) is unambiguous: not both kinds of
  update clause, nor both kinds of delete clause.

delta-rs's own post-commit hooks are off; deltaflow's (checkpoints, log cleanup, auto
compaction) run after its commit, as after any DML commit, and the DML lease and re-run
on a lost compaction race (:mod:`._retry`) apply as on the Spark route. delta-rs checks
conflicts itself; a lost race is a :class:`ConcurrentWriteError`, several source rows
matching one target row a :class:`MultipleSourceRowMatchingTargetRowError`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.spark.dml import _delete_update, _retry
from deltaflow.spark.dml._merge_builder import (
    BY_SOURCE_KINDS,
    MATCHED_KINDS,
    NOT_MATCHED_KINDS,
    MergeClause,
    MergeSpec,
)
from deltaflow.spark.dml._merge_sql import (
    SOURCE,
    TARGET,
    JoinKey,
    Scope,
    Untranslatable,
    key_bounds,
)
from deltaflow.spark.errors import MultipleSourceRowMatchingTargetRowError
from deltaflow.table import _commit, _commit_conflicts, _commit_info, _log, _log_upkeep
from deltaflow.table._protocol import features_in_use
from deltaflow.table._snapshot import Snapshot, load_snapshot
from deltaflow.table.errors import ConcurrentWriteError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from deltaflow.spark.dml._merge import MergeMetrics

log = logging.getLogger("deltaflow.merge")

MAX_SOURCE_ROWS_CONF = "spark.deltaflow.merge.nativeMaxSourceRows"
# 1M source rows collect in about a second and take delta-rs a few hundred MiB: above
# that, the Spark jobs' memory bound (spilling joins) is worth their fixed cost.
DEFAULT_MAX_SOURCE_ROWS = 1_000_000
# The collected source's Arrow size (and Spark's estimate of it before collecting).
MAX_SOURCE_BYTES = 256 * 2**20
# Commit-info key: which clause kinds delta-rs's update / delete counts belong to, so that
# history() can give delta-spark's metric names (delta-rs records its own).
SPLIT_KEY = "deltaflow.mergeMetricsSplit"
PARAMETERS_KEY = _commit_info.HISTORY_PARAMETERS_KEY
# Deletion vectors: delta-rs's MERGE scan applies them, and it rewrites the touched files
# whole (its remove actions carry the old vector), which the protocol allows a writer.
_FEATURES_OK = frozenset({"changeDataFeed", "deletionVectors"})
_READER_FEATURES_OK = frozenset({"deletionVectors"})
_WRITER_FEATURES_OK = frozenset(
    {"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "deletionVectors"}
)
_DELTA_RS_METRICS = {
    "num_source_rows": "numSourceRows",
    "num_target_rows_inserted": "numTargetRowsInserted",
    "num_target_rows_updated": "numTargetRowsUpdated",
    "num_target_rows_deleted": "numTargetRowsDeleted",
    "num_target_rows_copied": "numTargetRowsCopied",
    "num_output_rows": "numOutputRows",
    "num_target_files_added": "numTargetFilesAdded",
    "num_target_files_removed": "numTargetFilesRemoved",
    "execution_time_ms": "executionTimeMs",
    "scan_time_ms": "scanTimeMs",
    "rewrite_time_ms": "rewriteTimeMs",
}


@dataclass(frozen=True)
class _Plan:
    """A MERGE in delta-rs's terms: DataFusion SQL over aliases ``t`` and ``s``."""

    snapshot: Snapshot
    predicate: str
    keys: tuple[JoinKey, ...]  # ON clause keys rewritten null-safe, bounded in _run
    clauses: tuple[tuple[str, str | None, dict[str, str] | None], ...]
    updated_by: str  # "matched", "notMatchedBySource" or "" (no update clause)
    deleted_by: str


def try_merge(spark: SparkSession, spec: MergeSpec) -> MergeMetrics | None:
    """Run ``spec`` through delta-rs when it qualifies; None: run it as Spark jobs."""
    started = time.perf_counter()
    limit = max_source_rows(spark)
    if limit <= 0:
        return None
    try:
        plan = _plan(spark, spec)
        source = _collect(spec.source, limit)
    except Untranslatable as exc:
        log.debug("MERGE into %s runs as Spark jobs: %s", spec.uri, exc)
        return None
    return _run(spec, plan, source, started)


def max_source_rows(spark: SparkSession) -> int:
    text = spark.conf.get(MAX_SOURCE_ROWS_CONF, None)
    try:
        return DEFAULT_MAX_SOURCE_ROWS if text is None else int(text)
    except ValueError:
        return DEFAULT_MAX_SOURCE_ROWS


def _plan(spark: SparkSession, spec: MergeSpec) -> _Plan:
    from deltaflow.spark.dml import _merge_sql
    from deltaflow.table import _schema

    if spec.schema_evolution:
        raise Untranslatable("schema evolution")
    target_alias, source_alias = spec.target_alias, _source_alias(spec.source)
    if not target_alias or not source_alias or target_alias.lower() == source_alias.lower():
        raise Untranslatable("the target and the source need distinct aliases")
    snapshot = load_snapshot(spec.uri)
    _check_table(snapshot)
    from pyspark.sql.types import StructType

    target = _merge_sql.columns_of(
        StructType.fromJson(_schema.logical_schema(snapshot.schema)).fields
    )
    source = _merge_sql.columns_of(spec.source.schema.fields)
    t_side = (target_alias.lower(), (TARGET, target))
    s_side = (source_alias.lower(), (SOURCE, source))
    both = Scope(dict([t_side, s_side]))
    scopes = {
        **dict.fromkeys(MATCHED_KINDS, both),
        **dict.fromkeys(NOT_MATCHED_KINDS, Scope(dict([s_side]))),
        **dict.fromkeys(BY_SOURCE_KINDS, Scope(dict([t_side]))),
    }
    predicate, keys = _merge_sql.join_condition(spark, spec.condition, both)
    clauses = []
    for clause in spec.clauses:
        scope = scopes[clause.kind]
        cond = None
        if clause.condition is not None:
            cond = _merge_sql.condition(spark, clause.condition, scope)
        updates = _assignments(spark, clause, scope, target, source, target_alias)
        clauses.append((clause.kind, cond, updates))
    kinds: set[str] = {c.kind for c in spec.clauses}
    updated_by = _split(kinds, "matchedUpdate", "notMatchedBySourceUpdate", "updates")
    deleted_by = _split(kinds, "matchedDelete", "notMatchedBySourceDelete", "deletes")
    return _Plan(snapshot, predicate, keys, tuple(clauses), updated_by, deleted_by)


def _source_alias(source: DataFrame) -> str | None:
    try:
        plan = source._jdf.logicalPlan()
        if plan.getClass().getSimpleName() != "SubqueryAlias":
            return None
        return str(plan.alias())
    except Exception:  # not a classic DataFrame
        return None


def _check_table(snapshot: Snapshot) -> None:
    used = features_in_use(snapshot.configuration, snapshot.schema)
    if used - _FEATURES_OK:
        raise Untranslatable(f"the table uses {sorted(used - _FEATURES_OK)}")
    unsupported = (set(snapshot.reader_features) - _READER_FEATURES_OK) | (
        set(snapshot.writer_features) - _WRITER_FEATURES_OK
    )
    if unsupported:
        raise Untranslatable(f"table features {sorted(unsupported)}")
    if snapshot.column_mapping_mode != "none" or (
        snapshot.min_reader_version == 2  # reader v2 is column mapping's
    ):
        raise Untranslatable("column mapping")
    if any(not f.get("nullable", True) for f in snapshot.schema.get("fields", [])):
        raise Untranslatable("a NOT NULL column")
    lowered = {k.lower() for k in snapshot.configuration}
    if any(k.startswith("delta.constraints.") for k in lowered):
        raise Untranslatable("CHECK constraints")


def _assignments(
    spark: SparkSession,
    clause: MergeClause,
    scope: Scope,
    target: Mapping[str, tuple[str, str]],
    source: Mapping[str, tuple[str, str]],
    target_alias: str,
) -> dict[str, str] | None:
    """delta-rs's ``updates`` of an update or insert clause (target column -> SQL)."""
    from deltaflow.spark.dml import _merge_sql

    if clause.kind not in ("matchedUpdate", "notMatchedInsert", "notMatchedBySourceUpdate"):
        return None
    out: dict[str, str] = {}
    if clause.assignments is None:  # *All: each target column from the source's by name
        for key, (name, spark_type) in target.items():
            found = source.get(key)
            cast = None
            if found is not None:
                cast = _merge_sql.widened(f'"{SOURCE}"."{found[0]}"', found[1], spark_type)
            if cast is None:
                raise Untranslatable(f"*All: the source has no {spark_type} column {name!r}")
            out[name] = cast
        return out
    for key, value in clause.assignments:
        # Assigned columns are the target's, named with its alias or without one.
        parts = key.replace("`", "").split(".")
        if len(parts) == 2 and parts[0].lower() == target_alias.lower():
            parts = parts[1:]
        found = target.get(parts[0].lower()) if len(parts) == 1 else None
        if found is None or found[0] in out:
            raise Untranslatable(f"assignment to {key!r}")
        out[found[0]] = _merge_sql.value(spark, value, scope, found[1])
    return out


def _split(kinds: set[str], matched: str, by_source: str, what: str) -> str:
    if matched in kinds and by_source in kinds:
        raise Untranslatable(f"both matched and not-matched-by-source {what}")
    return "matched" if matched in kinds else ("notMatchedBySource" if by_source in kinds else "")


def _collect(source: DataFrame, limit: int) -> pa.Table:
    """The source as Arrow, or Untranslatable when it is over the limits."""
    table = _parquet_files_read_directly(source, limit)
    if table is None:
        try:
            estimate = int(source._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
        except Exception:
            estimate = 0
        # Spark's estimate is Long.MaxValue when it knows nothing (a local or RDD source):
        # the bounded collect below decides then.
        if 4 * MAX_SOURCE_BYTES < estimate < 2**62:  # Arrow is larger than compressed Parquet
            raise Untranslatable(f"a source estimated at {estimate} bytes")
        table = source.limit(limit + 1).toArrow()
    if table.num_rows > limit or table.nbytes > MAX_SOURCE_BYTES:
        raise Untranslatable(f"a source of over {limit} rows or {MAX_SOURCE_BYTES} bytes")
    return table


def _parquet_files_read_directly(source: DataFrame, limit: int) -> pa.Table | None:
    """A source that is a plain ``spark.read.parquet(path)`` (aliased, nothing else) read
    from its local files with pyarrow, or None to collect it through Spark.

    Collecting through Spark is a Spark job, and a fresh session's first one costs seconds
    (scheduling, code generation, JIT); pyarrow reads the same files in the driver. Taken
    only where pyarrow gives exactly Spark's rows: local files, no partition columns or
    read options, no Spark-legacy calendar files, and per file the same column names and
    Spark types as the DataFrame (nothing Spark would convert, such as timestamps)."""
    import pyarrow.parquet as pq

    from deltaflow.spark._compat import from_arrow_schema

    try:
        files = _plain_parquet_files(source)
    except Exception:  # not a classic DataFrame, or Spark's classes changed
        return None
    if not files:
        return None
    wanted = [(f.name, f.dataType) for f in source.schema.fields]
    if any(t.typeName() not in _DIRECT_TYPES for _, t in wanted):
        return None
    try:
        footers = [pq.ParquetFile(f) for f in files]
        if sum(p.metadata.num_rows for p in footers) > limit:
            raise Untranslatable(f"a source of over {limit} rows")
        size = sum(
            p.metadata.row_group(i).total_byte_size
            for p in footers
            for i in range(p.metadata.num_row_groups)
        )
        if size > MAX_SOURCE_BYTES:  # uncompressed: close to its Arrow size
            raise Untranslatable(f"a source of over {MAX_SOURCE_BYTES} bytes")
        parts = []
        for parquet in footers:
            meta = parquet.schema_arrow.metadata or {}
            if any(k.startswith(b"org.apache.spark.legacy") for k in meta):
                return None
            part = parquet.read()
            got = [(f.name, f.dataType) for f in from_arrow_schema(part.schema).fields]
            if got != wanted:
                return None
            parts.append(part.replace_schema_metadata(None))
    except (OSError, ValueError, TypeError, NotImplementedError) as exc:
        log.debug("the MERGE source is collected through Spark: %s", exc)
        return None
    import pyarrow as pa

    return pa.concat_tables(parts)


# Spark types pyarrow reads from Parquet exactly as Spark does (no time zone, no rebase).
_DIRECT_TYPES = frozenset(
    {"byte", "short", "integer", "long", "float", "double", "string", "boolean", "binary"}
    | {"decimal", "date"}
)


def _plain_parquet_files(source: DataFrame) -> list[str] | None:
    """The local paths of the files behind a bare Parquet relation, else None."""
    from urllib.parse import unquote, urlparse

    plan = source._jdf.queryExecution().analyzed()
    # Aliases, a view (SQL's ``USING src``: a temporary view over the files) and a
    # projection of every column in order change names only, never rows.
    while _renames_only(plan):
        plan = plan.child()
    if plan.getClass().getSimpleName() != "LogicalRelation":
        return None
    relation = plan.relation()
    if (
        relation.getClass().getSimpleName() != "HadoopFsRelation"
        or relation.fileFormat().getClass().getSimpleName() != "ParquetFileFormat"
        or relation.partitionSchema().length() > 0
        or relation.bucketSpec().isDefined()
    ):
        return None
    keys = str(relation.options().keys().mkString("\u0001")).lower().split("\u0001")
    if set(keys) - {"", "path", "paths"}:
        return None
    paths = []
    for uri in relation.location().inputFiles():
        parsed = urlparse(str(uri))
        if parsed.scheme != "file":
            return None
        paths.append(unquote(parsed.path))
    return paths


def _renames_only(plan: Any) -> bool:
    kind = plan.getClass().getSimpleName()
    if kind in ("SubqueryAlias", "View"):
        return True
    if kind != "Project":
        return False
    names = [str(a.exprId().id()) for a in _seq(plan.projectList())]
    child = [str(a.exprId().id()) for a in _seq(plan.child().output())]
    return names == child


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.length())]


def _run(spec: MergeSpec, plan: _Plan, source: pa.Table, started: float) -> MergeMetrics | None:
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError, DeltaError

    snapshot = plan.snapshot
    table = snapshot.delta_table  # at the version the route's checks read
    info = {
        _delete_update.OPERATION_KEY: "MERGE",
        PARAMETERS_KEY: operation_parameters(spec),
        SPLIT_KEY: f"{plan.updated_by},{plan.deleted_by}",
    }
    merger = table.merge(
        source,
        plan.predicate + key_bounds(plan.keys, source),
        source_alias=SOURCE,
        target_alias=TARGET,
        # The source is in memory: delta-rs may read its key ranges to skip target files.
        streamed_exec=False,
        commit_properties=CommitProperties(custom_metadata=info),  # type: ignore[arg-type]
        post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
    )
    builders = {
        "matchedUpdate": lambda c, u: merger.when_matched_update(u, c),
        "matchedDelete": lambda c, u: merger.when_matched_delete(c),
        "notMatchedInsert": lambda c, u: merger.when_not_matched_insert(u, c),
        "notMatchedBySourceUpdate": lambda c, u: merger.when_not_matched_by_source_update(u, c),
        "notMatchedBySourceDelete": lambda c, u: merger.when_not_matched_by_source_delete(c),
    }
    for kind, cond, updates in plan.clauses:
        merger = builders[kind](cond, updates)
    try:
        result = merger.execute()
    except CommitFailedError as exc:
        kind = _commit_conflicts.conflict_kind(str(exc))
        raise ConcurrentWriteError(
            f"MERGE into {spec.uri} conflicted with a concurrent writer ({kind}): {exc}."
            " Nothing was committed; retry the MERGE on the current version of the table.",
            table_uri=spec.uri,
            kind=kind,
            read_version=snapshot.version,
            attempts=1,
        ) from exc
    except DeltaError as exc:
        if "multiple source rows" in str(exc).lower():
            raise MultipleSourceRowMatchingTargetRowError(
                f"MERGE into {spec.uri} failed: several source rows matched the same target"
                " row and a WHEN MATCHED clause would modify it, which is ambiguous. Nothing"
                " was committed. Deduplicate the source on the merge keys (e.g."
                " dropDuplicates or a window keeping the latest row) before merging.",
                table_uri=spec.uri,
            ) from exc
        # Anything else failed before a commit (e.g. DataFusion refused a plan): nothing
        # was committed, and the Spark jobs give Spark's answer.
        log.warning(
            "MERGE into %s by delta-rs failed (%s); running it as Spark jobs", spec.uri, exc
        )
        return None
    return _finish(spec, plan, table, result, started)


def _finish(
    spec: MergeSpec, plan: _Plan, table: Any, result: Mapping[str, Any], started: float
) -> MergeMetrics:
    """The metrics, and deltaflow's post-commit hooks when delta-rs committed."""
    from deltaflow.spark.dml._merge import MergeMetrics

    updated, deleted = (
        int(result["num_target_rows_updated"]),
        int(result["num_target_rows_deleted"]),
    )
    metrics = MergeMetrics(
        source_rows=int(result["num_source_rows"]),
        inserted=int(result["num_target_rows_inserted"]),
        matched_updated=updated if plan.updated_by == "matched" else 0,
        by_source_updated=updated if plan.updated_by == "notMatchedBySource" else 0,
        matched_deleted=deleted if plan.deleted_by == "matched" else 0,
        by_source_deleted=deleted if plan.deleted_by == "notMatchedBySource" else 0,
        copied=int(result["num_target_rows_copied"]),
        execution_time_ms=_delete_update._ms(started, time.perf_counter()),
    )
    version = int(table.version())
    if version == plan.snapshot.version:
        log.info("MERGE into %s changed nothing; nothing to commit", spec.uri)
        return metrics
    actions = [a for _, a in _log.read_commit(spec.uri, version) or []]
    adds = [a["add"] for a in actions if "add" in a]
    request = _commit.CommitRequest(
        table_uri=spec.uri,
        schema=plan.snapshot.schema,
        partition_columns=plan.snapshot.partition_columns,
        adds=[
            _commit.AddedFile(
                a["path"], int(a.get("size") or 0), dict(a.get("partitionValues") or {}), 0, ""
            )
            for a in adds
        ],
        read_version=plan.snapshot.version,
        operation="MERGE",
        storage_options=plan.snapshot.storage_options,
        table=table,
    )
    _retry.committed_elsewhere(request, _commit.CommitResult(version, False, len(adds)))
    files = _file_metrics(actions)
    metrics = dataclasses.replace(
        metrics,
        added_files=files["numTargetFilesAdded"],
        removed_files=files["numTargetFilesRemoved"],
        added_bytes=files["numTargetBytesAdded"],
        removed_bytes=files["numTargetBytesRemoved"],
        change_files=files["numTargetChangeFilesAdded"],
        version=version,
    )
    log.info("MERGE into %s by delta-rs: version %s, %s", spec.uri, version, metrics)
    return metrics


def operation_parameters(spec: MergeSpec) -> dict[str, str]:
    """delta-spark's MERGE ``operationParameters`` (as the Spark route writes them)."""

    def described(kinds: tuple[str, ...]) -> str:
        out = []
        for c in spec.clauses:
            if c.kind not in kinds:
                continue
            action = c.kind.removeprefix("notMatchedBySource").removeprefix("notMatched")
            item = {"actionType": action.removeprefix("matched").lower()}
            if c.condition is not None:
                item["predicate"] = _delete_update.sql_text(c.condition)
            out.append(item)
        return json.dumps(out)

    return {
        "predicate": json.dumps([_delete_update.sql_text(spec.condition)]),
        "matchedPredicates": described(MATCHED_KINDS),
        "notMatchedPredicates": described(NOT_MATCHED_KINDS),
        "notMatchedBySourcePredicates": described(BY_SOURCE_KINDS),
    }


def history_metrics(commit: Mapping[str, Any], uri: str) -> dict[str, str] | None:
    """delta-spark's MERGE metrics of a commit delta-rs wrote on this route (delta-rs
    records its own names, and no byte counts: those come from the commit's actions);
    None when the commit is not one."""
    split = commit.get(SPLIT_KEY)
    raw = commit.get("operationMetrics")
    if not isinstance(split, str) or not isinstance(raw, dict):
        return None
    updated_by, _, deleted_by = split.partition(",")
    out: dict[str, Any] = {
        _DELTA_RS_METRICS[k]: v for k, v in raw.items() if k in _DELTA_RS_METRICS
    }
    for total, by, prefix in (
        ("numTargetRowsUpdated", updated_by, "Updated"),
        ("numTargetRowsDeleted", deleted_by, "Deleted"),
    ):
        value = out.get(total, 0)
        out[f"numTargetRowsMatched{prefix}"] = value if by == "matched" else 0
        out[f"numTargetRowsNotMatchedBySource{prefix}"] = value if by == "notMatchedBySource" else 0
    version = commit.get("version")
    actions = _log.read_commit(uri, int(version)) if isinstance(version, int) else None
    if actions is not None:
        out.update(_file_metrics([a for _, a in actions]))
    return {k: str(v) for k, v in out.items()}


def _file_metrics(actions: list[dict[str, Any]]) -> dict[str, int]:
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    return {
        "numTargetFilesAdded": len(adds),
        "numTargetFilesRemoved": len(removes),
        "numTargetBytesAdded": sum(int(a.get("size") or 0) for a in adds),
        "numTargetBytesRemoved": sum(int(r.get("size") or 0) for r in removes),
        "numTargetChangeFilesAdded": sum(1 for a in actions if "cdc" in a),
    }


def history_parameters(commit: Mapping[str, Any]) -> dict[str, Any] | None:
    """delta-spark's operationParameters a delta-rs commit recorded beside its own (the
    MERGE route, a replaceWhere overwrite); None when it recorded none."""
    params = commit.get(PARAMETERS_KEY)
    return dict(params) if isinstance(params, dict) else None
