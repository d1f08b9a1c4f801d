"""An SDP project (``from pyspark import pipelines as dp``, configuration read at import
time, a SQL file) run unchanged by ``deltaflow pipelines run``, twice."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from deltaflow.pipelines import _commands
from deltaflow.pipelines._loader import load_graph
from deltaflow.pipelines._spec import load_spec
from tests.pipelines._sdp_project import land_orders, rows, write_project


def project(tmp_path: Path) -> tuple[Path, str, Path]:
    orders = str(tmp_path / "landing" / "orders")
    storage = tmp_path / "storage"
    spec = write_project(tmp_path / "shop", orders, f"shop_{uuid.uuid4().hex[:8]}", str(storage))
    return spec, orders, storage / "tables"


def test_pyspark_pipelines_declarations_load_into_deltaflows_graph(spark: Any, tmp_path) -> None:
    spec_file, _orders, _ = project(tmp_path)
    before = spark.conf.get("shop.orders", None)
    graph = load_graph(spark, load_spec(spec_file))
    assert graph.dataset("orders").kind == "streaming_table"
    assert graph.dataset("orders").comment == "orders as they landed"
    assert graph.dataset("totals").kind == "materialized_view"
    assert graph.dataset("big_customers").kind == "materialized_view"
    # The configuration was on the session while the files loaded, and only then.
    assert spark.conf.get("shop.orders", None) == before


def test_an_sdp_project_runs_unchanged_twice(spark: Any, tmp_path) -> None:
    spec_file, orders, tables = project(tmp_path)
    land_orders(orders, [("ann", 5.0), ("bob", 20.0)])
    report = _commands.run_spec(spec_file, lambda line: None, spark=spark)
    assert report.state == "COMPLETED", report
    assert rows(str(tables / "orders"), "customer", "amount") == [("ann", 5.0), ("bob", 20.0)]
    assert rows(str(tables / "totals"), "customer", "total") == [("ann", 5.0), ("bob", 20.0)]
    assert rows(str(tables / "big_customers"), "customer") == [("bob",)]

    # The streaming table takes only the new rows; the materialized views are refreshed.
    land_orders(orders, [("ann", 7.0)])
    report = _commands.run_spec(spec_file, lambda line: None, spark=spark)
    assert report.state == "COMPLETED", report
    assert rows(str(tables / "orders"), "customer", "amount") == [
        ("ann", 5.0),
        ("ann", 7.0),
        ("bob", 20.0),
    ]
    assert rows(str(tables / "totals"), "customer", "total") == [("ann", 12.0), ("bob", 20.0)]
    assert rows(str(tables / "big_customers"), "customer") == [("ann",), ("bob",)]


def test_outside_a_pipeline_pyspark_declarations_still_fail_as_pyspark_says() -> None:
    from pyspark import pipelines as sdp
    from pyspark.errors import PySparkRuntimeError

    with pytest.raises(PySparkRuntimeError):
        sdp.create_streaming_table("nowhere")
