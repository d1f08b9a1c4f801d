"""SQL's ``UPDATE``, ``DELETE FROM`` and ``MERGE INTO`` on Delta tables.

The connector's SQL parser hands these statements, when their target is a Delta table, to
deltaflow's brain (``DeltaDmlCommand`` in ``jvm/.../dml/SqlDml.scala`` calls ``dml.run``),
which runs them here, in the statement's own session lent to it
(:mod:`deltaflow.spark.bridge._host`), with the code behind the ``DeltaTable`` API: one
implementation of each operation, its conflict rules, change-data files and history
entries, on every host (a PySpark driver, a Connect server, ``spark-sql``, the Thrift
server). The request is JSON with the statement's parts as the SQL text the user wrote;
a MERGE's source arrives as a temporary view of that session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaflow.errors import DeltaflowError, from_wire
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


def run(args: dict[str, Any]) -> dict[str, Any]:
    """The brain's ``dml.run``: one statement, in the session the JVM lent for it."""
    from deltaflow.spark.bridge import _host

    with _host.lent_session(args["session"]) as spark:
        try:
            return {"counts": execute(spark, args)}
        except DeltaflowError:
            raise
        except Exception as exc:
            carried = from_wire(str(exc))
            if carried is not None:
                raise carried from exc
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise BridgeError(
                f"{args.get('kind')} on {args.get('name')} failed: {type(exc).__name__}: {first}",
                operation=str(args.get("kind")),
            ) from exc
