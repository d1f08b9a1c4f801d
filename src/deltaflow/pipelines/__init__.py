"""Declarative pipelines: ``pyspark.pipelines``' names, Lakeflow's expectations and AUTO CDC.

``from deltaflow import pipelines as dp`` declares datasets and flows exactly as
``from pyspark import pipelines as dp`` does, plus expectations
(``@dp.expect_or_drop(...)``) and ``create_auto_cdc_from_snapshot_flow``. Lakeflow's
``dlt`` names are in :mod:`deltaflow.pipelines.dlt`.

Declaring only builds frozen descriptions (:mod:`._declarations`) in the active graph;
nothing runs and no Spark session is needed, so a test can inspect a pipeline:

    with dp.collect() as declared:
        import my_pipeline
    graph = declared.graph()
    assert graph.dataset("silver").expectations[0].action == "drop"
"""

from typing import TYPE_CHECKING, Any

from deltaflow.pipelines._api import (
    create_auto_cdc_flow,
    create_auto_cdc_from_snapshot_flow,
    create_sink,
    create_streaming_table,
    expect,
    expect_all,
    expect_all_or_drop,
    expect_all_or_fail,
    expect_or_drop,
    expect_or_fail,
    materialized_view,
    table,
    temporary_view,
)
from deltaflow.pipelines._declarations import (
    AutoCdcFlow,
    AutoCdcSnapshotFlow,
    Dataset,
    Expectation,
    Flow,
    Sink,
)
from deltaflow.pipelines._flow_decorators import append_flow, update_flow
from deltaflow.pipelines._graph import Graph, GraphBuilder, collect
from deltaflow.pipelines.errors import (
    DefinitionError,
    ExpectationViolationError,
    FlowFailedError,
    GraphValidationError,
    NoActivePipelineError,
    NotOnConnectError,
    PipelineError,
    PipelineStorageError,
    RealTimeFlowError,
    UserQueryError,
)

if TYPE_CHECKING:
    from deltaflow.pipelines._event_log import read_events
    from deltaflow.pipelines._runner import (
        FlowReport,
        PipelineSettings,
        UpdateReport,
        dry_run,
        run_update,
    )

# The runner's names load pyarrow and delta-rs: imported on first use.
_RUNNER = ("FlowReport", "PipelineSettings", "UpdateReport", "dry_run", "run_update")


def __getattr__(name: str) -> Any:
    if name in _RUNNER:
        from deltaflow.pipelines import _runner

        return getattr(_runner, name)
    if name == "read_events":
        from deltaflow.pipelines._event_log import read_events

        return read_events
    raise AttributeError(f"module 'deltaflow.pipelines' has no attribute {name!r}")


__all__ = [
    "AutoCdcFlow",
    "AutoCdcSnapshotFlow",
    "Dataset",
    "DefinitionError",
    "Expectation",
    "ExpectationViolationError",
    "Flow",
    "FlowFailedError",
    "FlowReport",
    "Graph",
    "GraphBuilder",
    "GraphValidationError",
    "NoActivePipelineError",
    "NotOnConnectError",
    "PipelineError",
    "PipelineSettings",
    "PipelineStorageError",
    "RealTimeFlowError",
    "Sink",
    "UpdateReport",
    "UserQueryError",
    "append_flow",
    "collect",
    "create_auto_cdc_flow",
    "create_auto_cdc_from_snapshot_flow",
    "create_sink",
    "create_streaming_table",
    "dry_run",
    "expect",
    "expect_all",
    "expect_all_or_drop",
    "expect_all_or_fail",
    "expect_or_drop",
    "expect_or_fail",
    "materialized_view",
    "read_events",
    "run_update",
    "table",
    "temporary_view",
    "update_flow",
]
