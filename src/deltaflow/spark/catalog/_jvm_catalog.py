"""Calls to the connector's catalog helpers (``DeltaCatalog.scala``, ``TableDefaults.scala``)
that stand in for a SQL statement or a walk of Spark objects through py4j.

Each py4j call is a round trip (0.1 to 1 ms, more on a loaded machine), and a SQL statement
is parsed, analysed and planned; a table's creation made dozens of each. Every helper
here does one call with the same outcome, and falls back to the public API where there
is no JVM session (Spark Connect) or the answer could differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# delta-spark's session defaults for new tables' properties (``TableDefaults.scala`` is
# the connector's side of the same rule).
DEFAULTS_PREFIX = "spark.databricks.delta.properties.defaults."

# (gateway, class) per class name: resolving `jvm.io.deltaflow.spark.X` is one round trip
# per name part.
_classes: dict[str, tuple[Any, Any]] = {}
_CATALOG = "io.deltaflow.spark.DeltaCatalog"
_DEFAULTS = "io.deltaflow.spark.TableDefaults"
_ACCESS = "org.apache.spark.sql.deltaflow.CatalogAccess"


def _connector(spark: SparkSession, name: str) -> Any:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    cached = _classes.get(name)
    if cached is None or cached[0] is not jvm:
        found = jvm
        for part in name.split("."):
            found = getattr(found, part)
        cached = (jvm, found)
        _classes[name] = cached
    return cached[1]


def create_database_if_missing(spark: SparkSession, name: str) -> None:
    """``CREATE DATABASE IF NOT EXISTS `name``` in one call to the session catalog (the
    namespace the statement creates: default location, the current user as owner), where
    the statement is parsed, analysed and planned (~15 ms)."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is not None:
        done = _connector(spark, _ACCESS).createDatabaseIfMissing(jsession, name)
        if done is not None:
            return
    if not spark.catalog.databaseExists(name):
        quoted = name.replace("`", "``")
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{quoted}`")


def register_external(spark: SparkSession, name: str, uri: str, *, managed: bool = False) -> bool:
    """Catalog table ``name`` for the Delta table whose log is at ``uri``: the entry
    ``CREATE TABLE <name> USING delta LOCATION '<uri>'`` makes (external, same shape), in
    one call to the connector's catalog instead of a statement parsed, analysed and
    planned, which also reads the log back (tens of ms). An existing entry is a
    :class:`TableAlreadyExistsError`. False, nothing done, where there is no such call
    (Spark Connect, another ``spark_catalog``, a name in another catalog): run the
    statement. ``managed``: the managed entry of the table just written at ``uri``, the
    managed location (which a ``CREATE TABLE`` statement would refuse, as it now holds
    files)."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        return False
    from deltaflow.errors import raising_typed

    with raising_typed(keep_cause=False):
        return bool(_connector(spark, _CATALOG).registerTable(jsession, name, uri, managed))


def table_in_catalog(spark: SparkSession, name: str) -> bool:
    """``spark.catalog.tableExists(name)``; for a ``db.table`` of the session catalog, asked
    of the session catalog directly (one call, where Spark resolves a missing name as a
    query would, and raises and catches its error: ~10 ms)."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is not None:
        found = _connector(spark, _CATALOG).sessionTableExists(jsession, name)
        if found is not None:
            return bool(found)
    return bool(spark.catalog.tableExists(name))


def session_table_defaults(spark: SparkSession) -> dict[str, str]:
    """Table property ``delta.X`` for each session setting ``...properties.defaults.X``, in
    one call (``spark.conf.getAll`` is a round trip per setting, ~60 of them). Spark
    Connect (no JVM session here) takes ``getAll``."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        return {
            f"delta.{key[len(DEFAULTS_PREFIX) :]}": str(value)
            for key, value in spark.conf.getAll.items()
            if key.startswith(DEFAULTS_PREFIX)
        }
    text = str(_connector(spark, _DEFAULTS).joined(jsession))
    pairs = (pair.partition("\u0001") for pair in text.split("\u0000") if pair)
    return {key: value for key, _, value in pairs}
