"""Shared fixtures: one Spark session per test process, a fresh table path per test."""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import _object_store, _schedule

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_COSTS = _schedule.FileCosts()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _schedule.order_longest_first(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _COSTS.add(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _COSTS.seconds:
        terminalreporter.section("seconds per file (longest 30) and process")
        for line in _COSTS.lines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    import deltaflow

    # Before the JVM starts: it, the brain process and Spark's Python workers inherit the
    # environment at launch, and the object store tests reach S3 through it.
    _object_store.plan_environment()
    session = deltaflow.session(
        app_name="deltaflow-tests",
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            # Managed tables in this process's own warehouse: `make test` runs two test
            # processes, whose tables of the same name must not share a folder.
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_object_store.ObjectStore]:
    """A real S3 server (SeaweedFS) with one bucket, at the endpoint the environment names."""
    with _object_store.start_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as store:
        yield store


@pytest.fixture
def table_path(tmp_path: Path) -> Callable[[str], str]:
    """A factory of fresh table locations under this test's temp dir."""
    counter = itertools.count()

    def make(name: str = "t") -> str:
        return str(tmp_path / f"{name}_{next(counter)}")

    return make


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Spark standalone master and two workers, separate JVMs (tests/_standalone.py)."""
    import deltaflow
    from tests import _standalone

    deltaflow_parent = str(Path(deltaflow.__file__).resolve().parents[1])
    with _standalone.start_standalone(
        tmp_path_factory.mktemp("standalone"), deltaflow_parent
    ) as cluster:
        print(f"standalone cluster up in {cluster.started_in:.1f} s")
        yield cluster
        stopping = time.monotonic()
    print(f"standalone cluster stopped in {time.monotonic() - stopping:.1f} s")


@pytest.fixture
def merge_as_spark_jobs(spark: Any) -> Iterator[None]:
    """MERGEs run as Spark jobs (the delta-rs route off), for tests of that route's parts."""
    from deltaflow.spark.dml._merge_native import MAX_SOURCE_ROWS_CONF

    spark.conf.set(MAX_SOURCE_ROWS_CONF, "0")
    yield
    spark.conf.unset(MAX_SOURCE_ROWS_CONF)
