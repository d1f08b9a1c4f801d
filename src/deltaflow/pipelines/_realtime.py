"""Real-time flows: a declared flow run in Spark's real-time mode, with Lakeflow's names.

Lakeflow's three steps, unchanged: the pipeline runs continuously (``continuous: true``
in ``spark-pipeline.yml``, ``deltaflow pipelines run --continuous``,
``run_update(continuous=True)``); its configuration says
``spark.databricks.streaming.realTimeMode.enabled: "true"``; a flow asks for the trigger
with ``spark_conf={"pipelines.trigger": "RealTime"}``, its epoch (how often Spark
checkpoints, not a latency) being ``pipelines.trigger.interval`` (the flow's, else the
pipeline's, else 5 minutes, Lakeflow's default).

Lakeflow runs real-time flows as ``update_flow``s into sinks. deltaflow takes those
(Kafka, foreach-style sinks, and a Delta sink by ``path`` or ``tableName``) and also a
streaming table's own query or an ``append_flow`` into one: the Delta real-time sink
writes both. What real-time mode cannot do is refused when the graph is analysed, before
anything runs, with :class:`RealTimeFlowError` naming the alternative (see :func:`check`).

Writing: a real-time query runs in update output mode with asynchronous progress
tracking off (Spark allows it only for its own sinks), through the catalog table's
streaming write (``toTable``: Spark's V1 sink path is refused in real-time mode), in the
flow's own session clone with ``spark.sql.streaming.realTimeMode.allowlistCheck=false``
when it writes Delta (Spark's sink allowlist names only its own sinks; the Delta sink
checks the query's operators itself). The clone keeps that switch to the flow: other
queries of the application keep Spark's check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _flow_session
from deltaflow.pipelines._declarations import AnyFlow, Dataset, Flow, Sink
from deltaflow.pipelines.errors import RealTimeFlowError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaflow.pipelines._analysis import Resolution, ResolvedFlow
    from deltaflow.pipelines._runner import PipelineSettings
    from deltaflow.pipelines._storage import Storage

TRIGGER = "pipelines.trigger"
INTERVAL = "pipelines.trigger.interval"
ENABLED = "spark.databricks.streaming.realTimeMode.enabled"
ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"
# Lakeflow's default epoch. A longer epoch means fewer checkpoints (offset and commit log
# writes) and a longer replay after a failure; rows are committed within the epoch
# either way (the Delta sink's commit interval), so it is no latency.
DEFAULT_EPOCH = "5 minutes"

# Logical operators that keep state or shuffle: the Delta real-time sink replays an epoch
# row for row, which needs a stateless plan, or dropDuplicates alone over one streaming
# source on Spark 4.3+ (one producer into its shuffle).
_STATEFUL = {
    "Aggregate": "an aggregation",
    "Deduplicate": "dropDuplicates",
    "DeduplicateWithinWatermark": "dropDuplicatesWithinWatermark",
    "Distinct": "DISTINCT",
    "Window": "a window function",
    "FlatMapGroupsWithState": "(flat)mapGroupsWithState",
    "TransformWithState": "transformWithState",
    "TransformWithStateInPySpark": "transformWithStateInPandas",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState",
    "Repartition": "repartition",
    "RepartitionByExpression": "repartition",
    "Sort": "a sort",
}


def requested(flow: AnyFlow, target: Dataset | None) -> bool:
    """True when ``flow`` asks for real-time mode (``pipelines.trigger`` = ``RealTime``,
    in its own ``spark_conf`` or its dataset's)."""
    value = _flow_session.flow_confs(flow, target).get(TRIGGER, "")
    return value.replace("_", "").replace("-", "").strip().lower() == "realtime"


def epoch(flow: AnyFlow, target: Dataset | None, settings: PipelineSettings) -> str:
    """The flow's epoch: its ``pipelines.trigger.interval``, the pipeline's, or 5 minutes."""
    own = _flow_session.flow_confs(flow, target).get(INTERVAL)
    return own or settings.setting(INTERVAL, DEFAULT_EPOCH)


def real_time_flows(resolution: Resolution) -> list[str]:
    """The flows of ``resolution`` that ask for real-time mode."""
    return [
        name
        for name, resolved in resolution.flows.items()
        if requested(resolved.flow, _dataset(resolution, resolved.flow.target))
    ]


def _dataset(resolution: Resolution, name: str) -> Dataset | None:
    resolved = resolution.datasets.get(name)
    return resolved.dataset if resolved is not None else None


def writes_delta(resolution: Resolution, flow: AnyFlow) -> bool:
    """The flow writes a Delta table: a dataset, or a sink of format ``delta``."""
    if flow.target in resolution.datasets:
        return True
    sink = resolution.graph.sink(flow.target)
    return sink is not None and sink.format.lower() == "delta"


def session_confs(resolution: Resolution, flow: AnyFlow) -> dict[str, str]:
    """What a real-time flow's session adds to the flow's own settings."""
    return {ALLOWLIST_CHECK: "false"} if writes_delta(resolution, flow) else {}


# ---- refusals -------------------------------------------------------------------------


def check(resolution: Resolution, settings: PipelineSettings, *, continuous: bool | None) -> None:
    """Every real-time flow of ``resolution`` can run as one; ``continuous``: whether the
    update is continuous (None in a dry run, which does not know)."""
    names = real_time_flows(resolution)
    if not names:
        return
    from deltaflow.spark._compat import PYSPARK_MINOR

    for name in names:
        resolved = resolution.flows[name]
        flow = resolved.flow
        where = f"flow {flow.name!r} ({flow.location}) asks for real-time mode"
        if PYSPARK_MINOR < (4, 1):
            raise _refuse(
                f"{where}, which Spark {'.'.join(map(str, PYSPARK_MINOR))} does not have.",
                flow,
                "real_time_unsupported_spark",
                "Spark 4.1 or newer; or drop pipelines.trigger for a micro-batch flow",
            )
        _check_flow(resolution, resolved, where)
        if settings.setting(ENABLED, "false").strip().lower() != "true":
            raise _refuse(
                f"{where}, but the pipeline has not enabled it.",
                flow,
                "real_time_not_enabled",
                f'set {ENABLED}: "true" in the pipeline\'s configuration (spark-pipeline.yml)',
            )
        if continuous is False:
            raise _refuse(
                f"{where} in a triggered update: a real-time flow runs until stopped.",
                flow,
                "real_time_not_continuous",
                "run the pipeline continuously: `continuous: true` in spark-pipeline.yml,"
                " `deltaflow pipelines run --continuous`, or run_update(continuous=True)",
            )


def _check_flow(resolution: Resolution, resolved: ResolvedFlow, where: str) -> None:
    flow = resolved.flow
    if not isinstance(flow, Flow):
        raise _refuse(
            f"{where}; AUTO CDC flows apply each micro-batch with MERGE.",
            flow,
            "real_time_auto_cdc",
            "drop pipelines.trigger from the AUTO CDC flow (it runs micro-batches)",
        )
    target = resolution.datasets.get(flow.target)
    if target is not None and target.kind == "materialized_view":
        raise _refuse(
            f"{where} into materialized view {flow.target!r}, which is recomputed, not streamed.",
            flow,
            "real_time_materialized_view",
            "declare a streaming table (@dp.table over a readStream) or write a sink"
            " with update_flow",
        )
    if flow.once or not resolved.streaming:
        raise _refuse(
            f"{where}, but its query is a batch query.",
            flow,
            "real_time_batch_query",
            "read a stream (spark.readStream...), or drop pipelines.trigger",
        )
    if target is None and flow.output_mode != "update":
        raise _refuse(
            f"{where} as an append_flow into sink {flow.target!r}; real-time mode writes"
            " in update output mode.",
            flow,
            "real_time_append_flow",
            f"declare it with @dp.update_flow(target={flow.target!r}, ...), as in Lakeflow",
        )
    rules = (target.dataset.expectations if target is not None else ()) + flow.expectations
    if rules:
        raise _refuse(
            f"{where} with expectations ({', '.join(r.name for r in rules)}), which are"
            " counted per micro-batch.",
            flow,
            "real_time_expectations",
            "filter in the query (.where(...)), or drop pipelines.trigger to run the"
            " flow in micro-batches with its expectations",
        )
    if writes_delta(resolution, flow):
        found = stateful_operators(resolved.df)
        sources = streaming_sources(resolved.df)
        if found == ["dropDuplicates"] and sources == 1 and _dedup_in_real_time():
            return  # replayed row for row: one producer into the shuffle (docs/realtime.md)
        if found:
            several = (
                f" (it reads {sources} streaming sources into the shuffle)"
                if "dropDuplicates" in found and sources > 1
                else ""
            )
            raise _refuse(
                f"{where} into a Delta table with {', '.join(found)}{several}: the Delta"
                " real-time sink takes stateless queries, and dropDuplicates over a single"
                " streaming source on Spark 4.3+ (each epoch is replayed row for row).",
                flow,
                "real_time_stateful",
                "drop pipelines.trigger (a micro-batch flow keeps state, exactly once);"
                " a Kafka sink with update_flow takes the query in real-time mode but"
                " delivers at least once",
            )


def _dedup_in_real_time() -> bool:
    from deltaflow.spark._compat import PYSPARK_MINOR

    return PYSPARK_MINOR >= (4, 3)


def streaming_sources(df: Any) -> int:
    """How many streaming leaves ``df``'s analysed plan reads."""
    if df is None or not hasattr(df, "_jdf"):
        return 0
    count = 0
    stack = [df._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        children = node.children()
        if children.size() == 0:
            count += bool(node.isStreaming())
        stack.extend(children.apply(i) for i in range(children.size()))
    return count


def stateful_operators(df: Any) -> list[str]:
    """What in ``df``'s analysed plan keeps state or shuffles (descriptions, in order)."""
    if df is None or not hasattr(df, "_jdf"):
        return []
    found: dict[str, None] = {}
    stack = [df._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        kind = str(node.getClass().getSimpleName())
        if kind in _STATEFUL:
            found[_STATEFUL[kind]] = None
        elif kind == "Join" and _both_streaming(node):
            found["a stream-stream join"] = None
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return list(found)


def _both_streaming(node: Any) -> bool:
    return bool(node.left().isStreaming()) and bool(node.right().isStreaming())


def _refuse(message: str, flow: AnyFlow, problem: str, alternative: str) -> RealTimeFlowError:
    return RealTimeFlowError(
        f"{message} Instead: {alternative}.",
        flow=flow.name,
        problem=problem,
        alternative=alternative,
    )


# ---- starting -------------------------------------------------------------------------


def start(
    spark: SparkSession,
    writer: Any,
    resolution: Resolution,
    flow: Flow,
    storage: Storage,
) -> Any:
    """Start ``writer`` (trigger and checkpoint set) as ``flow``'s real-time query."""
    # (Asynchronous progress tracking: the connector turns Spark's real-time default off
    # for a Delta target itself; a Kafka sink keeps it.)
    writer = writer.outputMode("update")
    target = resolution.datasets.get(flow.target)
    sink = resolution.graph.sink(flow.target)
    if sink is not None and sink.format.lower() != "delta":
        return writer.format(sink.format).options(**sink.options).start()
    with _flow_session.active(spark):
        if target is not None:
            return writer.toTable(f"{storage.database}.{target.dataset.name}")
        assert sink is not None
        skip = ("path", "tablename")
        options = {k: v for k, v in sink.options.items() if k.lower() not in skip}
        table = sink_table(spark, storage, sink, resolution.flows[flow.name].schema_json)
        return writer.format("delta").options(**options).toTable(table)


def sink_table(spark: SparkSession, storage: Storage, sink: Sink, schema_json: str) -> str:
    """The catalog name a Delta sink is written through: its ``tableName``, or, for a
    ``path``, the sink's own name in the pipeline's database, registered (the table
    created with the flow's schema first when the path holds none)."""
    options = {k.lower(): v for k, v in sink.options.items()}
    if "tablename" in options:
        return options["tablename"]
    path = options.get("path")
    if not path:
        from deltaflow.pipelines.errors import DefinitionError

        raise DefinitionError(
            f"Delta sink {sink.name!r} ({sink.location}) has neither a `path` nor a"
            " `tableName` option; give one (create_sink(name, 'delta', {'path': ...})).",
            dataset=sink.name,
            location=str(sink.location),
        )
    import json

    from pyspark.sql.types import StructType

    from deltaflow.spark.catalog._create import catalog_location
    from deltaflow.spark.dml._delta_table import DeltaTable
    from deltaflow.table import _uri
    from deltaflow.table._snapshot import table_exists

    name = f"{storage.database}.{sink.name}"
    uri = _uri.normalize_uri(path)
    if catalog_location(spark, storage.qualified(sink.name)) == uri:
        return name
    if table_exists(uri):
        location = path.replace("'", "\\'")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {storage.qualified(sink.name)}"
            f" USING delta LOCATION '{location}'"
        )
        return name
    schema: Mapping[str, Any] = json.loads(schema_json)
    (
        DeltaTable.createIfNotExists(spark)
        .tableName(name)
        .location(path)
        .addColumns(StructType.fromJson(dict(schema)))
        .execute()
    )
    return name
