"""SQL's ``UPDATE``, ``DELETE FROM`` and ``MERGE INTO`` on Delta tables.

The connector's SQL parser hands these statements, when their target is a Delta table, to
the session's Python side (``DeltaDmlCommand`` in ``jvm/.../dml/SqlDml.scala``), which
runs them here with the code behind the ``DeltaTable`` API: one implementation of each
operation, its conflict rules, change-data files and history entries. The request is JSON
with the statement's parts as the SQL text the user wrote; a MERGE's source arrives as a
global temporary view. :func:`install` registers the handler as a py4j callback on a
classic session; hosts without a Python driver refuse the statements with a typed error.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from deltaflow.errors import DeltaflowError, error_answer, from_wire
from deltaflow.spark.dml import _delete_update, _merge_builder
from deltaflow.spark.errors import BridgeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_CLAUSE_KINDS = {
    ("matched", "update"): "matchedUpdate",
    ("matched", "updateAll"): "matchedUpdate",
    ("matched", "delete"): "matchedDelete",
    ("notMatched", "insert"): "notMatchedInsert",
    ("notMatched", "insertAll"): "notMatchedInsert",
    ("notMatchedBySource", "update"): "notMatchedBySourceUpdate",
    ("notMatchedBySource", "delete"): "notMatchedBySourceDelete",
}


def execute(spark: SparkSession, request: dict[str, Any]) -> list[int]:
    """Run one statement; its result row (delta-spark's counts)."""
    kind, uri, alias = request["kind"], request["uri"], request.get("alias")
    if kind == "DELETE":
        metrics = _delete_update.delete(spark, uri, alias, request.get("condition"))
        return [metrics.affected_rows]
    assignments = {column: value for column, value in request.get("assignments") or []}
    if kind == "UPDATE":
        metrics = _delete_update.update(spark, uri, alias, request.get("condition"), assignments)
        return [metrics.affected_rows]
    source = spark.table(request["sourceView"])
    source_alias = request.get("sourceAlias")
    if source_alias:
        source = source.alias(source_alias)
    clauses = []
    for clause in request.get("clauses") or []:
        pairs = clause.get("assignments")
        clauses.append(
            _merge_builder.MergeClause(
                _CLAUSE_KINDS[(clause["group"], clause["action"])],  # type: ignore[arg-type]
                clause.get("condition"),
                tuple((c, v) for c, v in pairs) if pairs is not None else None,
            )
        )
    spec = _merge_builder.MergeSpec(
        uri,
        alias,
        source,
        request["condition"],
        tuple(clauses),
        schema_evolution=bool(request.get("schemaEvolution")),
    )
    return list(_merge_builder.DeltaMergeBuilder(spark, spec).run())


class SqlDmlHandler:
    """The py4j callback the connector calls (``io.deltaflow.spark.dml.PythonDml``)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def run(self, request: str) -> str:
        parsed = json.loads(request)
        try:
            return json.dumps({"counts": execute(self._spark, parsed)})
        except DeltaflowError as exc:
            return json.dumps({"error": error_answer(exc)})
        except Exception as exc:
            carried = from_wire(str(exc))
            if carried is None:
                carried = BridgeError(
                    f"{parsed.get('kind')} on {parsed.get('name')} failed:"
                    f" {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                    operation=str(parsed.get("kind")),
                )
            return json.dumps({"error": error_answer(carried)})

    class Java:
        implements: ClassVar[list[str]] = ["io.deltaflow.spark.dml.PythonDml"]


def install(spark: SparkSession) -> None:
    """Register this session's Python side as the connector's DML runner."""
    from pyspark.java_gateway import ensure_callback_server_started

    context = spark.sparkContext
    gateway = context._gateway  # type: ignore[attr-defined]
    ensure_callback_server_started(gateway)
    jvm = context._jvm  # type: ignore[attr-defined]
    jvm.io.deltaflow.spark.dml.PythonDml.register(SqlDmlHandler(spark))
