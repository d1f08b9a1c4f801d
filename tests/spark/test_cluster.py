"""Reads and writes on Spark's local-cluster master: executors in separate JVMs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.spark._result_job import run_result_job

HERE = Path(__file__).parent


def _spark_home(tmp: Path) -> str:
    """A SPARK_HOME of symlinks into the pyspark wheel.

    local-cluster launches workers from SPARK_HOME and writes their work dirs
    there; pointing it at a temp dir keeps those out of the virtualenv.
    """
    import pyspark

    package = Path(pyspark.__file__).parent
    home = tmp / "spark-home"
    home.mkdir()
    for entry in ("bin", "jars", "python", "sbin"):
        (home / entry).symlink_to(package / entry)
    return str(home)


@pytest.mark.slow
@pytest.mark.cluster
def test_read_write_on_local_cluster(tmp_path):
    path = str(tmp_path / "cluster_table")
    result, _ = run_result_job(
        "_cluster_job.py", path, cwd=tmp_path, env={"SPARK_HOME": _spark_home(tmp_path)}
    )

    expected_ids = list(range(20000)) + list(range(100))
    assert result["count"] == len(expected_ids)
    assert result["sum"] == sum(expected_ids)
    assert result["bucket_2"] == sum(1 for i in expected_ids if i % 5 == 2)
    assert result["driver_pid"] not in result["executor_pids"]
    assert result["block_managers"] == 3

    # The table the cluster wrote is a valid Delta table for an independent reader.
    table: pa.Table = DeltaTable(path).to_pyarrow_table()
    assert sorted(table.column("id").to_pylist()) == sorted(expected_ids)
    assert DeltaTable(path).version() == 1
