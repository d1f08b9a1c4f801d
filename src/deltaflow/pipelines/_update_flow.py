"""``update_flow``: Lakeflow's flow into a sink in update output mode.

An update flow emits, per micro-batch (or, in real-time mode, per row), only the rows
that changed; it is also the flow Lakeflow runs in real-time mode
(``spark_conf={"pipelines.trigger": "RealTime"}``, see :mod:`._realtime`). Like
Lakeflow's, it writes only sinks (``create_sink``); declaring one into a dataset is a
:class:`DefinitionError` when the graph is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from deltaflow.pipelines._api import _location_of, _mark, _query_function, _strings, _text
from deltaflow.pipelines._declarations import Flow
from deltaflow.pipelines._graph import active_builder

F = TypeVar("F", bound=Callable[..., Any])


def update_flow(
    *,
    target: str,
    name: str | None = None,
    spark_conf: dict[str, str] | None = None,
    comment: str | None = None,
) -> Callable[[F], F]:
    """The decorated streaming query writes the sink ``target`` in update output mode.
    ``spark_conf={"pipelines.trigger": "RealTime"}`` runs it in Spark's real-time mode
    (a continuous pipeline with ``spark.databricks.streaming.realTimeMode.enabled``)."""

    def decorate(func: F) -> F:
        query = _query_function(func, "update_flow")
        where = _location_of(query)
        _text(target, "target", "update_flow", where, optional=False)
        flow_name = _text(name, "name", "update_flow", where) or query.__name__
        active_builder(f"update_flow {flow_name!r}").add_flow(
            Flow(
                name=flow_name,
                target=target,
                func=query,
                location=where,
                spark_conf=_strings(spark_conf, "spark_conf", "update_flow", where),
                comment=_text(comment, "comment", "update_flow", where),
                output_mode="update",
            )
        )
        _mark(query, flow_name)
        return func

    return decorate
