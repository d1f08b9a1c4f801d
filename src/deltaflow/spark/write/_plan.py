"""Planning a write, on the driver before any data moves: the table's schema after it
(enforcement, ``mergeSchema``, ``overwriteSchema``), partitioning, mode, the rows' checks,
and refusals of bad input, typed. :func:`plan_write` makes the :class:`WritePlan` every
write path (batch, stream, DML, the connector's JVM writer through the bridge) writes and
commits by.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from deltaflow.errors import InvalidOptionError
from deltaflow.spark._options import OPTIMIZE_WRITE_PROPERTY, WriteOptions
from deltaflow.spark.write import _generated, _replace_where
from deltaflow.table import _commit, _constraints, _log_write, _schema, _stats
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import Snapshot, load_snapshot, table_exists
from deltaflow.table.errors import (
    SchemaMismatchError,
    TableAlreadyExistsError,
    UnsupportedFeatureError,
)

SUPPORTED_WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        # Every write path checks the rows (table/_constraints.py): the connector in Spark,
        # the Python writer in Arrow, DML in Spark.
        "checkConstraints",
        "changeDataFeed",
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "domainMetadata",
        # Clustered tables: commits go through deltaflow's log writer (_clustered_commit).
        "clustering",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "typeWidening",
        "typeWidening-preview",
        # delta-rs lists variantType on every table-features protocol it creates (e.g. for
        # deletion vectors). Spark cannot hand us variant columns to write, so a table
        # with this feature is safe to write as long as it has none; conform() would fail
        # on one rather than write it wrongly.
        "variantType",
        # The connector computes and checks them (spark/write/_generated.py); commits to
        # identity tables move the high water mark (table/_generated_log.py).
        "generatedColumns",
        "identityColumns",
    }
)


@dataclass(frozen=True)
class WritePlan:
    table_uri: str
    mode: str  # "append" | "overwrite" | "error" | "ignore"
    schema: dict[str, Any]  # the table schema after this write (logical, Delta JSON)
    physical_schema: dict[str, Any]
    partition_columns: tuple[str, ...]
    read_version: int | None
    new_columns: tuple[dict[str, Any], ...]
    configuration: dict[str, str]
    num_indexed_cols: int
    options: WriteOptions
    column_mapping: bool = False
    skip: bool = False  # mode "ignore" on an existing table, or a duplicate app transaction
    partition_physical: dict[str, str] = field(default_factory=dict)
    replace_where: str | None = None  # only with mode "overwrite"
    # What every row written must hold (NOT NULL columns, CHECK constraints); verified:
    # the connector checked the rows already (the Python writer need not).
    checks: tuple[_constraints.RowCheck, ...] = ()
    checks_verified: bool = False
    # Overwrite only the partitions the written rows fall in (partitionOverwriteMode).
    dynamic_overwrite: bool = False
    # Identity columns whose values this write generates (their high water marks move).
    identity_generated: tuple[str, ...] = ()
    # The table's schema as the log has it (identity metadata included), when it exists.
    log_schema: dict[str, Any] | None = None
    # Shuffle the rows by partition before writing (delta.autoOptimize.optimizeWrite).
    optimize_write: bool = False
    # The save mode the caller asked for, when ``mode`` differs (a new table's "error").
    save_mode: str | None = None
    # REPLACE / CREATE OR REPLACE TABLE ... AS SELECT (writeTo().replace()) of an existing
    # table: ``configuration`` is the table's whole new configuration, committed in new
    # metadata beside the data (history kept, the protocol only ever upgraded).
    replace_table: bool = False
    # mergeSchema added fields inside struct columns, or columns to a column-mapped table:
    # ``schema`` (new columns too) and ``configuration`` (a raised maxColumnId) are
    # committed beside the data by the log writer, in one commit.
    evolves_in_commit: bool = False
    # overwriteSchema with other partition columns than the table's: the new schema and
    # partitioning are committed beside the data by the log writer, in one commit.
    repartitions: bool = False


def should_optimize_write(options: WriteOptions, configuration: Mapping[str, str | None]) -> bool:
    """delta-spark's precedence: the ``optimizeWrite`` write option, then the session's
    ``spark.databricks.delta.optimizeWrite.enabled`` (both in ``options``), then the table's
    ``delta.autoOptimize.optimizeWrite``."""
    if options.optimize_write is not None:
        return options.optimize_write
    value = next(
        (v for k, v in configuration.items() if k.lower() == OPTIMIZE_WRITE_PROPERTY.lower()), None
    )
    return (value or "").strip().lower() == "true"


def all_nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (Delta's JSON) with every field, element and value nullable: what a
    write makes of the data's schema, as delta-spark's writes do."""
    out = copy.deepcopy(schema)

    def visit(t: Any) -> None:
        if isinstance(t, dict):
            if t.get("type") == "struct":
                for f in t["fields"]:
                    f["nullable"] = True
                    visit(f["type"])
            elif t.get("type") == "array":
                t["containsNull"] = True
                visit(t["elementType"])
            elif t.get("type") == "map":
                t["valueContainsNull"] = True
                visit(t["keyType"])
                visit(t["valueType"])

    visit(out)
    return out


def arrow_schema(schema: dict[str, Any]) -> pa.Schema:
    """The Arrow schema Spark hands batches of a Delta (logical) schema in."""
    from deltaflow.spark._compat import to_arrow_schema

    return to_arrow_schema(StructType.fromJson(_schema.logical_schema(schema)))


def plan_write(
    uri: str,
    incoming: dict[str, Any],
    mode: str,
    options: WriteOptions,
    current: Snapshot | None = None,
) -> WritePlan:
    """Decide schema, partitioning and mode for writing ``incoming`` to ``uri``.

    Runs on the driver twice per save: in ``write._save`` (so errors reach the
    caller typed and skipped writes start no job) and when Spark plans the job.
    ``current``: the table's latest snapshot when the caller has it loaded already.
    """
    replace_where = options.replace_where if mode == "overwrite" else None
    exists = current is not None or table_exists(uri)
    if not exists:
        return _plan_new_table(uri, incoming, mode, options, replace_where)
    if mode == "error":
        raise TableAlreadyExistsError(
            f"Table {uri} already exists and the save mode is 'error'. Use mode('append') to add"
            " rows or mode('overwrite') to replace them.",
            table_uri=uri,
        )
    snapshot = current or load_snapshot(uri)
    _check_writer_features(snapshot.uri, snapshot.writer_features)
    # (Asked only with an app transaction: a caller's snapshot may have no delta-rs table
    # behind it, a real-time sink's log head's, and would load one.)
    if options.txn_app_id is not None and _commit.already_committed(
        snapshot.delta_table, options.txn_app_id, options.txn_version
    ):
        # A retry of a write that already committed: nothing to check, nothing to do.
        return _skipped_plan(snapshot, options)
    # delta-spark ignores overwriteSchema beside replaceWhere: the rows kept outside the
    # predicate need the table's schema, so the write is checked against it.
    replace_schema = mode == "overwrite" and options.overwrite_schema and replace_where is None
    if mode == "overwrite" and snapshot.configuration.get("delta.appendOnly") == "true":
        raise UnsupportedFeatureError(
            f"Table {uri} is append-only (delta.appendOnly=true): overwrite is not allowed.",
            table_uri=uri,
            feature="appendOnly",
        )
    partitions = snapshot.partition_columns
    replacing = _replaces_metadata(uri, snapshot, mode, options)
    # A replaced table's properties are the statement's: its checks, statistics and
    # write settings come from them, not from the table being replaced.
    properties: dict[str, str | None] = (
        dict(options.table_properties) if replacing else snapshot.configuration
    )
    if replace_schema:
        _refuse_mapped_replace(uri, snapshot, options)
        schema, partitions = _replaced_schema(uri, incoming, options)
        evolution = _Evolution(schema)
    else:
        evolution = _checked_schema(uri, snapshot, incoming, options)
    schema = evolution.schema
    if replace_where is not None:
        _replace_where.validate(
            uri, replace_where, arrow_schema(schema), tuple(partitions), snapshot.configuration
        )
    repartitions = [p.lower() for p in partitions] != [
        p.lower() for p in snapshot.partition_columns
    ]
    if repartitions:
        _require_log_writer(uri, snapshot, partitions)
    column_mapping = snapshot.column_mapping_mode != "none" and not replace_schema
    physical = _schema.physical_schema(schema) if column_mapping else _schema.logical_schema(schema)
    physical_names = _schema.top_level_physical_names(schema) if column_mapping else {}
    checks = tuple(_constraints.table_checks(_schema.logical_schema(schema), properties))
    return WritePlan(
        table_uri=uri,
        mode="append" if mode == "ignore" else mode,
        schema=_schema.logical_schema(schema) if not column_mapping else schema,
        physical_schema=physical,
        partition_columns=tuple(partitions),
        read_version=snapshot.version,
        new_columns=evolution.new_columns,
        evolves_in_commit=evolution.in_commit,
        configuration=dict(options.table_properties) if replacing else evolution.configuration,
        num_indexed_cols=_stats.num_indexed_cols(properties),
        options=options,
        optimize_write=should_optimize_write(options, properties),
        replace_table=replacing,
        repartitions=repartitions,
        column_mapping=column_mapping,
        skip=mode == "ignore",
        partition_physical={p: physical_names.get(p, p) for p in partitions},
        replace_where=replace_where,
        checks=checks,
        checks_verified=bool(checks)
        and options.checked_constraints == _constraints.fingerprint(checks),
        dynamic_overwrite=(
            mode == "overwrite"
            and options.partition_overwrite_mode == "dynamic"
            and bool(partitions)
            and not replace_schema
        ),
        identity_generated=(
            ()
            if replace_schema
            else options.identity_generated or _generated.identity_generated(snapshot.schema)
        ),
        log_schema=None if replace_schema else snapshot.schema,
    )


def _replaces_metadata(uri: str, snapshot: Snapshot, mode: str, options: WriteOptions) -> bool:
    """Whether this write replaces the table's metadata: REPLACE / CREATE OR REPLACE TABLE
    ... AS SELECT and ``writeTo().replace()`` / ``createOrReplace()`` of an existing table,
    whose TBLPROPERTIES (over the session defaults) become its whole configuration, as in
    delta-spark. ``saveAsTable`` in overwrite mode keeps the table's (delta-spark's V1
    writer). Only deltaflow's log writer commits new metadata with data (put-if-absent):
    on another store a replace that keeps the properties is an overwrite, one that changes
    them is refused before anything is written."""
    from deltaflow.table import _conditional_put

    if not (
        mode == "overwrite"
        and options.create_mode in ("replace", "createOrReplace")
        and options.create_replaces_metadata
    ):
        return False
    if _conditional_put.supported(uri):
        return True
    before = {k: v for k, v in snapshot.configuration.items() if v is not None}
    if before == dict(options.table_properties):
        return False
    raise UnsupportedFeatureError(
        f"Replacing {uri} with new table properties ({dict(options.table_properties)}, the"
        f" table has {before}): the new metadata is committed by deltaflow's own log writer,"
        f" which needs a conditional put (put-if-absent) that {uri.split('://', 1)[0]}://"
        " does not offer. Replace it with the table's current TBLPROPERTIES, then change"
        " them with ALTER TABLE ... SET / UNSET TBLPROPERTIES.",
        table_uri=uri,
        feature="replaceTableProperties",
    )


def _refuse_mapped_replace(uri: str, snapshot: Snapshot, options: WriteOptions) -> None:
    """A schema-replacing write (``overwriteSchema``, REPLACE / CREATE OR REPLACE TABLE
    ... AS SELECT) would keep or ask for column mapping: the new schema needs ids and
    physical names the files agree with, which this write does not assign yet. Refused
    before anything is written (else the table would read nulls or not at all)."""
    wanted = _schema.column_mapping_mode(dict(options.table_properties))
    if snapshot.column_mapping_mode == "none" and wanted == "none":
        return
    raise UnsupportedFeatureError(
        f"Replacing the schema of {uri} by a write (overwriteSchema, REPLACE TABLE ... AS"
        " SELECT) with column mapping (the table's delta.columnMapping.mode is"
        f" '{snapshot.column_mapping_mode}', the write asks for '{wanted}') is not supported"
        " yet. Replace the table by its columns first (CREATE OR REPLACE TABLE t (col type,"
        " ...) USING delta TBLPROPERTIES ('delta.columnMapping.mode' = 'name')), then INSERT"
        " INTO it; or write to a new location.",
        table_uri=uri,
        feature="columnMapping",
    )


def _replaced_schema(
    uri: str, incoming: dict[str, Any], options: WriteOptions
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``overwriteSchema``: the written data's schema replaces the table's, and its
    ``partitionBy`` the table's partitioning (none given: unpartitioned, as delta-spark
    does). A dynamic partition overwrite of a table partitioned after the write is
    refused (delta-spark: DELTA_OVERWRITE_SCHEMA_WITH_DYNAMIC_PARTITION_OVERWRITE)."""
    schema = all_nullable(incoming)
    partitions = _new_partitioning(uri, incoming, options)
    if partitions and options.partition_overwrite_mode == "dynamic":
        raise InvalidOptionError(
            f"overwriteSchema cannot be used with a dynamic partition overwrite of {uri}"
            f" (partitioned by {list(partitions)} after the write; delta-spark:"
            " DELTA_OVERWRITE_SCHEMA_WITH_DYNAMIC_PARTITION_OVERWRITE). Drop"
            " .option('partitionOverwriteMode', 'dynamic') to replace the whole table, or"
            " overwriteSchema to replace only the partitions written.",
            option="partitionOverwriteMode",
        )
    return schema, partitions


def _require_log_writer(uri: str, snapshot: Snapshot, partitions: tuple[str, ...]) -> None:
    """A repartitioning overwrite commits through deltaflow's log writer (delta-rs keeps a
    table's partition columns), which needs a conditional put: refused before anything
    is written where the store has none."""
    _log_write.require_conditional_put(
        uri,
        Protocol.of(snapshot),
        f"overwriteSchema from partition columns {list(snapshot.partition_columns)} to"
        f" {list(partitions)}",
    )


def _checked_schema(
    uri: str, snapshot: Snapshot, incoming: dict[str, Any], options: WriteOptions
) -> _Evolution:
    """Schema enforcement: the data must fit the table (``mergeSchema`` may add columns and
    struct fields); the table's schema for this write and how it changes."""
    partitions = snapshot.partition_columns
    table_logical = _schema.logical_schema(snapshot.schema)
    problems = _schema.struct_mismatches(incoming, table_logical, allow_new=options.merge_schema)
    if problems:
        raise SchemaMismatchError(
            f"The data does not match the schema of table {uri}: {'; '.join(problems)}. To add"
            " the new columns, write with .option('mergeSchema', 'true'); to replace the"
            " schema, overwrite with .option('overwriteSchema', 'true').",
            table_uri=uri,
            columns=tuple(p.split(" (")[0] for p in problems),
        )
    evolution = _merged_schema(uri, snapshot, incoming, options)
    if options.partition_by and tuple(c.lower() for c in options.partition_by) != tuple(
        c.lower() for c in partitions
    ):
        raise SchemaMismatchError(
            f"partitionBy {list(options.partition_by)} does not match the partition columns"
            f" {list(partitions)} of table {uri}. Omit partitionBy, or overwrite with"
            " .option('overwriteSchema', 'true') to repartition.",
            table_uri=uri,
            columns=tuple(options.partition_by),
        )
    return evolution


def _new_partitioning(uri: str, incoming: dict[str, Any], options: WriteOptions) -> tuple[str, ...]:
    """The partition columns of a table this write creates or replaces: its
    ``partitionBy``, spelled as the data spells them."""
    for column in options.partition_by:
        if column.lower() not in {f["name"].lower() for f in incoming["fields"]}:
            raise SchemaMismatchError(
                f"partitionBy column '{column}' is not in the data written to {uri}. Columns:"
                f" {', '.join(f['name'] for f in incoming['fields'])}.",
                table_uri=uri,
                columns=(column,),
            )
    names = {f["name"].lower(): f["name"] for f in incoming["fields"]}
    partitions = tuple(names[c.lower()] for c in options.partition_by)
    if partitions and len({p.lower() for p in partitions}) >= len(names):
        # Data files would hold no column, and the rows nothing to be written as.
        raise InvalidOptionError(
            f"partitionBy {list(partitions)} of the table {uri} names every column the data"
            " has: Delta needs at least one data column (delta-spark:"
            " DELTA_CANNOT_USE_ALL_COLUMNS_FOR_PARTITION). Partition by fewer columns.",
            option="partitionBy",
        )
    return partitions


def _plan_new_table(
    uri: str,
    incoming: dict[str, Any],
    mode: str,
    options: WriteOptions,
    replace_where: str | None,
) -> WritePlan:
    """The plan of a write that creates the table (it does not exist yet)."""
    partitions = _new_partitioning(uri, incoming, options)
    if replace_where is not None:
        _replace_where.validate(
            uri,
            replace_where,
            arrow_schema(all_nullable(incoming)),
            partitions,
            dict(options.table_properties),
        )
    # Column mapping: the physical names are chosen here, once, so the files this write
    # puts down and the table's first commit agree on them.
    schema, configuration = _schema.mapped_new_schema(
        all_nullable(incoming), dict(options.table_properties), uri
    )
    column_mapping = _schema.column_mapping_mode(dict(configuration)) != "none"
    if column_mapping:
        _log_write.require_mapped_create(uri, uri)
    physical_names = _schema.top_level_physical_names(schema)
    return WritePlan(
        table_uri=uri,
        mode="append" if mode in ("error", "ignore") else mode,
        save_mode=mode,
        schema=schema,
        physical_schema=_schema.physical_schema(schema) if column_mapping else schema,
        partition_columns=partitions,
        read_version=None,
        new_columns=(),
        configuration=configuration,
        num_indexed_cols=_stats.num_indexed_cols(dict(options.table_properties)),
        options=options,
        column_mapping=column_mapping,
        partition_physical={p: physical_names.get(p, p) for p in partitions},
        replace_where=replace_where,
        optimize_write=should_optimize_write(options, options.table_properties),
    )


@dataclass(frozen=True)
class _Evolution:
    """The table's schema for a write and how the write changes it."""

    schema: dict[str, Any]
    # Top-level columns mergeSchema adds (the commit appends them to the table's schema).
    new_columns: tuple[dict[str, Any], ...] = ()
    # The schema changes in the data's own commit (the log writer): struct fields added,
    # or any addition to a column-mapped table.
    in_commit: bool = False
    # Table properties that change with it (a column-mapped table's maxColumnId).
    configuration: dict[str, str] = field(default_factory=dict)


def _merged_schema(
    uri: str, snapshot: Snapshot, incoming: dict[str, Any], options: WriteOptions
) -> _Evolution:
    """The table's schema for this write and what ``mergeSchema`` adds to it: top-level
    columns, fields inside struct columns (at any depth)."""
    from deltaflow.table import _conditional_put

    table_logical = _schema.logical_schema(snapshot.schema)
    if not options.merge_schema:
        return _Evolution(snapshot.schema)
    merged = _schema.merge_schemas(table_logical, incoming)
    known = {f["name"].lower() for f in table_logical["fields"]}
    new_columns = tuple(
        all_nullable({"type": "struct", "fields": [f]})["fields"][0]
        for f in merged["fields"]
        if f["name"].lower() not in known
    )
    nested = {
        f["name"]: f["type"]
        for f, g in zip(merged["fields"], table_logical["fields"], strict=False)
        if f["type"] != g["type"]
    }
    if (new_columns or nested) and snapshot.column_mapping_mode != "none":
        return _mapped_merged_schema(uri, snapshot, incoming)
    if nested and not _conditional_put.supported(uri):
        raise UnsupportedFeatureError(
            f"mergeSchema would add nested fields to {', '.join(nested)} of table {uri}: the"
            " new schema is committed with the data by deltaflow's own log writer, which"
            " needs a store with put-if-absent. Add the fields first (ALTER TABLE ... ADD"
            " COLUMNS (s.field type)), then write.",
            table_uri=uri,
            feature="mergeSchema-nested",
        )
    # The table's own fields (their metadata kept), struct columns widened, new ones last.
    fields = [{**f, "type": nested.get(f["name"], f["type"])} for f in snapshot.schema["fields"]]
    schema = {**snapshot.schema, "fields": fields + list(new_columns)}
    if nested:  # the whole new schema, new columns too, is committed with the data
        return _Evolution(schema, in_commit=True)
    return _Evolution(schema, new_columns)


def _mapped_merged_schema(uri: str, snapshot: Snapshot, incoming: dict[str, Any]) -> _Evolution:
    """``mergeSchema`` on a column-mapped table: the new columns and struct fields get ids
    and physical names (:func:`_schema.merge_mapped_schemas`), which the files this write
    puts down use; the schema and the raised ``maxColumnId`` are committed with the data by
    the log writer, in one commit, as delta-spark does."""
    from deltaflow.table import _conditional_put

    if not _conditional_put.supported(uri):
        raise UnsupportedFeatureError(
            f"mergeSchema would add columns to column-mapped table {uri}: their ids and"
            " physical names are committed with the data by deltaflow's own log writer, which"
            " needs a conditional put (put-if-absent) that"
            f" {uri.split('://', 1)[0]}:// does not offer. Nothing was written. Write only"
            " the table's columns, or copy the table to a local, S3, GCS or Azure location.",
            table_uri=uri,
            feature="columnMapping",
        )
    schema, configuration = _schema.merge_mapped_schemas(
        snapshot.schema, all_nullable(incoming), snapshot.configuration, seed=uri
    )
    return _Evolution(schema, (), in_commit=True, configuration=configuration)


def _skipped_plan(snapshot: Snapshot, options: WriteOptions) -> WritePlan:
    return WritePlan(
        table_uri=snapshot.uri,
        mode="append",
        schema=snapshot.schema,
        physical_schema=snapshot.schema,
        partition_columns=snapshot.partition_columns,
        read_version=snapshot.version,
        new_columns=(),
        configuration={},
        num_indexed_cols=_stats.num_indexed_cols(snapshot.configuration),
        options=options,
        skip=True,
    )


def require_arrow_checks(plan: WritePlan) -> None:
    """Refuse (typed, on the driver) a Python-path write whose table has a constraint the
    Python writer cannot evaluate."""
    if plan.checks and not plan.checks_verified and not plan.skip:
        _constraints.ArrowChecks(plan.table_uri, plan.checks, arrow_schema(plan.schema))


def _check_writer_features(uri: str, features: tuple[str, ...]) -> None:
    for feature in features:
        if feature not in SUPPORTED_WRITER_FEATURES:
            raise UnsupportedFeatureError(
                f"Table {uri} uses the Delta writer feature '{feature}', which deltaflow cannot"
                " write yet; writing could break the table's guarantees, so nothing was written.",
                table_uri=uri,
                feature=feature,
            )
