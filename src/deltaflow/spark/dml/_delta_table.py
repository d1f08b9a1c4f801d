"""``deltaflow.DeltaTable``: delta-spark's ``delta.tables.DeltaTable`` for deltaflow.

Same method names and arguments as delta-spark's Python API. DELETE, UPDATE and MERGE run
as Spark jobs (``_dml``, ``_merge``); history, detail, vacuum, restore, optimize and table
properties go through delta-rs on the driver. Conditions and values accept SQL
strings and Columns.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable as _DeltaRsTable

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.catalog import _create
from deltaflow.spark.dml import _delete_update, _merge_builder
from deltaflow.spark.errors import RetentionTooShortError
from deltaflow.spark.write._native import delete_stale_staging
from deltaflow.table import _partitions, _predicates, _uri
from deltaflow.table._snapshot import Snapshot, load_snapshot, table_exists
from deltaflow.table.errors import TableNotFoundError, VersionNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaflow.spark.catalog._create import DeltaTableBuilder

# delta-spark's conf that lets VACUUM keep removed files for less than the table's
# retention; the check protects readers and lagging streams that still need them.
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
DEFAULT_RETENTION_HOURS = 168.0  # delta.deletedFileRetentionDuration default: 7 days

_HISTORY_SCHEMA = (
    "version long, timestamp timestamp, userId string, userName string, operation string,"
    " operationParameters map<string,string>,"
    " job struct<jobId:string,jobName:string,jobRunId:string,runId:string,jobOwnerId:string,"
    "triggerType:string>,"
    " notebook struct<notebookId:string>, clusterId string, readVersion long,"
    " isolationLevel string, isBlindAppend boolean, operationMetrics map<string,string>,"
    " userMetadata string, engineInfo string"
)
_DETAIL_SCHEMA = (
    "format string, id string, name string, description string, location string,"
    " createdAt timestamp, lastModified timestamp, partitionColumns array<string>,"
    " clusteringColumns array<string>, numFiles long, sizeInBytes long,"
    " properties map<string,string>, minReaderVersion int, minWriterVersion int,"
    " tableFeatures array<string>"
)
_FILE_STATS = "struct<min:long,max:long,avg:double,totalFiles:long,totalSize:long>"
_OPTIMIZE_SCHEMA = (
    f"path string, metrics struct<numFilesAdded:long,numFilesRemoved:long,"
    f"filesAdded:{_FILE_STATS},filesRemoved:{_FILE_STATS},partitionsOptimized:long,"
    f"zOrderStats:struct<strategyName:string,inputCubeFiles:struct<num:long,size:long>>,"
    f"numBatches:long,totalConsideredFiles:long,totalFilesSkipped:long,"
    f"preserveInsertionOrder:boolean>"
)
_RESTORE_SCHEMA = (
    "table_size_after_restore long, num_of_files_after_restore long, num_removed_files long,"
    " num_restored_files long, removed_files_size long, restored_files_size long"
)
# Features implied by legacy protocol versions, for detail().tableFeatures.
_LEGACY_WRITER_FEATURES = {
    2: ("appendOnly", "invariants"),
    3: ("checkConstraints",),
    4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",),
    6: ("identityColumns",),
}


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

    def history(self, limit: int | None = None) -> DataFrame:
        """Commits, newest first, with delta-spark's history columns (see the README)."""
        rows = [_history_row(c) for c in self._snapshot().history(limit)]
        rows.sort(key=lambda r: r[0], reverse=True)
        return self._spark.createDataFrame(rows, _HISTORY_SCHEMA)

    def detail(self) -> DataFrame:
        """One row describing the table, with delta-spark's DESCRIBE DETAIL columns."""
        snapshot = self._snapshot()
        metadata = snapshot.delta_table.metadata()
        files = snapshot.files()
        last = snapshot.history(1)
        row: tuple[Any, ...] = (
            "delta",
            metadata.id,
            self._name,
            metadata.description,
            snapshot.uri,
            _timestamp(metadata.created_time),
            _timestamp(last[0]["timestamp"]) if last else None,
            list(snapshot.partition_columns),
            [],
            len(files),
            sum(f.size for f in files),
            {k: v for k, v in snapshot.configuration.items() if v is not None},
            snapshot.min_reader_version,
            snapshot.min_writer_version,
            _table_features(snapshot),
        )
        return self._spark.createDataFrame([row], _DETAIL_SCHEMA)

    # ---- maintenance ----------------------------------------------------------------

    def vacuum(self, retentionHours: float | None = None) -> DataFrame:
        """Delete files no longer referenced and older than the retention (default: the
        table's ``delta.deletedFileRetentionDuration``, 7 days).

        Staging directories that writes killed before their commit left under
        ``_delta_staging/`` go too, once nothing was written in them for the retention.

        A retention below the table's is refused with :class:`RetentionTooShortError`
        unless the Spark conf ``spark.databricks.delta.retentionDurationCheck.enabled``
        is ``false``, as in delta-spark.
        """
        snapshot = self._snapshot()
        minimum = retention_hours(snapshot.configuration)
        check = self._spark.conf.get(RETENTION_CHECK_CONF, "true").lower() != "false"
        if retentionHours is not None and retentionHours < 0:
            raise InvalidOptionError(
                f"vacuum retentionHours must not be negative, got {retentionHours}.",
                option="retentionHours",
            )
        if check and retentionHours is not None and retentionHours < minimum:
            raise RetentionTooShortError(
                f"VACUUM of {snapshot.uri} with a retention of {retentionHours} hours is below"
                f" the table's {minimum:g} hours: files that running queries or lagging streams"
                f" still need could be deleted. If you are sure, set the Spark conf"
                f" {RETENTION_CHECK_CONF}=false.",
                table_uri=snapshot.uri,
                retention_hours=float(retentionHours),
                minimum_hours=minimum,
            )
        # delta-rs takes whole hours; rounding up keeps files at least as long as asked.
        hours = None if retentionHours is None else math.ceil(retentionHours)
        self._writable().vacuum(
            retention_hours=hours, dry_run=False, enforce_retention_duration=check
        )
        # delta-rs leaves _-prefixed directories alone, so the staging directories of
        # writes killed before their commit are ours to remove, by the same retention.
        delete_stale_staging(snapshot.uri, minimum if hours is None else hours)
        return self._spark.createDataFrame([(snapshot.uri,)], "path string")

    def restoreToVersion(self, version: int) -> DataFrame:
        """Make ``version``'s files the table's current ones, in a new commit."""
        return self._restore(version)

    def restoreToTimestamp(self, timestamp: str | dt.datetime) -> DataFrame:
        """Restore the latest version committed at or before ``timestamp`` (as timestampAsOf)."""
        return self._restore(load_snapshot(self._uri, timestamp=timestamp).version)

    def _restore(self, version: int) -> DataFrame:
        before = self._snapshot()
        if not 0 <= version < before.version:
            raise VersionNotFoundError(
                f"Cannot restore {self._uri} to version {version}: restore needs a version below"
                f" the latest ({before.version}).",
                table_uri=self._uri,
                version=version,
                latest=before.version,
            )
        target = {f.path: f.size for f in load_snapshot(self._uri, version=version).files()}
        current = {f.path: f.size for f in before.files()}
        self._writable().restore(version)
        removed = {p: s for p, s in current.items() if p not in target}
        restored = {p: s for p, s in target.items() if p not in current}
        row = (
            sum(target.values()),
            len(target),
            len(removed),
            len(restored),
            sum(removed.values()),
            sum(restored.values()),
        )
        return self._spark.createDataFrame([row], _RESTORE_SCHEMA)

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

    def _snapshot(self) -> Snapshot:
        return load_snapshot(self._uri)

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
        filters = self._partition_filters()
        metrics = self._table._writable().optimize.compact(partition_filters=filters)
        return self._result(metrics)

    def executeZOrderBy(self, *cols: str) -> DataFrame:
        columns = [c for group in cols for c in ([group] if isinstance(group, str) else group)]
        filters = self._partition_filters()
        metrics = self._table._writable().optimize.z_order(columns, partition_filters=filters)
        return self._result(metrics)

    def _partition_filters(self) -> list[tuple[str, str, Any]] | None:
        if self._filter is None:
            return None
        snapshot = self._table._snapshot()
        return partition_filters(snapshot, self._filter)

    def _result(self, metrics: dict[str, Any]) -> DataFrame:
        def stats(value: Any) -> tuple[Any, ...] | None:
            data = json.loads(value) if isinstance(value, str) else value
            if not data:
                return None
            keys = ("min", "max", "avg", "totalFiles", "totalSize")
            return tuple(float(data[k]) if k == "avg" else data.get(k) for k in keys)

        row = (
            self._table._uri,
            (
                metrics.get("numFilesAdded", 0),
                metrics.get("numFilesRemoved", 0),
                stats(metrics.get("filesAdded")),
                stats(metrics.get("filesRemoved")),
                metrics.get("partitionsOptimized", 0),
                None,
                metrics.get("numBatches", 0),
                metrics.get("totalConsideredFiles", 0),
                metrics.get("totalFilesSkipped", 0),
                metrics.get("preserveInsertionOrder", True),
            ),
        )
        return self._table._spark.createDataFrame([row], _OPTIMIZE_SCHEMA)


def partition_filters(snapshot: Snapshot, predicate: str) -> list[tuple[str, str, Any]]:
    """An OPTIMIZE ``where`` (a conjunction on partition columns) as delta-rs filters."""
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    out: list[tuple[str, str, Any]] = []

    def invalid(detail: str) -> InvalidOptionError:
        return InvalidOptionError(
            f"OPTIMIZE where '{predicate}' on {snapshot.uri}: {detail}. Use comparisons and IN"
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
            raise invalid(f"'{operand.path[0]}' is not a partition column")
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


def retention_hours(configuration: Mapping[str, str | None]) -> float:
    """The table's ``delta.deletedFileRetentionDuration`` in hours (168 when unset)."""
    raw = configuration.get("delta.deletedFileRetentionDuration")
    match = re.fullmatch(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*", (raw or "").lower())
    if match is None:
        return DEFAULT_RETENTION_HOURS
    per_unit = {"week": 168.0, "day": 24.0, "hour": 1.0, "minute": 1 / 60, "second": 1 / 3600}
    unit = match.group(2).rstrip("s")
    if unit not in per_unit:
        return DEFAULT_RETENTION_HOURS
    return float(match.group(1)) * per_unit[unit]


def _history_row(commit: dict[str, Any]) -> tuple[Any, ...]:
    operation = commit.get(_delete_update.OPERATION_KEY) or commit.get("operation")
    return (
        commit.get("version"),
        _timestamp(commit.get("timestamp")),
        commit.get("userId"),
        commit.get("userName"),
        operation,
        _string_map(commit.get("operationParameters")),
        None,
        None,
        commit.get("clusterId"),
        commit.get("readVersion"),
        commit.get("isolationLevel"),
        commit.get("isBlindAppend"),
        _string_map(commit.get("operationMetrics")),
        commit.get("userMetadata"),
        commit.get("engineInfo"),
    )


def _string_map(values: Any) -> dict[str, str] | None:
    if not isinstance(values, dict):
        return None
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def _timestamp(ms: Any) -> dt.datetime | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.timezone.utc)


def _table_features(snapshot: Snapshot) -> list[str]:
    features = set(snapshot.reader_features) | set(snapshot.writer_features)
    if snapshot.min_writer_version < 7:
        for version, implied in _LEGACY_WRITER_FEATURES.items():
            if snapshot.min_writer_version >= version:
                features.update(implied)
    if snapshot.min_reader_version == 2:
        features.add("columnMapping")
    return sorted(features)
