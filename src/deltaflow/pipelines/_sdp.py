"""``pyspark.pipelines`` declarations registered into deltaflow's graph.

A Spark Declarative Pipelines project's files say ``from pyspark import pipelines as dp``.
pyspark's decorators build its own description objects (``pyspark.pipelines.output`` /
``flow``) and hand them to the *active graph element registry*, a context variable
(``pyspark.pipelines.graph_element_registry``) that ``spark-pipelines`` sets to a registry
talking to a Spark Connect server; outside it they fail with
``GRAPH_ELEMENT_DEFINED_OUTSIDE_OF_DECLARATIVE_PIPELINE``. While deltaflow loads a
project, :func:`registering` makes :class:`DeltaflowRegistry` the active one: it turns each
object into deltaflow's own declaration and adds it to the graph being collected, so the
files run unchanged (no rewriting) and mean what they mean under ``spark-pipelines``:
``@dp.table`` is a streaming table, ``@dp.materialized_view`` a materialized view.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines._declarations import Dataset, DatasetKind, Flow, Sink, SourceLocation
from deltaflow.pipelines._graph import GraphBuilder
from deltaflow.pipelines.errors import DefinitionError

if TYPE_CHECKING:
    from pyspark.pipelines.graph_element_registry import GraphElementRegistry
    from pyspark.sql import SparkSession


def _location(output: Any) -> SourceLocation:
    where = output.source_code_location
    return SourceLocation(str(where.filename), where.line_number)


def _kind(output: Any) -> DatasetKind | None:
    from pyspark.pipelines import output as sdp

    if isinstance(output, sdp.MaterializedView):
        return "materialized_view"
    if isinstance(output, sdp.StreamingTable):
        return "streaming_table"
    if isinstance(output, sdp.TemporaryView):
        return "temporary_view"
    return None


def _registry_class() -> type[GraphElementRegistry]:
    from pyspark.pipelines import output as sdp
    from pyspark.pipelines.graph_element_registry import GraphElementRegistry

    class DeltaflowRegistry(GraphElementRegistry):
        """pyspark's registry interface, adding to a deltaflow :class:`GraphBuilder`."""

        def __init__(self, spark: SparkSession, builder: GraphBuilder) -> None:
            self._spark = spark
            self._builder = builder

        def register_output(self, output: Any) -> None:
            where = _location(output)
            if isinstance(output, sdp.Sink):
                self._builder.add_sink(
                    Sink(output.name, output.format, dict(output.options), where)
                )
                return
            kind = _kind(output)
            if kind is None:
                raise DefinitionError(
                    f"{where}: pyspark.pipelines declared {type(output).__name__}"
                    f" {output.name!r}, which deltaflow does not know: report this with the"
                    " pyspark version.",
                    dataset=output.name,
                    location=str(where),
                )
            table = isinstance(output, sdp.Table)
            fmt = output.format if table else None
            if fmt not in (None, "delta"):
                raise DefinitionError(
                    f"{where}: {output.name!r} has format {fmt!r}; pipeline tables are Delta"
                    " tables (leave `format` out or say 'delta', or write other formats with"
                    " create_sink + append_flow).",
                    dataset=output.name,
                    location=str(where),
                )
            self._builder.add_dataset(
                Dataset(
                    name=output.name,
                    kind=kind,
                    location=where,
                    comment=output.comment,
                    table_properties=dict(output.table_properties) if table else {},
                    partition_cols=tuple(output.partition_cols or ()) if table else (),
                    cluster_by=tuple(output.cluster_by or ()) if table else (),
                    schema=output.schema if table else None,
                    format=fmt,
                )
            )

        def register_flow(self, flow: Any) -> None:
            self._builder.add_flow(
                Flow(
                    name=flow.name,
                    target=flow.target,
                    func=flow.func,
                    location=_location(flow),
                    spark_conf=dict(flow.spark_conf or {}),
                )
            )

        def register_auto_cdc_flow(self, flow: Any) -> None:
            from deltaflow.pipelines._api import declare_auto_cdc_flow

            declare_auto_cdc_flow(
                _location(flow),
                "create_auto_cdc_flow",
                target=flow.target,
                source=flow.source,
                keys=flow.keys,
                sequence_by=flow.sequence_by,
                apply_as_deletes=flow.apply_as_deletes,
                column_list=flow.column_list,
                except_column_list=flow.except_column_list,
                stored_as_scd_type=flow.stored_as_scd_type or 1,
                track_history_column_list=flow.track_history_column_list,
                track_history_except_column_list=flow.track_history_except_column_list,
                name=flow.name,
                spark_conf=dict(flow.spark_conf or {}),
            )

        def register_sql(self, sql_text: str, file_path: Path) -> None:
            from deltaflow.pipelines._loader import declare_sql_text

            declare_sql_text(self._spark, sql_text, Path(file_path), self._builder)

    return DeltaflowRegistry


@contextlib.contextmanager
def registering(spark: SparkSession, builder: GraphBuilder) -> Iterator[None]:
    """``pyspark.pipelines``' decorators add to ``builder`` inside the block."""
    try:
        from pyspark.pipelines.graph_element_registry import graph_element_registration_context
    except ImportError:  # a pyspark without pipelines (< 4.1): nothing to route
        yield
        return
    with graph_element_registration_context(_registry_class()(spark, builder)):
        yield
