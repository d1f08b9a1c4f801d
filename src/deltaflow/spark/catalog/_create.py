"""Creating tables: delta-spark's ``DeltaTableBuilder`` (``DeltaTable.create`` and friends).

The builder only declares (each call returns a new builder holding a frozen
:class:`TableSpec`); ``execute()`` runs it:

- the Delta log is written by delta-rs (``deltalake.DeltaTable.create``): version 0 with
  the protocol, the ``metaData`` (schema JSON in Spark's format, partition columns,
  properties, comment) and no files. ``createOrReplace`` on an existing table commits
  the new ``metaData`` and a ``remove`` of every live file in one commit; history stays;
- with ``tableName``, the table is registered in the session catalog as
  ``CREATE TABLE <name> USING delta LOCATION '<uri>'`` does it (with a location: in one
  call to the connector's catalog, :func:`._jvm_catalog.register_external`), so ``spark.table``,
  ``SELECT``, ``INSERT INTO`` and ``DeltaTable.forName`` work. Without ``location``, the
  table lives where Spark puts a managed table: ``<database location>/<table name>``.

:func:`create_log` is the log side of every CREATE / REPLACE: the builder's, and the
SQL statements' through deltaflow's catalog (``DeltaCatalog.scala`` calls it as the
brain's ``catalog.create``, :func:`create_from_catalog`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.errors import InvalidOptionError
from deltaflow.spark import _arguments as args
from deltaflow.spark.catalog import _builder_args, _jvm_catalog
from deltaflow.table import _conditional_put, _generated, _log_commit, _uri
from deltaflow.table._protocol import protocol_for_new_table
from deltaflow.table._snapshot import load_snapshot, table_exists
from deltaflow.table.errors import (
    LocationNotEmptyError,
    SchemaMismatchError,
    TableAlreadyExistsError,
    TableNotFoundError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructField, StructType

    from deltaflow.spark.dml._delta_table import DeltaTable
    from deltaflow.table._snapshot import Snapshot

log = logging.getLogger("deltaflow.create")

CreateMode = Literal["create", "createIfNotExists", "replace", "createOrReplace"]
# Spark keeps CHAR/VARCHAR as strings plus this field metadata, and so does delta-spark.
_CHAR_VARCHAR_KEY = "__CHAR_VARCHAR_TYPE_STRING"


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type_json: Any  # Spark / Delta JSON type
    nullable: bool = True
    metadata: tuple[tuple[str, Any], ...] = ()

    def field_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type_json,
            "nullable": self.nullable,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class TableSpec:
    """A declared table: what :class:`DeltaTableBuilder` builds and :func:`execute` runs."""

    mode: CreateMode
    name: str | None = None
    location: str | None = None
    columns: tuple[ColumnSpec, ...] = ()
    partition_columns: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    comment: str | None = None
    clustering_columns: tuple[str, ...] | None = None  # CLUSTER BY (liquid clustering)
    managed: bool = False  # a catalog table whose location the catalog chose

    def schema_json(self) -> dict[str, Any]:
        return {"type": "struct", "fields": [c.field_json() for c in self.columns]}


class DeltaTableBuilder:
    """delta-spark's ``DeltaTableBuilder``. Each call adds to this builder and returns it
    (as delta-spark's does: ``builder.clusterBy(...)`` without using the result still
    clusters the table); ``spec`` is the frozen declaration so far. Nothing touches the
    table until :meth:`execute`."""

    def __init__(self, spark: SparkSession, spec: TableSpec) -> None:
        self._spark = spark
        self.spec = spec

    def _with(self, **changes: Any) -> DeltaTableBuilder:
        self.spec = dataclasses.replace(self.spec, **changes)
        return self

    @property
    def _jbuilder(self) -> _builder_args.ScalaBuilderView:
        """delta-spark's handle on the Scala builder behind its Python one, which code
        written for delta-spark sometimes calls directly (``builder._jbuilder =
        builder._jbuilder.partitionedBy(seq)``): a view taking the Scala methods'
        arguments (Scala ``Seq``s through py4j) onto this builder."""
        return _builder_args.ScalaBuilderView(self)

    @_jbuilder.setter
    def _jbuilder(self, view: _builder_args.ScalaBuilderView) -> None:
        if not isinstance(view, _builder_args.ScalaBuilderView):
            raise TypeError(f"_jbuilder takes the builder's own view, got {type(view)}.")
        self.spec = view.builder.spec

    def tableName(self, identifier: str) -> DeltaTableBuilder:
        """The catalog name (``t`` or ``db.t``) to register the table under."""
        args.check_builder_str(identifier, "Identifier must be str.")
        return self._with(name=identifier)

    def location(self, location: str) -> DeltaTableBuilder:
        """Where the table lives (path or URI). Without it, a named table goes under the
        database's location, as a Spark managed table does."""
        args.check_builder_str(location, "Location must be str.")
        return self._with(location=location)

    def comment(self, comment: str) -> DeltaTableBuilder:
        """The table comment (``description`` in the log, in ``detail()``)."""
        args.check_builder_str(comment, "Table comment must be str.")
        return self._with(comment=comment)

    def addColumn(
        self,
        colName: str,
        dataType: str | DataType,
        nullable: bool = True,
        generatedAlwaysAs: str | None = None,
        generatedByDefaultAs: Any = None,
        comment: str | None = None,
    ) -> DeltaTableBuilder:
        """Add a column; ``dataType`` is a DDL string (``"DECIMAL(10,2)"``,
        ``"ARRAY<STRING>"``) or a Spark ``DataType``. ``generatedAlwaysAs``: a SQL
        expression of the table's other columns (a generated column) or an
        ``IdentityGenerator(start, step)`` (``GENERATED ALWAYS AS IDENTITY``);
        ``generatedByDefaultAs``: an ``IdentityGenerator`` (``GENERATED BY DEFAULT``)."""
        args.check_add_column(colName, dataType, nullable, generatedAlwaysAs,
                              generatedByDefaultAs, comment)  # fmt: skip
        from pyspark.sql.types import StructField

        from deltaflow.spark.catalog._columns import column_metadata

        metadata = column_metadata(colName, generatedAlwaysAs, generatedByDefaultAs)
        if comment is not None:
            metadata["comment"] = comment
        data_type = _builder_args.data_type(dataType, colName)
        if _generated.IDENTITY_START in metadata:
            _builder_args.check_identity_type(colName, data_type, self._describe())
        field = StructField(colName, data_type, nullable, metadata)
        return self._with(columns=(*self.spec.columns, _column(field)))

    def addColumns(self, cols: StructType | Iterable[StructField]) -> DeltaTableBuilder:
        """Add every field of a ``StructType`` (or a list of ``StructField``)."""
        args.check_add_columns(cols)
        from pyspark.sql.types import StructField, StructType

        fields = cols.fields if isinstance(cols, StructType) else list(cols)
        for f in fields:
            if not isinstance(f, StructField):
                raise InvalidOptionError(
                    f"addColumns takes a StructType or a list of StructField, got {f!r}.",
                    option="addColumns",
                )
        return self._with(columns=(*self.spec.columns, *(_column(f) for f in fields)))

    def partitionedBy(self, *cols: str | Iterable[str]) -> DeltaTableBuilder:
        """Partition columns, in order (names of added columns)."""
        args.column_names(cols, "Partitioning column must be str.")
        names: list[str] = []
        for group in cols:
            names.extend([group] if isinstance(group, str) else group)
        return self._with(partition_columns=(*self.spec.partition_columns, *names))

    def clusterBy(self, *cols: str | Iterable[str]) -> DeltaTableBuilder:
        """Clustering columns (liquid clustering): OPTIMIZE clusters the table by them.
        Names, or one list of names (as delta-spark takes them)."""
        names = args.column_names(cols, "Clustering column must be str.")
        return self._with(clustering_columns=(*(self.spec.clustering_columns or ()), *names))

    def property(self, key: str, value: str) -> DeltaTableBuilder:
        """A table property (``delta.*`` or your own)."""
        if type(key) is not str or type(value) is not str:
            args.raise_builder_type_error("Key and value of property must be string.", [key, value])
        ((name, _),) = _checked_properties({key: str(value)}, self._describe())
        kept = tuple((k, v) for k, v in self.spec.properties if k != name)
        return self._with(properties=(*kept, (name, str(value))))

    def execute(self) -> DeltaTable:
        """Create (or replace) the table and return it as a ``DeltaTable``."""
        return execute(self._spark, self.spec)

    def _describe(self) -> str:
        return self.spec.location or self.spec.name or "the new table"


def _column(field: StructField) -> ColumnSpec:
    from pyspark.sql.types import CharType, VarcharType

    data = field.jsonValue()
    metadata = {k: _metadata_value(v) for k, v in (field.metadata or {}).items()}
    if isinstance(field.dataType, (CharType, VarcharType)):
        metadata[_CHAR_VARCHAR_KEY] = field.dataType.simpleString()
        data["type"] = "string"
    return ColumnSpec(field.name, data["type"], field.nullable, tuple(sorted(metadata.items())))


def _metadata_value(value: Any) -> Any:
    # Delta's identity keys are numbers and a boolean in the log (as delta-spark writes
    # them); other metadata is kept as text.
    return value if isinstance(value, (bool, int)) else str(value)


def builder(spark: SparkSession | None, mode: CreateMode) -> DeltaTableBuilder:
    """A new builder for ``DeltaTable.<mode>(spark)``; the active session when None."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise InvalidOptionError(
                f"DeltaTable.{mode}() needs a SparkSession: pass one, e.g."
                f" DeltaTable.{mode}(spark).",
                option="sparkSession",
            )
    return DeltaTableBuilder(spark, TableSpec(mode=mode))


# ---- running a spec ---------------------------------------------------------------------


def execute(spark: SparkSession, spec: TableSpec) -> DeltaTable:
    """Create, create-if-missing or replace the table ``spec`` declares."""
    from deltaflow.spark.dml._delta_table import DeltaTable
    from deltaflow.spark.remote import _table as _remote

    if _remote.is_connect(spark):  # the server's catalog runs the statement
        from deltaflow.spark.remote import _create as _remote_create

        location, name = _remote_create.execute(spark, spec)
        return DeltaTable(spark, location, name=name)
    if not spec.name and not spec.location:
        raise InvalidOptionError(
            "DeltaTable.create needs .tableName(name) or .location(path) (or both).",
            option="location",
        )
    in_catalog = bool(spec.name and _jvm_catalog.table_in_catalog(spark, spec.name))
    # Looked up only when there is an entry: a missing one costs Spark an exception.
    registered = catalog_location(spark, spec.name) if in_catalog and spec.name else None
    if spec.location:
        uri = _uri.normalize_uri(spec.location)
    elif registered:
        uri = registered
    else:
        assert spec.name is not None
        uri = managed_location(spark, spec.name)
        _check_managed_location(spec.name, uri)
        spec = dataclasses.replace(spec, managed=True)
    # The catalog's answers are pyspark's AnalysisException too, as delta-spark's are.
    from deltaflow.spark._pyspark_errors import (
        TableAlreadyExistsAnalysisError,
        TableNotFoundAnalysisError,
    )

    if spec.mode == "create" and in_catalog:
        raise TableAlreadyExistsAnalysisError(
            f"Table {spec.name} already exists in the catalog. Use"
            " DeltaTable.createIfNotExists to keep it or DeltaTable.createOrReplace to replace"
            " it.",
            table_uri=spec.name or uri,
        )
    if spec.mode == "replace" and not in_catalog and not table_exists(uri):
        raise TableNotFoundAnalysisError(
            f"Table {spec.name or uri} cannot be replaced as it did not exist: there is no"
            f" Delta table at {uri}. Use DeltaTable.createOrReplace to create it when"
            " missing.",
            table_uri=uri,
        )
    if spec.mode == "createIfNotExists" and in_catalog:
        return DeltaTable(spark, registered or uri, name=spec.name)
    spec = _with_session_defaults(spark, spec)

    if not spec.columns and not table_exists(uri):
        _validate(spec, spec.name or uri)  # the builder's error: call addColumn
    _check_generation_expressions(spark, spec, spec.name or uri)
    create_log(spec, uri, path_only=not spec.name)
    if spec.name:
        _register(spark, spec, uri, replace=in_catalog)
    return DeltaTable(spark, uri, name=spec.name)


def _check_managed_location(name: str, uri: str) -> None:
    """A new managed table gets a folder of its own: one that already holds files (the
    log of a table the catalog forgot, other data) is refused before anything is written,
    as the connector's catalog refuses it for SQL (``CreateRequest.checkManagedLocation``)
    and Spark does (``LOCATION_ALREADY_EXISTS``)."""
    import pyarrow.fs as pafs

    fs, path = _uri.filesystem(uri)
    try:
        entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (NotADirectoryError, FileNotFoundError):
        return
    if entries:
        raise LocationNotEmptyError(
            f"Cannot create managed table {name}: its location {uri} already holds files (a"
            " table the catalog no longer lists, or other data). Nothing was written. To use"
            f" the table that is there, register it: DeltaTable.create(spark).tableName({name!r})"
            f".location({uri!r}). Otherwise remove that folder or choose another name.",
            table_uri=uri,
            table_name=name,
        )


def _check_generation_expressions(spark: SparkSession, spec: TableSpec, label: str) -> None:
    """Spark analyses the builder's generation expressions, as it does for SQL's."""
    from pyspark.sql.types import StructType

    from deltaflow.spark.catalog._columns import check_expressions

    if not any(_generated.GENERATION_EXPRESSION in dict(c.metadata) for c in spec.columns):
        return
    schema = StructType.fromJson(spec.schema_json())
    check_expressions(spark, schema.fields, label)


def _with_session_defaults(spark: SparkSession, spec: TableSpec) -> TableSpec:
    """``spec`` with ``delta.X`` for each session default ``...properties.defaults.X``
    it does not set itself."""
    own = {k.lower() for k, _ in spec.properties}
    defaults = [
        (key, value)
        for key, value in _jvm_catalog.session_table_defaults(spark).items()
        if key.lower() not in own
    ]
    if not defaults:
        return spec
    checked = _checked_properties(dict(defaults), spec.location or spec.name or "new table")
    return dataclasses.replace(spec, properties=(*checked, *spec.properties))


def create_log(spec: TableSpec, uri: str, *, path_only: bool) -> None:
    """The Delta log side of a CREATE / REPLACE: write version 0 (or the replacing
    metadata, history kept), or check that the table already at ``uri`` is the one
    declared. ``path_only``: the table is named by its location alone (no catalog entry).
    Declaring no columns means "the table that is there"."""
    label = spec.name or uri
    exists = table_exists(uri)
    if not spec.columns:
        if not exists:
            raise TableNotFoundError(
                f"Creating {label} declares no columns and there is no Delta table at {uri}"
                " to take them from. Give the columns (CREATE TABLE t (id BIGINT, ...) USING"
                " delta) or write the table first.",
                table_uri=uri,
            )
        return  # register the table that is there
    if spec.mode == "replace" and not exists:
        raise TableNotFoundError(
            f"Cannot replace {label}: there is no Delta table at {uri}. Use"
            " CREATE OR REPLACE (DeltaTable.createOrReplace) to create it when missing.",
            table_uri=uri,
        )
    if exists and spec.mode not in ("replace", "createOrReplace"):
        if spec.mode == "create" and path_only:
            raise TableAlreadyExistsError(
                f"A Delta table already exists at {uri}. Use DeltaTable.createIfNotExists"
                " (CREATE TABLE IF NOT EXISTS) to keep it, createOrReplace to replace it, or"
                " DeltaTable.forPath to open it.",
                table_uri=uri,
            )
        # Naming an existing location registers that table, as CREATE TABLE ... LOCATION
        # does in delta-spark: the declared columns, if any, must be the table's.
        # createIfNotExists leaves an existing table alone, whatever was declared.
        if spec.mode == "create":
            _check_matches(spec, uri)
        return
    _validate(spec, label)
    _write_log(spec, uri, replace=exists)


def create_from_catalog(args: dict[str, Any]) -> dict[str, Any]:
    """The brain's ``catalog.create``: the log side of a CREATE / REPLACE TABLE the
    connector's catalog runs (``DeltaCatalog.scala``); the catalog entry is its business."""
    uri = _uri.normalize_uri(args["location"])
    schema = json.loads(args["schema"]) if args.get("schema") else {"fields": []}
    spec = TableSpec(
        mode=args["mode"],
        name=args.get("name"),
        location=uri,
        columns=tuple(column_from_json(f) for f in schema["fields"]),
        partition_columns=tuple(args.get("partitionColumns") or ()),
        properties=tuple(_checked_properties(args.get("properties") or {}, uri)),
        comment=args.get("comment"),
        clustering_columns=(
            tuple(args["clusteringColumns"]) if args.get("clusteringColumns") is not None else None
        ),
        managed=bool(args.get("managed")),
    )
    create_log(spec, uri, path_only=bool(args.get("pathOnly")))
    return {"uri": uri}


def column_from_json(field: dict[str, Any]) -> ColumnSpec:
    """A Spark StructField (JSON) as a Delta column: CHAR/VARCHAR are strings with
    their declared type kept in the field's metadata, as Spark and delta-spark keep them;
    Spark's generation / identity keys become Delta's."""
    from deltaflow.spark.catalog._columns import delta_field_metadata

    metadata = {
        k: _metadata_value(v) for k, v in delta_field_metadata(field.get("metadata") or {}).items()
    }
    data_type = field["type"]
    if isinstance(data_type, str) and re.fullmatch(r"(var)?char\(\d+\)", data_type):
        metadata[_CHAR_VARCHAR_KEY] = data_type
        data_type = "string"
    return ColumnSpec(
        field["name"], data_type, field.get("nullable", True), tuple(sorted(metadata.items()))
    )


def _checked_properties(properties: dict[str, str], label: str) -> list[tuple[str, str]]:
    """TBLPROPERTIES with Delta's names canonical; unknown ``delta.*`` keys refused."""
    from deltaflow.spark._options import checked_table_properties

    return list(checked_table_properties(properties, f"for {label}").items())


def _validate(spec: TableSpec, label: str) -> None:
    if not spec.columns:
        raise InvalidOptionError(
            f"Creating {label} needs its columns: call .addColumn(name, type) or"
            " .addColumns(schema) before execute().",
            option="addColumn",
        )
    seen: dict[str, str] = {}
    for declared in spec.columns:
        if declared.name.lower() in seen:
            raise InvalidOptionError(
                f"Column '{declared.name}' of {label} is declared twice (names are"
                f" case-insensitive: '{seen[declared.name.lower()]}'). Remove one.",
                option="addColumn",
            )
        seen[declared.name.lower()] = declared.name
    for partition in spec.partition_columns:
        column = next((c for c in spec.columns if c.name.lower() == partition.lower()), None)
        if column is None:
            raise InvalidOptionError(
                f"Partition column '{partition}' of {label} is not one of its columns:"
                f" {', '.join(c.name for c in spec.columns)}. Add it with addColumn first.",
                option="partitionedBy",
                valid=tuple(c.name for c in spec.columns),
            )
        if not isinstance(column.type_json, str):
            raise InvalidOptionError(
                f"Partition column '{partition}' of {label} has a nested type; Delta"
                " partition columns must be of a primitive type.",
                option="partitionedBy",
            )
    if len({p.lower() for p in spec.partition_columns}) != len(spec.partition_columns):
        raise InvalidOptionError(
            f"partitionedBy of {label} names a column twice: {list(spec.partition_columns)}.",
            option="partitionedBy",
        )
    _generated.validate_declaration(
        [c.field_json() for c in spec.columns], spec.partition_columns, label
    )
    if spec.partition_columns and len(spec.partition_columns) == len(spec.columns):
        raise InvalidOptionError(
            f"{label}: every column is a partition column; Delta needs at least one data column.",
            option="partitionedBy",
        )


def _write_log(spec: TableSpec, uri: str, *, replace: bool) -> None:
    from deltalake import DeltaTable as DeltaRsTable
    from deltalake import Schema

    from deltaflow.table import _commit, _log_write
    from deltaflow.table._protocol import Protocol

    by_lower = {c.name.lower(): c.name for c in spec.columns}
    current = load_snapshot(uri) if replace else None
    schema, configuration = _column_mapped(spec, uri, current)
    request = _commit.CommitRequest(
        table_uri=uri,
        schema=schema,
        partition_columns=tuple(by_lower[p.lower()] for p in spec.partition_columns),
        adds=(),
        read_version=None if current is None else current.version,
        configuration=configuration,
        description=spec.comment,
        clustering_columns=spec.clustering_columns,
        replace_table=replace,
        operation=_operation(spec, replace),
        commit_info={"operationParameters": create_parameters(spec, by_lower)},
    )
    if (
        _uri.is_local(uri)
        or _log_write.needs_log_writer(request)
        or (current is not None and Protocol.of(current).delta_rs_unwritable)
    ):
        # Identity columns, CLUSTER BY, column mapping, or a replace of such a table:
        # delta-rs 1.6 cannot; and it records its own operation parameters, not
        # delta-spark's.
        name = _short_name(spec.name) if spec.name else None
        _log_write.commit_write(request, name=name, label=spec.name or uri)
        log.info("%s Delta table at %s (log writer)", "replaced" if replace else "created", uri)
        return
    partitions = [by_lower[p.lower()] for p in spec.partition_columns]
    protocol = protocol_for_new_table(dict(spec.properties), spec.schema_json())
    if protocol is not None and not replace and _conditional_put.supported(uri):
        # delta-rs would list features the table does not use (table/_protocol.py).
        if not _log_commit.create_table(
            uri,
            schema=spec.schema_json(),
            partition_columns=partitions,
            configuration=dict(spec.properties),
            protocol=protocol.to_action(),
            name=_short_name(spec.name) if spec.name else None,
            description=spec.comment,
        ):
            raise TableAlreadyExistsError(
                f"A Delta table was created at {uri} by another writer while this CREATE"
                " ran. Use CREATE TABLE IF NOT EXISTS to keep it.",
                table_uri=uri,
            )
        log.info("created Delta table at %s", uri)
        return
    DeltaRsTable.create(
        _uri.delta_rs_uri(uri),
        Schema.from_json(json.dumps(spec.schema_json())),
        mode="overwrite" if replace else "error",
        partition_by=partitions or None,
        name=_short_name(spec.name) if spec.name else None,
        description=spec.comment,
        configuration=dict(spec.properties) or None,
        # delta.* keys are checked in property(); others are the user's own, kept as given.
        raise_if_key_not_exists=False,
    )
    log.info("%s Delta table at %s", "replaced" if replace else "created", uri)


def _column_mapped(
    spec: TableSpec, uri: str, current: Snapshot | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The new table's schema and properties, with column mapping set up when
    ``delta.columnMapping.mode`` asks for it (ids, ``col-<uuid>`` physical names,
    ``maxColumnId``, as delta-spark creates it). Refused before anything is written
    where deltaflow's log writer, which alone commits such a table, cannot commit."""
    from deltaflow.table import _log_write, _schema

    schema, configuration = spec.schema_json(), dict(spec.properties)
    label = spec.name or uri
    if _schema.column_mapping_mode(dict(configuration)) == "none":
        return schema, configuration
    _log_write.require_mapped_create(uri, label)
    # A replaced table's ids are not handed out again: one id, one column in a history.
    before = current.configuration.get(_schema.MAX_COLUMN_ID_KEY) if current else None
    return _schema.mapped_new_schema(schema, configuration, label, int(before or 0))


def _operation(spec: TableSpec, replace: bool) -> str:
    """delta-spark's name for the commit: CREATE TABLE, REPLACE TABLE or CREATE OR REPLACE."""
    if not replace:
        return "CREATE TABLE"
    return "REPLACE TABLE" if spec.mode == "replace" else "CREATE OR REPLACE TABLE"


def create_parameters(spec: TableSpec, by_lower: dict[str, str]) -> dict[str, Any]:
    """delta-spark's operationParameters of CREATE / REPLACE TABLE."""
    return {
        "isManaged": "true" if spec.managed else "false",
        "description": spec.comment,
        "partitionBy": json.dumps([by_lower.get(p.lower(), p) for p in spec.partition_columns]),
        "clusterBy": json.dumps(list(spec.clustering_columns or ())),
        "properties": json.dumps(dict(spec.properties)),
    }


def _check_matches(spec: TableSpec, uri: str) -> None:
    if not spec.columns:
        return
    from deltaflow.table import _schema

    existing = _schema.logical_schema(load_snapshot(uri).schema)
    declared = [(c.name.lower(), c.type_json) for c in spec.columns]
    actual = [(f["name"].lower(), f["type"]) for f in existing["fields"]]
    if declared != actual:
        differing = tuple(
            sorted({n for n, _ in declared}.symmetric_difference({n for n, _ in actual}))
            or [n for (n, t), (_, u) in zip(declared, actual, strict=False) if t != u]
        )
        raise SchemaMismatchError(
            f"The columns declared for {spec.name or uri} differ from those of the existing"
            f" Delta table at {uri} (differing: {', '.join(differing) or 'column order'})."
            " Declare no columns to use the table as it is, or use createOrReplace to"
            " replace it.",
            table_uri=uri,
            columns=differing,
        )


def _register(spark: SparkSession, spec: TableSpec, uri: str, *, replace: bool) -> None:
    """The catalog entry for the table just written at ``uri``: deltaflow's catalog
    registers the table that is there (no columns declared). Without a location in the
    spec the table is a managed one, dropped with its data."""
    if (
        (spec.location or spec.managed)
        and not replace
        and spec.name
        and _jvm_catalog.register_external(spark, spec.name, uri, managed=spec.managed)
    ):
        return
    verb = "CREATE OR REPLACE TABLE" if replace else "CREATE TABLE"
    located = ""
    if spec.location or replace:  # a replaced entry keeps its location (and its type)
        located = " LOCATION '" + uri.replace("\\", "\\\\").replace("'", "\\'") + "'"
    spark.sql(f"{verb} {spec.name} USING delta{located}")


def catalog_location(spark: Any, name: str) -> str | None:
    """The location of catalog table ``name`` if it is a Delta table, else None."""
    try:
        state = spark._jsparkSession.sessionState()
        metadata = state.catalog().getTableMetadata(state.sqlParser().parseTableIdentifier(name))
        provider = metadata.provider()
        if not provider.isDefined() or str(provider.get()).lower() != "delta":
            return None
        uri = metadata.location()
        return _uri.normalize_uri(str(uri)) if uri is not None else None
    except Exception:  # a temporary view, Spark Connect, or no such table
        return None


def managed_location(spark: SparkSession, name: str) -> str:
    """Where Spark would keep managed table ``name``: ``<database location>/<table>``."""
    parts = _name_parts(name)
    database = parts[-2] if len(parts) > 1 else spark.catalog.currentDatabase()
    root = spark.catalog.getDatabase(database).locationUri
    table = parts[-1]
    if spark.conf.get("spark.sql.caseSensitive", "false").lower() != "true":
        table = table.lower()
    return _uri.normalize_uri(_uri.join(root, table))


def _name_parts(name: str) -> list[str]:
    parts = re.findall(r"`((?:[^`]|``)*)`|([^.`]+)", name)
    return [quoted.replace("``", "`") if quoted else plain.strip() for quoted, plain in parts]


def _short_name(name: str) -> str:
    return _name_parts(name)[-1]
