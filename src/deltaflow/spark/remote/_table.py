"""``DeltaTable``'s methods on a Spark Connect session, as Delta's SQL statements.

Each function takes the session and the table's SQL name (a catalog name or
``delta.`<location>```, the location as the server reported it) and sends one
statement with ``spark.sql``; the server's connector does the work. Errors come back as
deltaflow's typed classes (``deltaflow.typed_error`` on what Connect raised).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.errors import InvalidOptionError, raising_typed
from deltaflow.spark.remote._sql_text import column_path, quote_identifier, sql_text, string_literal
from deltaflow.table.errors import TableNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def is_connect(spark: object) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect.session.SparkSession``);
    checked by module so that a classic session never imports Connect's modules."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def run(spark: SparkSession, statement: str) -> DataFrame:
    """``spark.sql(statement)`` on the server, a deltaflow error it carries raised as
    itself (Connect delivers the connector's errors as ``UnknownException`` text)."""
    with raising_typed(keep_cause=False):
        return spark.sql(statement)


def run_collect(spark: SparkSession, statement: str) -> tuple[list[Any], Any]:
    """``statement`` run to completion on the server: its rows and schema. (Connect runs
    a command when ``spark.sql`` sends it; collecting makes any other plan run too.)"""
    with raising_typed(keep_cause=False):
        result = spark.sql(statement)
        return result.collect(), result.schema


def path_name(location: str) -> str:
    return "delta." + quote_identifier(location)


def detail_row(spark: SparkSession, table: str, label: str) -> Any:
    """``DESCRIBE DETAIL <table>``'s row, run on the server; ``TableNotFoundError`` when
    ``table`` is not a Delta table there."""
    try:
        rows, _ = run_collect(spark, f"DESCRIBE DETAIL {table}")
    except TableNotFoundError:
        raise
    except Exception as exc:
        if error_class(exc) in ("TABLE_OR_VIEW_NOT_FOUND", "PATH_NOT_FOUND"):
            raise TableNotFoundError(
                f"{label} is not a Delta table on the Spark Connect server: {exc}",
                table_uri=label,
            ) from None
        raise
    if not rows or (rows[0]["format"] or "").lower() != "delta":
        raise TableNotFoundError(
            f"{label} is not a Delta table on the Spark Connect server. Create it with"
            " CREATE TABLE ... USING delta, or convert it with CONVERT TO DELTA.",
            table_uri=label,
        )
    return rows[0]


def locate_path(spark: SparkSession, path: str) -> str:
    """The location (as the server qualifies it) of the Delta table at ``path``, a path
    of the server's file system; ``TableNotFoundError`` when there is none."""
    location: str = detail_row(spark, path_name(path), path)["location"]
    return location


def locate_name(spark: SparkSession, name: str) -> str:
    location: str = detail_row(spark, name, name)["location"]
    return location


def is_delta_table(spark: SparkSession, path: str) -> bool:
    try:
        detail_row(spark, path_name(path), path)
    except TableNotFoundError:
        return False
    return True


def to_df(spark: SparkSession, location: str, name: str | None) -> DataFrame:
    if name is not None:
        return spark.read.table(name)
    return spark.read.format("delta").load(location)


def restore_to_timestamp(
    spark: SparkSession, table: str, timestamp: str | dt.datetime
) -> DataFrame:
    """``RESTORE ... TO TIMESTAMP AS OF``: a ``datetime`` is an instant (a naive one is
    UTC, as in the classic path), sent exactly; a string is read by the server in its
    session time zone, as SQL's ``TIMESTAMP AS OF 'ts'`` is."""
    if isinstance(timestamp, dt.datetime):
        moment = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=dt.timezone.utc)
        delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        point = f"TIMESTAMP_MICROS({micros})"
    else:
        point = string_literal(timestamp)
    return run(spark, f"RESTORE TABLE {table} TO TIMESTAMP AS OF {point}")


def protocol_versions(spark: SparkSession, table: str) -> tuple[int, int]:
    row = detail_row(spark, table, table)
    return int(row["minReaderVersion"]), int(row["minWriterVersion"])


def set_properties(spark: SparkSession, table: str, properties: Mapping[str, str]) -> None:
    pairs = ", ".join(f"{string_literal(k)} = {string_literal(v)}" for k, v in properties.items())
    run_collect(spark, f"ALTER TABLE {table} SET TBLPROPERTIES ({pairs})")


# ---- DML ------------------------------------------------------------------------------


def _target(table: str, alias: str | None) -> str:
    return table + (f" AS {quote_identifier(alias)}" if alias else "")


def delete(
    spark: SparkSession, table: str, alias: str | None, condition: str | Column | None
) -> None:
    statement = f"DELETE FROM {_target(table, alias)}"
    if condition is not None:
        statement += f" WHERE {sql_text(spark, condition, 'condition')}"
    run_collect(spark, statement)


def update(
    spark: SparkSession,
    table: str,
    alias: str | None,
    condition: str | Column | None,
    assignments: Mapping[str, str | Column],
) -> None:
    statement = f"UPDATE {_target(table, alias)} SET {_set_list(spark, assignments.items(), {})}"
    if condition is not None:
        statement += f" WHERE {sql_text(spark, condition, 'condition')}"
    run_collect(spark, statement)


def _set_list(
    spark: SparkSession,
    pairs: Any,
    plan_aliases: Mapping[int, str],
) -> str:
    return ", ".join(
        f"{column_path(k)} = {sql_text(spark, v, 'set', plan_aliases=plan_aliases)}"
        for k, v in pairs
    )


def merge(
    spark: SparkSession,
    table: str,
    alias: str | None,
    source: DataFrame,
    condition: str | Column,
    clauses: Sequence[Any],
    schema_evolution: bool,
) -> DataFrame:
    """MERGE INTO, the source a temporary view of the client's session (dropped after).

    The view keeps the source's alias (``source.alias("s")``) as the name that
    qualifies its columns; ``source["col"]`` columns in conditions and values are
    written with it."""
    view = f"deltaflow_merge_source_{uuid.uuid4().hex}"
    source_alias = _plan_alias(source)
    qualifier = source_alias or view
    plan_aliases = {_plan_id(source): qualifier}

    def text(value: str | Column, argument: str) -> str:
        return sql_text(spark, value, argument, plan_aliases=plan_aliases)

    parts = [
        "MERGE" + (" WITH SCHEMA EVOLUTION" if schema_evolution else ""),
        f"INTO {_target(table, alias)}",
        f"USING {quote_identifier(view)}",
        f"AS {quote_identifier(source_alias)}" if source_alias else "",
        f"ON {text(condition, 'condition')}",
    ]
    for clause in clauses:
        parts.append(_clause(spark, clause, text, plan_aliases))
    statement = " ".join(p for p in parts if p)
    source.createOrReplaceTempView(view)
    try:
        # Fetched while the view exists: the result is a one-row DataFrame of the client.
        rows, schema = run_collect(spark, statement)
        return spark.createDataFrame(rows, schema)
    finally:
        spark.catalog.dropTempView(view)


def _clause(spark: SparkSession, clause: Any, text: Any, plan_aliases: Mapping[int, str]) -> str:
    heads = {
        "matchedUpdate": "WHEN MATCHED",
        "matchedDelete": "WHEN MATCHED",
        "notMatchedInsert": "WHEN NOT MATCHED",
        "notMatchedBySourceUpdate": "WHEN NOT MATCHED BY SOURCE",
        "notMatchedBySourceDelete": "WHEN NOT MATCHED BY SOURCE",
    }
    head = heads[clause.kind]
    if clause.condition is not None:
        head += f" AND {text(clause.condition, 'condition')}"
    if clause.kind.endswith("Delete"):
        return f"{head} THEN DELETE"
    if clause.kind == "notMatchedInsert":
        if clause.assignments is None:
            return f"{head} THEN INSERT *"
        columns = ", ".join(column_path(k) for k, _ in clause.assignments)
        values = ", ".join(text(v, "values") for _, v in clause.assignments)
        return f"{head} THEN INSERT ({columns}) VALUES ({values})"
    if clause.assignments is None:
        return f"{head} THEN UPDATE SET *"
    return f"{head} THEN UPDATE SET {_set_list(spark, clause.assignments, plan_aliases)}"


def _plan_alias(source: DataFrame) -> str | None:
    """The alias ``source.alias("s")`` gave the source, if that is its last step."""
    plan = getattr(source, "_plan", None)
    alias = getattr(plan, "_alias", None) if type(plan).__name__ == "SubqueryAlias" else None
    return alias if isinstance(alias, str) else None


def _plan_id(source: DataFrame) -> int:
    plan_id = getattr(getattr(source, "_plan", None), "_plan_id", None)
    if not isinstance(plan_id, int):
        raise InvalidOptionError(
            "The MERGE source is not a Spark Connect DataFrame of this session.",
            option="source",
        )
    return plan_id


def error_class(exc: BaseException) -> str | None:
    getter = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        return getter() if getter else None  # type: ignore[no-any-return]
    except Exception:
        return None
