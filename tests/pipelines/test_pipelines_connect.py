"""`deltaflow pipelines run --remote sc://...`: a pipeline's flows run through a Spark
Connect server started from the wheel with only ``deltaflow.spark_conf()``.

The CLI runs in its own process (a Connect client, no JVM); the server and the client share
this machine's disk, where the pipeline's storage is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable as RsTable

from deltaflow import pipelines as dp
from tests.spark.test_hosts import start_connect_server, stop, wait_for_port

pytestmark = pytest.mark.slow

CLI_TIMEOUT = 600  # seconds for one update through the server, on 2 loaded cores

SOURCES = """from deltaflow import pipelines as dp


@dp.table(comment="orders as they land")
@dp.expect_or_drop("positive", "id > 0")
def orders():
    landing = spark.conf.get("shop.landing")
    return spark.readStream.schema("id BIGINT, kind STRING").json(landing)


@dp.materialized_view
def by_kind():
    return spark.read.table("orders").groupBy("kind").count()


@dp.table
def ys():
    return spark.readStream.table("orders").where("kind = 'y'")
"""


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("connect_server")
    server, port = start_connect_server(home)
    try:
        wait_for_port(port, server, timeout=600)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop(server, home)


def _project(root: Path, sources: str, database: str) -> Path:
    landing = root / "landing"
    landing.mkdir(parents=True)
    (root / "transformations").mkdir()
    (root / "transformations" / "shop.py").write_text(sources)
    (root / "spark-pipeline.yml").write_text(
        "name: shop\nstorage: pipeline-storage\n"
        f"database: {database}\n"
        f"configuration:\n  shop.landing: '{landing}'\n"
        "libraries:\n  - glob:\n      include: transformations/**\n"
    )
    return landing


def _land(landing: Path, name: str, rows: list[dict[str, object]]) -> None:
    staged = landing.parent / f".{name}"
    staged.write_text("".join(json.dumps(r) + "\n" for r in rows))
    staged.rename(landing / name)  # whole files only: the stream may list the folder


def _cli(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", "pipelines", *args],
        cwd=root,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )


def _rows(path: Path) -> list[dict[str, object]]:
    return sorted(RsTable(str(path)).to_pyarrow_table().to_pylist(), key=str)


def test_a_pipeline_runs_through_a_connect_server_and_again_incrementally(
    connect_url: str, tmp_path: Path
) -> None:
    landing = _project(tmp_path, SOURCES, "shop_connect")
    _land(
        landing,
        "a.json",
        [
            {"id": 1, "kind": "x"},
            {"id": 2, "kind": "y"},
            {"id": -9, "kind": "y"},
            {"id": 3, "kind": "x"},
        ],
    )

    # The graph, resolved through the server: the view reads the streaming table.
    dry = _cli(tmp_path, "dry-run", "--remote", connect_url)
    assert dry.returncode == 0, dry.stdout + dry.stderr[-3000:]
    assert "by_kind -> by_kind (materialized_view); reads: orders" in dry.stdout, dry.stdout
    assert "orders -> orders (streaming_table)" in dry.stdout, dry.stdout
    assert "ys -> ys (streaming_table); reads: orders" in dry.stdout, dry.stdout

    first = _cli(tmp_path, "run", "--remote", connect_url)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "orders: COMPLETED, 3 rows" in first.stdout, first.stdout
    tables = tmp_path / "pipeline-storage" / "tables"
    assert [r["id"] for r in _rows(tables / "orders")] == [1, 2, 3]
    assert _rows(tables / "by_kind") == [{"kind": "x", "count": 2}, {"kind": "y", "count": 1}]
    assert [r["id"] for r in _rows(tables / "ys")] == [2]
    orders_version = RsTable(str(tables / "orders")).version()

    # Again, with the server named by SPARK_REMOTE: only the new file is read.
    _land(landing, "b.json", [{"id": 4, "kind": "y"}, {"id": 5, "kind": "z"}])
    second = _cli(tmp_path, "run", env={"SPARK_REMOTE": connect_url})
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "orders: COMPLETED, 2 rows" in second.stdout, second.stdout
    orders = RsTable(str(tables / "orders"))
    assert orders.version() == orders_version + 1  # one append: the new file's rows
    assert [r["id"] for r in _rows(tables / "orders")] == [1, 2, 3, 4, 5]
    assert [r["id"] for r in _rows(tables / "ys")] == [2, 4]
    assert _rows(tables / "by_kind") == [
        {"kind": "x", "count": 2},
        {"kind": "y", "count": 2},
        {"kind": "z", "count": 1},
    ]
    # The view was recomputed in full, and the event log says why.
    issues = [
        issue["issue_type"]
        for event in dp.read_events(str(tmp_path / "pipeline-storage" / "system" / "events"))
        if event["event_type"] == "planning_information"
        for technique in event["details"]["planning_information"]["technique_information"]
        for issue in technique.get("incrementalization_issues", [])
    ]
    assert issues and set(issues) == {"SPARK_CONNECT"}, issues
    # The rule's counts, from the stream's observed metrics on the server.
    dropped = [
        event["details"]["flow_progress"]["data_quality"]["dropped_records"]
        for event in dp.read_events(str(tmp_path / "pipeline-storage" / "system" / "events"))
        if event["event_type"] == "flow_progress"
        and event["origin"]["flow_name"] == "orders"
        and "data_quality" in event["details"]["flow_progress"]
    ]
    assert dropped == [1, 0], dropped


FAIL_RULE = """from deltaflow import pipelines as dp


@dp.table
@dp.expect_or_fail("positive", "id > 0")
def orders():
    return spark.readStream.schema("id BIGINT, kind STRING").json(spark.conf.get("shop.landing"))
"""


def test_what_cannot_run_through_connect_is_refused_by_name(
    connect_url: str, tmp_path: Path
) -> None:
    landing = _project(tmp_path, FAIL_RULE, "shop_refused")
    _land(landing, "a.json", [{"id": 1, "kind": "x"}])
    dry = _cli(tmp_path, "dry-run", "--remote", connect_url)
    assert dry.returncode == 2, dry.stdout + dry.stderr[-3000:]
    assert "Flow 'orders': an expect_or_fail rule" in dry.stderr, dry.stderr
    assert "Use expect or expect_or_drop" in dry.stderr and "classic session" in dry.stderr
    continuous = _cli(tmp_path, "run", "--continuous", "--remote", connect_url)
    assert continuous.returncode == 2 and "A continuous update" in continuous.stderr
    assert not (tmp_path / "pipeline-storage" / "tables" / "orders").exists()
    bad = _cli(tmp_path, "run", "--remote", "http://127.0.0.1:1")
    assert bad.returncode == 2 and "is not a Spark Connect URL" in bad.stderr, bad.stderr


SDP_SOURCES = """from pyspark import pipelines as dp
from pyspark.sql import SparkSession

spark = SparkSession.active()
LANDING = spark.conf.get("shop.landing")  # the spec's configuration, read at import time


@dp.table
def orders():
    return spark.readStream.schema("id BIGINT, kind STRING").json(LANDING)


@dp.materialized_view
def by_kind():
    return spark.read.table("orders").groupBy("kind").count()
"""


def test_an_sdp_project_runs_unchanged_through_connect(connect_url: str, tmp_path: Path) -> None:
    """Files as `spark-pipelines init` writes them (`from pyspark import pipelines as dp`,
    the session from `SparkSession.active()`, configuration read at import time)."""
    landing = _project(tmp_path, SDP_SOURCES, "shop_sdp")
    _land(landing, "a.json", [{"id": 1, "kind": "x"}, {"id": 2, "kind": "y"}])
    run = _cli(tmp_path, "run", "--remote", connect_url)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    tables = tmp_path / "pipeline-storage" / "tables"
    assert [r["id"] for r in _rows(tables / "orders")] == [1, 2]
    assert _rows(tables / "by_kind") == [{"kind": "x", "count": 1}, {"kind": "y", "count": 1}]


def test_a_continuous_real_time_spec_is_refused_through_connect(
    connect_url: str, tmp_path: Path
) -> None:
    """A continuous update (real-time flows included) needs the driver's own session: through
    a Connect server the CLI refuses it before anything runs, exit 2, saying what to do."""
    from tests.pipelines.test_realtime_cli import FLOWS, SPEC

    project = tmp_path / "project"
    (project / "transformations").mkdir(parents=True)
    spec = SPEC.format(source=tmp_path / "source", sink=tmp_path / "alerts")
    (project / "spark-pipeline.yml").write_text(spec)
    (project / "transformations" / "flows.py").write_text(FLOWS)
    done = subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", "pipelines", "run", "--remote", connect_url],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot run through a Spark Connect server" in done.stderr
    assert "without --remote" in done.stderr
    assert not (tmp_path / "alerts").exists()
