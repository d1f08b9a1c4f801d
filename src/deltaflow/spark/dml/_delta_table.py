"""``deltaflow.DeltaTable``: delta-spark's ``delta.tables.DeltaTable`` for deltaflow.

Same method names and arguments as delta-spark's Python API. DELETE, UPDATE and MERGE run
as Spark jobs (``_dml``, ``_merge``); history, detail, vacuum, restore and optimize run
Delta's SQL statements (``DESCRIBE HISTORY``, ``VACUUM``, ...), whose work is done by
``spark/commands/`` through delta-rs; table properties go through delta-rs on the driver.
Conditions and values accept SQL strings and Columns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable as _DeltaRsTable

from deltaflow.errors import typed_error
from deltaflow.spark.catalog import _create
from deltaflow.spark.commands import _maintenance
from deltaflow.spark.dml import _delete_update, _merge_builder
from deltaflow.table import _uri
from deltaflow.table._snapshot import load_snapshot, table_exists
from deltaflow.table.errors import TableNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

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

    # ---- construction ---------------------------------------------------------------

    @classmethod
    def forPath(
        cls, sparkSession: SparkSession, path: str, hadoopConf: Mapping[str, str] | None = None
    ) -> DeltaTable:
        """The Delta table at ``path``; ``TableNotFoundError`` when there is none."""
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
        spark = sparkOrSQLContext
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
        return table_exists(_uri.normalize_uri(identifier))

    def alias(self, aliasName: str) -> DeltaTable:
        """This table under ``aliasName``, for conditions such as ``"t.id = 1"``."""
        return DeltaTable(self._spark, self._uri, name=self._name, alias=aliasName)

    def toDF(self) -> DataFrame:
        df = self._spark.read.format("delta").load(self._uri)
        return df.alias(self._alias) if self._alias else df

    # ---- DML ------------------------------------------------------------------------

    def delete(self, condition: str | Column | None = None) -> None:
        """Delete the rows where ``condition`` is true (all rows when None), in one commit."""
        _delete_update.delete(self._spark, self._uri, self._alias, condition)

    def update(
        self,
        condition: str | Column | None = None,
        set: Mapping[str, str | Column] | None = None,  # delta-spark's argument name
    ) -> None:
        """Set columns (``set``: column -> SQL text or Column) where ``condition`` is true."""
        _delete_update.update(self._spark, self._uri, self._alias, condition, set or {})

    def merge(self, source: DataFrame, condition: str | Column) -> _merge_builder.DeltaMergeBuilder:
        """A MERGE of ``source`` into this table on ``condition``; add ``when...`` clauses,
        then ``execute()``. Alias the table with :meth:`alias` and the source with
        ``source.alias("s")`` to name their columns in conditions."""
        spec = _merge_builder.MergeSpec(self._uri, self._alias, source, condition)
        return _merge_builder.DeltaMergeBuilder(self._spark, spec)

    # ---- inspection -----------------------------------------------------------------
    # history, detail, vacuum, restore and optimize run delta-spark's SQL statement when
    # the session has deltaflow's SQL extension (so they work the same from a Spark
    # Connect client); otherwise the same rows (commands/_maintenance.py) are made here.

    def history(self, limit: int | None = None) -> DataFrame:
        """Commits, newest first, with delta-spark's history columns (DESCRIBE HISTORY)."""
        suffix = "" if limit is None else f" LIMIT {int(limit)}"
        return self._command(
            f"DESCRIBE HISTORY {self._sql_name()}{suffix}",
            lambda: _maintenance.history(self._uri, limit),
            _maintenance.HISTORY_SCHEMA,
        )

    def detail(self) -> DataFrame:
        """One row describing the table, with delta-spark's DESCRIBE DETAIL columns."""
        return self._command(
            f"DESCRIBE DETAIL {self._sql_name()}",
            lambda: _maintenance.detail(self._uri, self._name),
            _maintenance.DETAIL_SCHEMA,
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
        hours = None if retentionHours is None else float(retentionHours)
        retain = ""
        if hours is not None:
            _maintenance.check_retention_value(self._uri, hours)
            retain = f" RETAIN {hours!r} HOURS"
        check = self._spark.conf.get(_maintenance.RETENTION_CHECK_CONF, "true") or "true"
        return self._command(
            f"VACUUM {self._sql_name()}{retain}",
            lambda: _maintenance.vacuum(
                self._uri, hours, check_retention=check.strip().lower() != "false"
            ),
            _maintenance.VACUUM_SCHEMA,
        )

    def restoreToVersion(self, version: int) -> DataFrame:
        """Make ``version``'s files the table's current ones, in a new commit."""
        return self._command(
            f"RESTORE TABLE {self._sql_name()} TO VERSION AS OF {int(version)}",
            lambda: _maintenance.restore(self._uri, version=int(version)),
            _maintenance.RESTORE_SCHEMA,
        )

    def restoreToTimestamp(self, timestamp: str | dt.datetime) -> DataFrame:
        """Restore the latest version committed at or before ``timestamp`` (as
        timestampAsOf; a naive timestamp is UTC)."""
        return self.restoreToVersion(load_snapshot(self._uri, timestamp=timestamp).version)

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
        self._writable().alter.set_table_properties(values, raise_if_not_exists=False)

    # ---- internals ------------------------------------------------------------------

    def _sql_name(self) -> str:
        """The table in a SQL statement: its catalog name (forName), else its path."""
        return self._name or "delta.`" + self._uri.replace("`", "``") + "`"

    def _command(
        self, statement: str, rows: Callable[[], list[tuple[Any, ...]]], schema: str
    ) -> DataFrame:
        """``statement``'s result, run as SQL when the session knows Delta's statements,
        else ``rows()`` (the same rows) as a DataFrame of ``schema``."""
        if not _has_sql_extension(self._spark):
            return self._spark.createDataFrame(rows(), schema)
        try:
            return self._spark.sql(statement)
        except Exception as exc:
            error = typed_error(exc)
            if error is None:
                raise
            raise error from None

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
        return DeltaOptimizeBuilder(self._table, partitionFilter)

    def executeCompaction(self) -> DataFrame:
        return self._execute([])

    def executeZOrderBy(self, *cols: str | list[str]) -> DataFrame:
        columns = [c for group in cols for c in ([group] if isinstance(group, str) else group)]
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
