"""``spark.read.format("delta").load(...)``: checked on the driver, scanned by the JVM when it can.

``install()`` teaches ``DataFrameReader`` two things for the ``delta`` format:

- **Typed errors where the user called.** ``load()`` parses the options and loads
  the snapshot in the user's process, so ``TableNotFoundError``,
  ``VersionNotFoundError`` and ``InvalidOptionError`` are raised as themselves,
  not wrapped in a Py4J error from a Python worker.
- **A JVM fast path.** When Spark's Parquet scan reads the snapshot exactly (see
  :mod:`deltaflow.spark._native_read`), ``load()`` returns
  ``spark.read.parquet`` over the snapshot's files, columns in the table's order;
  otherwise the ``delta`` Python source reads it. The Spark conf
  ``deltaflow.read.nativeScan`` = ``auto`` (default) | ``false`` chooses.

The JVM path reads exactly the snapshot the driver loaded. The Python source
resolves ``path`` / ``versionAsOf`` / ``timestampAsOf`` again in its own
``schema()`` call, so a latest-version read racing a commit may see the newer
version there (as it did before this patch).

Other formats go through untouched. The patch is idempotent and keeps every
original method; user-specified schemas and multi-path loads take the Python
source as before.
"""

from __future__ import annotations

import logging
from typing import Any

from deltaflow.spark._native_read import (
    NATIVE_SCAN_CONF,
    Fallback,
    NativeScan,
    native_scan_mode,
    plan_native_scan,
)
from deltaflow.spark._options import ReadOptions, parse_read_options
from deltaflow.table import _uri
from deltaflow.table._snapshot import Snapshot, load_snapshot

log = logging.getLogger("deltaflow.scan")

_STATE = "_deltaflow_read_state"
_INSTALLED = "_deltaflow_read_installed"


def _state(reader: Any) -> dict[str, Any]:
    state = reader.__dict__.get(_STATE)
    if state is None:
        state = {"format": None, "schema": None, "options": {}}
        reader.__dict__[_STATE] = state
    return state


def install() -> None:
    """Patch ``pyspark.sql.DataFrameReader`` (classic, not Spark Connect); idempotent."""
    from pyspark.sql.readwriter import DataFrameReader

    if getattr(DataFrameReader, _INSTALLED, False):
        return
    original_format = DataFrameReader.format
    original_schema = DataFrameReader.schema
    original_option = DataFrameReader.option
    original_options = DataFrameReader.options
    original_load = DataFrameReader.load

    def format(self: Any, source: str) -> Any:
        _state(self)["format"] = source
        return original_format(self, source)

    def schema(self: Any, schema: Any) -> Any:
        _state(self)["schema"] = schema
        return original_schema(self, schema)

    def option(self: Any, key: str, value: Any) -> Any:
        if value is not None:
            _state(self)["options"][key] = _to_str(value)
        return original_option(self, key, value)

    def options(self: Any, **opts: Any) -> Any:
        for key, value in opts.items():
            if value is not None:
                _state(self)["options"][key] = _to_str(value)
        return original_options(self, **opts)

    def load(
        self: Any,
        path: Any = None,
        format: str | None = None,
        schema: Any = None,
        **opts: Any,
    ) -> Any:
        if format is not None:
            self.format(format)
        if schema is not None:
            self.schema(schema)
        self.options(**opts)
        state = _state(self)
        if (state["format"] or "").lower() == "delta":
            native = _load_delta(self, state, path)
            if native is not None:
                return native
        return original_load(self, path)

    DataFrameReader.format = format
    DataFrameReader.schema = schema
    DataFrameReader.option = option
    DataFrameReader.options = options
    DataFrameReader.load = load
    setattr(DataFrameReader, _INSTALLED, True)


def _load_delta(reader: Any, state: dict[str, Any], path: Any) -> Any:
    """The JVM DataFrame for this delta read, or None for the Python source.

    Raises deltaflow's typed errors for bad options and missing tables or versions.
    """
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return None
        path = path[0]
    options = dict(state["options"])
    if path is not None:
        options["path"] = path
    read = parse_read_options(options)
    snapshot = load_snapshot(
        _uri.normalize_uri(read.path), version=read.version_as_of, timestamp=read.timestamp_as_of
    )
    if read.read_change_feed:
        _check_change_feed(snapshot, read)
        return None
    spark = reader._spark
    if native_scan_mode(spark.conf.get(NATIVE_SCAN_CONF, "auto")) == "false":
        return None
    if state["schema"] is not None:
        _log_fallback(snapshot, "a user-specified schema")
        return None
    plan = plan_native_scan(snapshot)
    if isinstance(plan, Fallback):
        _log_fallback(snapshot, plan.reason)
        return None
    log.info(
        "deltaflow scan of %s v%d: JVM Parquet scan of %d files",
        snapshot.uri,
        snapshot.version,
        len(plan.file_uris),
    )
    return native_dataframe(spark, plan)


def _check_change_feed(snapshot: Snapshot, read: ReadOptions) -> None:
    """Raise the change feed's typed errors (range, feed not recorded, vacuumed files)
    here, where the user called; the Python source then plans the same range again."""
    from deltaflow.spark._cdf import plan_batch_changes
    from deltaflow.table._cdf import check_files_exist

    changes = plan_batch_changes(snapshot, read)
    check_files_exist(snapshot.uri, changes)
    log.info(
        "deltaflow change feed of %s: %d change files, Python source", snapshot.uri, len(changes)
    )


def native_dataframe(spark: Any, plan: NativeScan) -> Any:
    """``spark.read.parquet`` over the plan's files, columns in the Delta schema's order."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(plan.schema)
    if not plan.file_uris:
        return spark.createDataFrame([], schema)
    df = spark.read.schema(schema).option("basePath", plan.root).parquet(*plan.file_uris)
    # Spark puts partition columns last; the Delta schema may not.
    if df.columns != schema.fieldNames():
        df = df.select(*[F.col(_quote(name)) for name in schema.fieldNames()])
    return df


def _to_str(value: Any) -> str:
    # pyspark's own to_str: booleans as Spark spells them.
    return str(value).lower() if isinstance(value, bool) else str(value)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _log_fallback(snapshot: Snapshot, reason: str) -> None:
    log.info("deltaflow scan of %s v%d: Python source (%s)", snapshot.uri, snapshot.version, reason)
