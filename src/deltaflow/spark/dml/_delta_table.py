"""``deltaflow.DeltaTable``: delta-spark's ``delta.tables.DeltaTable`` for deltaflow.

Same method names and arguments as delta-spark's Python API. DELETE, UPDATE and MERGE run
as Spark jobs (``_dml``, ``_merge``); history, detail, vacuum, restore and optimize run
Delta's SQL statements (``DESCRIBE HISTORY``, ``VACUUM``, ...), whose work is done by
``spark/commands/`` through delta-rs; table properties go through delta-rs on the driver.
Conditions and values accept SQL strings and Columns.

On a Spark Connect session every method dispatches to :mod:`deltaflow.spark.remote`,
which sends Delta's SQL statements to the server: the client never opens table storage.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable as _DeltaRsTable

from deltaflow.errors import InvalidOptionError
from deltaflow.spark import _arguments as args
from deltaflow.spark.catalog import _create
from deltaflow.spark.commands import _convert, _describe, _maintenance, _vacuum
from deltaflow.spark.dml import _delete_update, _merge_builder
from deltaflow.spark.remote import _table as _remote
from deltaflow.table import _log_upkeep, _uri
from deltaflow.table._snapshot import load_snapshot, table_exists
from deltaflow.table.errors import TableNotFoundError, UnsupportedFeatureError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from deltaflow.spark.catalog._columns import DeltaColumnBuilder
    from deltaflow.spark.catalog._create import DeltaTableBuilder

# deltaflow._session.SQL_EXTENSION (that module sits above this layer).
SQL_EXTENSION = "io.deltaflow.spark.DeltaSparkSessionExtension"


class DeltaTable:
    """A Delta table for programmatic DML and maintenance, as in delta-spark.

    Build one with :meth:`forPath` or :meth:`forName`. Every method reads the table's
    latest version when it runs; ``delete`` / ``update`` commit one transaction each.
    """

    def __init__(
        self, spark: SparkSession, uri: str, *, name: str | None = None, alias: str | None = None
    ) -> None:
        self._spark = spark
        self._uri = uri
        self._name = name
        self._alias = alias
        # A Spark Connect session: the table lives on the server, reached by SQL only.
        self._remote = _remote.is_connect(spark)

    # ---- construction ---------------------------------------------------------------

    @classmethod
    def forPath(
        cls, sparkSession: SparkSession, path: str, hadoopConf: Mapping[str, str] | None = None
    ) -> DeltaTable:
        """The Delta table at ``path``; ``TableNotFoundError`` when there is none."""
        args.check_type(path, "path", "a table path or URI (str)")
        if _remote.is_connect(sparkSession):  # a path of the server's file system
            return cls(sparkSession, _remote.locate_path(sparkSession, path))
        uri = _uri.normalize_uri(path)
        if not table_exists(uri):
            raise TableNotFoundError(
                f"{path} is not a Delta table: there is no _delta_log there. Create it with"
                f" df.write.format('delta').save('{path}').",
                table_uri=uri,
            )
        return cls(sparkSession, uri)

    @classmethod
    def forName(cls, sparkOrSQLContext: SparkSession, tableOrViewName: str) -> DeltaTable:
        """The Delta table behind a catalog table made with ``CREATE TABLE ... USING delta``."""
        args.check_type(tableOrViewName, "tableOrViewName", "a table name (str)")
        spark = sparkOrSQLContext
        path = _path_identifier(tableOrViewName)
        if path is not None:  # delta.`/path`, as delta-spark accepts
            return cls.forPath(spark, path)
        if _remote.is_connect(spark):
            return cls(spark, _remote.locate_name(spark, tableOrViewName), name=tableOrViewName)
        location = None
        if spark.catalog.tableExists(tableOrViewName):
            location = _create.catalog_location(spark, tableOrViewName)
        if location is None or not table_exists(location):
            raise TableNotFoundError(
                f"{tableOrViewName} is not a Delta table in the catalog. Create it with CREATE"
                " TABLE name USING delta LOCATION '<path>', or use DeltaTable.forPath(spark,"
                " path).",
                table_uri=tableOrViewName,
            )
        return cls(spark, location, name=tableOrViewName)

    @classmethod
    def create(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder for a new table; ``execute()`` fails if it exists (as delta-spark)."""
        return _create.builder(sparkSession, "create")

    @classmethod
    def createIfNotExists(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that creates the table, or does nothing if it exists."""
        return _create.builder(sparkSession, "createIfNotExists")

    @classmethod
    def replace(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that replaces an existing table (schema, properties, no rows)."""
        return _create.builder(sparkSession, "replace")

    @classmethod
    def createOrReplace(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that creates the table, or replaces it in one commit if it exists."""
        return _create.builder(sparkSession, "createOrReplace")

    @classmethod
    def columnBuilder(cls, sparkSession: SparkSession | None, colName: str) -> DeltaColumnBuilder:
        """A builder of one column (generated, identity, comment) for ``addColumn(s)``."""
        from deltaflow.spark.catalog._columns import DeltaColumnBuilder

        return DeltaColumnBuilder(sparkSession, colName)

    @classmethod
    def isDeltaTable(cls, sparkSession: SparkSession, identifier: str) -> bool:
        """True when ``identifier`` (a path) holds a Delta table."""
        args.check_type(identifier, "identifier", "a table path or URI (str)")
        if _remote.is_connect(sparkSession):
            return _remote.is_delta_table(sparkSession, identifier)
        return table_exists(_uri.normalize_uri(identifier))

    @classmethod
    def convertToDelta(
        cls,
        sparkSession: SparkSession,
        identifier: str,
        partitionSchema: str | StructType | None = None,
    ) -> DeltaTable:
        """Make a Parquet table a Delta table in place (``CONVERT TO DELTA``) and return it.

        ``identifier`` is ``parquet.`/path``` or a catalog table ``USING parquet``;
        ``partitionSchema`` names Hive-style partition columns, as DDL
        (``"part int, day date"``) or a ``StructType``.
        """
        args.check_type(identifier, "identifier", '"parquet.`/path`" or a table name (str)')
        ddl = _partition_ddl(partitionSchema)
        statement = f"CONVERT TO DELTA {identifier}"
        if ddl:
            statement += f" PARTITIONED BY ({ddl})"
        path = _path_identifier(identifier, ("parquet",))
        if _remote.is_connect(sparkSession):
            _remote.run_collect(sparkSession, statement)
        elif _has_sql_extension(sparkSession):
            _remote.run(sparkSession, statement)
        elif path is not None:
            schema = None
            if ddl:
                from pyspark.sql.types import _parse_datatype_string

                schema = _parse_datatype_string(ddl).jsonValue()
            _convert.convert(_uri.normalize_uri(path), schema)
        else:
            raise InvalidOptionError(
                f"convertToDelta({identifier!r}) of a catalog table needs deltaflow's SQL"
                " extension in the session (deltaflow.session() or deltaflow.configure());"
                ' or pass the table\'s files as "parquet.`/path`".',
                option="identifier",
            )
        if path is not None:
            return cls.forPath(sparkSession, path)
        return cls.forName(sparkSession, identifier)

    def alias(self, aliasName: str) -> DeltaTable:
        """This table under ``aliasName``, for conditions such as ``"t.id = 1"``."""
        args.check_type(aliasName, "aliasName", "an alias (str)")
        return DeltaTable(self._spark, self._uri, name=self._name, alias=aliasName)

    def toDF(self) -> DataFrame:
        if self._remote:
            df = _remote.to_df(self._spark, self._uri, self._name)
            return df.alias(self._alias) if self._alias else df
        df = self._spark.read.format("delta").load(self._uri)
        return df.alias(self._alias) if self._alias else df

    # ---- DML ------------------------------------------------------------------------

    def delete(self, condition: str | Column | None = None) -> None:
        """Delete the rows where ``condition`` is true (all rows when None), in one commit."""
        args.check_condition(condition)
        if self._remote:
            _remote.delete(self._spark, self._sql_name(), self._alias, condition)
            return
        _delete_update.delete(self._spark, self._uri, self._alias, condition)

    def update(
        self,
        condition: str | Column | None = None,
        set: Mapping[str, str | Column] | None = None,  # delta-spark's argument name
    ) -> None:
        """Set columns (``set``: column -> SQL text or Column) where ``condition`` is true."""
        args.check_assignments(set, "'set'")
        args.check_condition(condition)
        assert set is not None
        if self._remote:
            _remote.update(self._spark, self._sql_name(), self._alias, condition, set)
            return
        _delete_update.update(self._spark, self._uri, self._alias, condition, set)

    def merge(self, source: DataFrame, condition: str | Column) -> _merge_builder.DeltaMergeBuilder:
        """A MERGE of ``source`` into this table on ``condition``; add ``when...`` clauses,
        then ``execute()``. Alias the table with :meth:`alias` and the source with
        ``source.alias("s")`` to name their columns in conditions."""
        from pyspark.sql import DataFrame

        if source is None:
            raise ValueError("'source' in merge cannot be None: pass the DataFrame to merge in.")
        if not isinstance(source, DataFrame):
            raise TypeError(f"Type of 'source' in merge must be DataFrame, not {type(source)}.")
        if condition is None:
            raise ValueError(
                "'condition' in merge cannot be None: pass the join condition, e.g. 't.id = s.id'."
            )
        args.check_condition(condition)
        spec = _merge_builder.MergeSpec(
            self._uri,
            self._alias,
            source,
            condition,
            remote_table=self._sql_name() if self._remote else None,
        )
        return _merge_builder.DeltaMergeBuilder(self._spark, spec)

    # ---- inspection -----------------------------------------------------------------
    # history, detail, vacuum, restore and optimize run delta-spark's SQL statement when
    # the session has deltaflow's SQL extension (so they work the same from a Spark
    # Connect client); otherwise the same rows (commands/_describe.py, _vacuum.py,
    # _maintenance.py) are made here.

    def history(self, limit: int | None = None) -> DataFrame:
        """Commits, newest first, with delta-spark's history columns (DESCRIBE HISTORY)."""
        if limit is not None:
            args.check_int(limit, "limit")
        suffix = "" if limit is None else f" LIMIT {int(limit)}"
        return self._command(
            f"DESCRIBE HISTORY {self._sql_name()}{suffix}",
            lambda: _describe.history(self._uri, limit),
            _describe.HISTORY_SCHEMA,
        )

    def detail(self) -> DataFrame:
        """One row describing the table, with delta-spark's DESCRIBE DETAIL columns."""
        return self._command(
            f"DESCRIBE DETAIL {self._sql_name()}",
            lambda: _describe.detail(self._uri, self._name),
            _describe.DETAIL_SCHEMA,
        )

    # ---- maintenance ----------------------------------------------------------------

    def vacuum(self, retentionHours: float | None = None) -> DataFrame:
        """Delete files no longer referenced and older than the retention (default: the
        table's ``delta.deletedFileRetentionDuration``, 7 days), as ``VACUUM``.

        Staging directories that writes killed before their commit left under
        ``_delta_staging/`` go too, once nothing was written in them for the retention.

        A retention below the table's is refused with :class:`RetentionTooShortError`
        unless the Spark conf ``spark.databricks.delta.retentionDurationCheck.enabled``
        is ``false``, as in delta-spark.
        """
        if retentionHours is not None and (
            isinstance(retentionHours, bool) or not isinstance(retentionHours, (int, float))
        ):
            raise ValueError(
                f"retentionHours needs to be a number but got '{type(retentionHours)}'."
            )
        hours = None if retentionHours is None else float(retentionHours)
        retain = ""
        if hours is not None:
            _vacuum.check_retention_value(self._uri, hours)
            retain = f" RETAIN {hours!r} HOURS"
        check = self._spark.conf.get(_vacuum.RETENTION_CHECK_CONF, "true") or "true"
        return self._command(
            f"VACUUM {self._sql_name()}{retain}",
            lambda: _vacuum.vacuum(
                self._uri, hours, check_retention=check.strip().lower() != "false"
            ),
            _vacuum.VACUUM_SCHEMA,
        )

    def restoreToVersion(self, version: int) -> DataFrame:
        """Make ``version``'s files the table's current ones, in a new commit."""
        args.check_int(version, "version")
        return self._command(
            f"RESTORE TABLE {self._sql_name()} TO VERSION AS OF {int(version)}",
            lambda: _maintenance.restore(self._uri, version=int(version)),
            _maintenance.RESTORE_SCHEMA,
        )

    def restoreToTimestamp(self, timestamp: str | dt.datetime) -> DataFrame:
        """Restore the latest version committed at or before ``timestamp`` (as
        timestampAsOf; a naive timestamp is UTC)."""
        if not isinstance(timestamp, dt.datetime):
            args.check_str(timestamp, "timestamp")
        if self._remote:
            return _remote.restore_to_timestamp(self._spark, self._sql_name(), timestamp)
        return self.restoreToVersion(load_snapshot(self._uri, timestamp=timestamp).version)

    def clone(
        self,
        target: str,
        isShallow: bool,
        replace: bool = False,
        properties: Mapping[str, str] | None = None,
    ) -> DeltaTable:
        """A shallow clone of the table's latest version at ``target`` (a catalog table
        name, or a path), as ``CREATE TABLE <target> SHALLOW CLONE``; the clone's table."""
        return self._clone("", target, isShallow, replace, properties)

    def cloneAtVersion(
        self,
        version: int,
        target: str,
        isShallow: bool,
        replace: bool = False,
        properties: Mapping[str, str] | None = None,
    ) -> DeltaTable:
        """:meth:`clone` of ``version``."""
        args.check_int(version, "version")
        return self._clone(f" VERSION AS OF {int(version)}", target, isShallow, replace, properties)

    def cloneAtTimestamp(
        self,
        timestamp: str,
        target: str,
        isShallow: bool,
        replace: bool = False,
        properties: Mapping[str, str] | None = None,
    ) -> DeltaTable:
        """:meth:`clone` of the latest version committed at or before ``timestamp``."""
        args.check_str(timestamp, "timestamp")
        return self._clone(
            f" TIMESTAMP AS OF {_sql_string(timestamp)}", target, isShallow, replace, properties
        )

    def _clone(
        self,
        as_of: str,
        target: str,
        shallow: bool,
        replace: bool,
        properties: Mapping[str, str] | None,
    ) -> DeltaTable:
        args.check_str(target, "target")
        if not shallow:
            raise UnsupportedFeatureError(
                f"A deep clone of {self._sql_name()} would copy its data files, which deltaflow"
                " does not do (nor does delta-spark): pass isShallow=True.",
                table_uri=self._uri,
                feature="deepClone",
            )
        by_path = "/" in target or "://" in target
        name = "delta.`" + target.replace("`", "``") + "`" if by_path else target
        pairs = ", ".join(
            f"{_sql_string(k)} = {_sql_string(v)}" for k, v in (properties or {}).items()
        )
        statement = (
            f"CREATE {'OR REPLACE ' if replace else ''}TABLE {name} SHALLOW CLONE"
            f" {self._sql_name()}{as_of}{f' TBLPROPERTIES ({pairs})' if pairs else ''}"
        )
        if not (self._remote or _has_sql_extension(self._spark)):
            raise UnsupportedFeatureError(
                f"{statement}: cloning runs as SQL, and this session lacks deltaflow's SQL"
                " extension. Start it with deltaflow.session() or deltaflow.spark_conf().",
                table_uri=self._uri,
                feature="sqlExtension",
            )
        _remote.run(self._spark, statement).collect()
        if by_path:
            return DeltaTable.forPath(self._spark, target)
        return DeltaTable.forName(self._spark, target)

    def generate(self, mode: str) -> None:
        """Write the manifest files ``mode`` names (``"symlink_format_manifest"``:
        ``_symlink_format_manifest/``, for Presto / Athena), as ``GENERATE``."""
        args.check_str(mode, "mode")
        self._command(
            f"GENERATE {mode} FOR TABLE {self._sql_name()}",
            lambda: _generate(self._uri, mode),
            "path string",
        )

    # ---- protocol -------------------------------------------------------------------
    # Run as ALTER TABLE ... SET TBLPROPERTIES, which deltaflow's catalog commits (the
    # same brain call without the SQL extension), so they work from Spark Connect too.

    def upgradeTableProtocol(self, readerVersion: int, writerVersion: int) -> None:
        """Raise the table's protocol to at least (``readerVersion``, ``writerVersion``).

        Versions only go up: a lower version than the table's is kept as it is (no
        downgrade, no error), as in delta-spark.
        """
        if not isinstance(readerVersion, int) or isinstance(readerVersion, bool):
            raise ValueError(
                f"The readerVersion needs to be an integer but got '{type(readerVersion)}'."
            )
        if not isinstance(writerVersion, int) or isinstance(writerVersion, bool):
            raise ValueError(
                f"The writerVersion needs to be an integer but got '{type(writerVersion)}'."
            )
        if self._remote:
            reader, writer = _remote.protocol_versions(self._spark, self._sql_name())
        else:
            snapshot = load_snapshot(self._uri)
            reader, writer = snapshot.min_reader_version, snapshot.min_writer_version
        changes: dict[str, str] = {}
        if readerVersion > reader:
            changes["delta.minReaderVersion"] = str(readerVersion)
        if writerVersion > writer:
            changes["delta.minWriterVersion"] = str(writerVersion)
        if changes:
            self._set_properties(changes)

    def addFeatureSupport(self, featureName: str) -> None:
        """Add table feature ``featureName`` to the protocol (upgrading a legacy protocol
        to writer version 7, and reader 3 for a reader-writer feature), as
        ``SET TBLPROPERTIES ('delta.feature.<name>' = 'supported')``.

        A feature deltaflow cannot write (or does not know) is refused with
        ``UnsupportedFeatureError`` listing the ones it can add.
        """
        args.check_str(featureName, "featureName")
        self._set_properties({f"delta.feature.{featureName}": "supported"})

    def dropFeatureSupport(self, featureName: str, truncateHistory: bool | None = None) -> None:
        """Drop table feature ``featureName`` from the protocol, which is normalized to
        its weakest form (``DROP FEATURE`` in history). deltaflow drops
        ``checkConstraints`` once no CHECK constraint is left; other features are refused
        with a typed error saying why and what to do (:mod:`deltaflow.spark.dml._features`).
        Needs a local table (deltaflow's own commit writer)."""
        args.check_str(featureName, "featureName")
        if truncateHistory is not None:
            args.check_bool(truncateHistory, "truncateHistory")
        from deltaflow.spark.dml import _features

        if self._remote:
            raise UnsupportedFeatureError(
                f"dropFeatureSupport({featureName!r}) on {self._sql_name()}: on a Spark Connect"
                " session DeltaTable runs SQL on the server, and deltaflow's SQL has no"
                " ALTER TABLE ... DROP FEATURE yet. Run it from a classic PySpark session"
                " (deltaflow.session()) on the server's machine.",
                table_uri=self._uri,
                feature=featureName,
            )
        snapshot = load_snapshot(self._uri)
        _features.drop_feature(snapshot, featureName, truncateHistory, self._sql_name())

    def optimize(self) -> DeltaOptimizeBuilder:
        """A builder for OPTIMIZE: ``.where(partitionFilter)``, then ``executeCompaction()``
        or ``executeZOrderBy(*cols)``."""
        return DeltaOptimizeBuilder(self)

    def setProperties(self, properties: Mapping[str, str]) -> None:
        """Set table properties (``delta.*`` and custom) in one commit.

        deltaflow's stand-in for ``ALTER TABLE ... SET TBLPROPERTIES``, which Spark
        accepts but never passes to a Python data source.
        """
        from deltaflow.spark._options import TABLE_PROPERTIES

        canonical = {p.lower(): p for p in TABLE_PROPERTIES}
        values = {canonical.get(k.lower(), k): str(v) for k, v in properties.items()}
        if self._remote:
            _remote.set_properties(self._spark, self._sql_name(), values)
            return
        table = self._writable()
        table.alter.set_table_properties(
            values,
            raise_if_not_exists=False,
            post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
        )
        _log_upkeep.after_commit(
            self._uri, table.version(), configuration=table.metadata().configuration
        )

    # ---- internals ------------------------------------------------------------------

    def _sql_name(self) -> str:
        """The table in a SQL statement: its catalog name (forName), else its path."""
        return self._name or "delta.`" + self._uri.replace("`", "``") + "`"

    def _command(
        self, statement: str, rows: Callable[[], list[tuple[Any, ...]]], schema: str
    ) -> DataFrame:
        """``statement``'s result, run as SQL when the session knows Delta's statements
        (always on Spark Connect), else ``rows()`` (the same rows) as a DataFrame of
        ``schema``."""
        if self._remote:
            return _remote.run(self._spark, statement)
        if not _has_sql_extension(self._spark):
            return self._spark.createDataFrame(rows(), schema)
        return _remote.run(self._spark, statement)

    def _set_properties(self, properties: dict[str, str]) -> None:
        """``ALTER TABLE ... SET TBLPROPERTIES`` (one commit): as SQL when the session has
        deltaflow's SQL extension, else the same brain call the catalog makes."""
        if self._remote:
            _remote.set_properties(self._spark, self._sql_name(), properties)
            return
        if _has_sql_extension(self._spark):
            pairs = ", ".join(f"{_sql_string(k)} = {_sql_string(v)}" for k, v in properties.items())
            _remote.run(self._spark, f"ALTER TABLE {self._sql_name()} SET TBLPROPERTIES ({pairs})")
            return
        from deltaflow.spark.catalog import _alter

        changes = [{"op": "setProperty", "key": k, "value": v} for k, v in properties.items()]
        _alter.alter_from_catalog({"uri": self._uri, "name": self._name, "changes": changes})

    def _writable(self) -> _DeltaRsTable:
        return _DeltaRsTable(_uri.delta_rs_uri(self._uri))

    def __repr__(self) -> str:
        return f"DeltaTable({self._name or self._uri!r})"


class DeltaOptimizeBuilder:
    """OPTIMIZE through delta-rs: bin-packing or Z-order, optionally on some partitions.

    Both commit with ``dataChange=false`` (streams reading the table ignore them) and
    return delta-spark's ``(path, metrics)`` DataFrame.
    """

    def __init__(self, table: DeltaTable, partition_filter: str | None = None) -> None:
        self._table = table
        self._filter = partition_filter

    def where(self, partitionFilter: str) -> DeltaOptimizeBuilder:
        args.check_type(partitionFilter, "partitionFilter", "a SQL predicate (str)")
        return DeltaOptimizeBuilder(self._table, partitionFilter)

    def executeCompaction(self) -> DataFrame:
        return self._execute([])

    def executeZOrderBy(self, *cols: str | list[str]) -> DataFrame:
        columns = args.column_names(cols, "Z-order column must be str.")
        return self._execute(columns)

    def _execute(self, columns: list[str]) -> DataFrame:
        table = self._table
        statement = f"OPTIMIZE {table._sql_name()}"
        if self._filter is not None:
            statement += f" WHERE {self._filter}"
        if columns:
            quoted = ", ".join("`" + c.replace("`", "``") + "`" for c in columns)
            statement += f" ZORDER BY ({quoted})"
        return table._command(
            statement,
            lambda: _maintenance.optimize(table._uri, where=self._filter, zorder_by=columns),
            _maintenance.OPTIMIZE_SCHEMA,
        )


def _has_sql_extension(spark: SparkSession) -> bool:
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return SQL_EXTENSION in [e.strip() for e in extensions.split(",")]


def _generate(uri: str, mode: str) -> list[tuple[Any, ...]]:
    _convert.generate(uri, mode)
    return []


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _path_identifier(identifier: str, formats: tuple[str, ...] = ("delta",)) -> str | None:
    """The path of ``<format>.`/path``` (one of ``formats``), else None."""
    head, dot, rest = identifier.strip().partition(".")
    if not dot or head.lower() not in formats:
        return None
    if len(rest) >= 2 and rest[0] == "`" and rest[-1] == "`":
        return rest[1:-1].replace("``", "`")
    return None


def _partition_ddl(schema: str | StructType | None) -> str | None:
    """convertToDelta's ``partitionSchema`` as ``col type, ...`` DDL."""
    from pyspark.sql.types import StructType

    if schema is None:
        return None
    if isinstance(schema, str):
        return schema
    if isinstance(schema, StructType):
        return ", ".join(
            "`" + f.name.replace("`", "``") + "` " + f.dataType.simpleString() for f in schema
        )
    raise TypeError(
        f"partitionSchema must be a DDL string ('part int') or a StructType, not {type(schema)}."
    )
