"""The flow declarations: ``append_flow`` and ``update_flow``, Lakeflow's flows into a
streaming table or a sink, built by one :func:`flow_decorator`.

An update flow emits, per micro-batch (or, in real-time mode, per row), only the rows
that changed; it is also the flow Lakeflow runs in real-time mode
(``spark_conf={"pipelines.trigger": "RealTime"}``, see :mod:`._realtime`). Like
Lakeflow's, it writes only sinks (``create_sink``); declaring one into a dataset is a
:class:`DefinitionError` when the graph is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from deltaflow.pipelines._api import (
    _location_of,
    _mark,
    _query_function,
    _strings,
    _take_expectations,
    _text,
)
from deltaflow.pipelines._declarations import Flow
from deltaflow.pipelines._graph import active_builder

F = TypeVar("F", bound=Callable[..., Any])


def append_flow(
    *,
    target: str,
    name: str | None = None,
    spark_conf: dict[str, str] | None = None,
    once: bool = False,
    comment: str | None = None,
) -> Callable[[F], F]:
    """The decorated query appends to ``target`` (a streaming table or a sink); one
    table can take several. ``once``: a backfill that runs a single time."""
    return flow_decorator(
        "append_flow", target, name, spark_conf, comment, takes_expectations=True, once=bool(once)
    )


def flow_decorator(
    decl: str,
    target: str,
    name: str | None,
    spark_conf: dict[str, str] | None,
    comment: str | None,
    *,
    takes_expectations: bool,
    **fields: Any,
) -> Callable[[F], F]:
    """The decorator a flow declaration ``decl`` (``append_flow``, ``update_flow``)
    returns: its arguments checked, one :class:`Flow` (with ``fields``) added to the graph
    being built; ``takes_expectations``: the query's ``@expect*`` rules go to the flow."""

    def decorate(func: F) -> F:
        query = _query_function(func, decl)
        where = _location_of(query)
        _text(target, "target", decl, where, optional=False)
        flow_name = _text(name, "name", decl, where) or query.__name__
        active_builder(f"{decl} {flow_name!r}").add_flow(
            Flow(
                name=flow_name,
                target=target,
                func=query,
                location=where,
                spark_conf=_strings(spark_conf, "spark_conf", decl, where),
                comment=_text(comment, "comment", decl, where),
                expectations=_take_expectations(query) if takes_expectations else (),
                **fields,
            )
        )
        _mark(query, flow_name)
        return func

    return decorate


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
    return flow_decorator(
        "update_flow", target, name, spark_conf, comment,
        takes_expectations=False, output_mode="update",
    )  # fmt: skip
