"""Shared fixtures: one Spark session per test process, a fresh table path per test."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    import deltaflow

    session = deltaflow.session(
        app_name="deltaflow-tests",
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture
def table_path(tmp_path: Path) -> Callable[[str], str]:
    """A factory of fresh table locations under this test's temp dir."""
    counter = itertools.count()

    def make(name: str = "t") -> str:
        return str(tmp_path / f"{name}_{next(counter)}")

    return make
