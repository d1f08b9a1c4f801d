"""Lakeflow's (Delta Live Tables') Python names, for pipelines written for Databricks.

``import dlt`` becomes ``from deltaflow.pipelines import dlt``; the rest of the file
stays as it is. ``dlt.table`` is a streaming table when its query returns a streaming
DataFrame and a materialized view otherwise, as in Lakeflow; ``dlt.view`` is a
temporary view; ``apply_changes`` / ``apply_changes_from_snapshot`` are the AUTO CDC
flows under their older names.
"""

from __future__ import annotations

from typing import Any

from deltaflow.pipelines._api import (
    _dataset_decorator,
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
)
from deltaflow.pipelines._declarations import QueryFunction
from deltaflow.pipelines._flow_decorators import append_flow, update_flow
from deltaflow.pipelines._reads import read, read_stream


def table(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: dict[str, str] | None = None,
    table_properties: dict[str, str] | None = None,
    path: str | None = None,
    partition_cols: list[str] | None = None,
    cluster_by: list[str] | None = None,
    schema: Any = None,
    temporary: bool = False,
    private: bool = False,
    row_filter: str | None = None,
) -> Any:
    """A table holding the decorated query's result: a streaming table for a streaming
    query, a materialized view for a batch one. ``private`` (``temporary``, its older
    name): materialized under the pipeline's storage and readable by the pipeline's
    flows, but not left in the catalog. ``row_filter`` (Unity Catalog) is refused."""
    options = dict(locals())
    del options["query_function"]
    return _dataset_decorator(query_function, "table", "dlt.table", options)


def view(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: dict[str, str] | None = None,
) -> Any:
    """A temporary view other datasets read; nothing is stored."""
    options = dict(locals())
    del options["query_function"]
    return _dataset_decorator(query_function, "temporary_view", "dlt.view", options)


apply_changes = create_auto_cdc_flow
apply_changes_from_snapshot = create_auto_cdc_from_snapshot_flow

__all__ = [
    "append_flow",
    "apply_changes",
    "apply_changes_from_snapshot",
    "create_auto_cdc_flow",
    "create_auto_cdc_from_snapshot_flow",
    "create_sink",
    "create_streaming_table",
    "expect",
    "expect_all",
    "expect_all_or_drop",
    "expect_all_or_fail",
    "expect_or_drop",
    "expect_or_fail",
    "read",
    "read_stream",
    "table",
    "update_flow",
    "view",
]
