"""Batch, DML and streaming on a real Spark standalone cluster (master + two workers, each a
JVM of its own, tests/_standalone.py), against local paths and against S3 (SeaweedFS).

Each job is a driver process of its own (tests/spark/_standalone_job.py) with
``spark.master=spark://...``: driver, executors, their Python workers and the brain are all
different processes. The workers start without AWS settings; a job on S3 sends them to its
executors with ``spark.executorEnv.*``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

import deltaflow
from deltaflow.spark._jar import jar_path
from tests._standalone import StandaloneCluster, cluster_conf, driver_environment
from tests.spark import _standalone_job as job

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

HERE = Path(__file__).parent
JOB_TIMEOUT = 600  # a driver, two executors and their Python workers on 2 loaded cores


def run_job(
    cluster: StandaloneCluster, base: str, tmp: Path, s3_env: dict[str, str], parts: str
) -> Any:
    conf = cluster_conf(cluster, s3_env)
    args = [base, str(tmp / "checkpoints"), parts]
    proc = subprocess.run(
        [sys.executable, str(HERE / "_standalone_job.py"), *args],
        env=driver_environment(conf, s3_env),
        cwd=tmp,  # the job's warehouse and catalog (metastore) go here
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
    )
    (tmp / "driver.log").write_text(proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, first_error(proc.stderr) + "\n" + cluster.logs()
    result = json.loads(lines[-1].removeprefix("RESULT "))
    timings = ", ".join(f"{part} {result[part]['seconds']:.1f}" for part in parts.split(","))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"job seconds: session {result['session_seconds']:.1f}, {timings}; load {load}")
    return result


def first_error(stderr: str) -> str:
    """The driver's first traceback (Spark's JVM stack traces after it are long)."""
    start = stderr.find("Traceback")
    return stderr[start : start + 4000] if start >= 0 else stderr[-4000:]


def expected_rows_after_dml() -> list[list[Any]]:
    rows = [[i, str(i % 5), i * 0.5] for i in range(job.ROWS)]
    rows += [[i, str(i % 5), i * 0.5] for i in range(job.APPENDED)]
    for row in rows:
        if 100 <= row[0] < 110:
            row[2] = -1.0
    rows = [row for row in rows if row[0] < 19000]
    for row in rows:
        if 18990 <= row[0] < 19010:
            row[2] = row[0] + 1000.0
    rows += [[i, str(i % 5), float(i)] for i in range(19000, 19010)]
    return sorted(rows)


def assert_ran_on_the_cluster(cluster: StandaloneCluster, result: dict[str, Any]) -> None:
    executors = result["executors"]
    assert executors["block_managers"] == 3  # the driver and one executor per worker
    assert executors["driver_pid"] not in executors["python_pids"]
    # Executors' Python workers import the deltaflow under test (the "wheel on each node").
    assert executors["deltaflow_dirs"] == [os.path.dirname(deltaflow.__file__)]
    # The connector jar reached every executor through spark.jars (fetched from the
    # driver into the executor's work directory), not through a shared path.
    jar = jar_path().name
    for work_dir in cluster.work_dirs:
        fetched = list((work_dir / result["app_id"]).glob(f"*/{jar}"))
        assert fetched, f"{jar} not fetched under {work_dir}"


def assert_job_results(result: dict[str, Any]) -> None:
    expected_ids = list(range(job.ROWS)) + list(range(job.APPENDED))
    assert result["batch"]["count"] == len(expected_ids)
    assert result["batch"]["sum"] == sum(expected_ids)
    assert result["batch"]["bucket_2"] == sum(1 for i in expected_ids if i % 5 == 2)

    if "dml" in result:
        assert result["dml"]["rows"] == expected_rows_after_dml()
        assert result["dml"]["operations"][-3:] == ["UPDATE", "DELETE", "MERGE"]

    # Each source row with k <> 3 exactly once, across the restart and the empty run.
    total = job.STREAM_FIRST + job.STREAM_MORE
    assert result["stream"]["sink_ids"] == [i for i in range(total) if i % 7 != 3]


def test_batch_dml_and_stream_on_local_paths(standalone_cluster, tmp_path):
    base = str(tmp_path / "tables")
    result = run_job(standalone_cluster, base, tmp_path, {}, "batch,dml,stream")
    assert_ran_on_the_cluster(standalone_cluster, result)
    assert_job_results(result)
    # An independent reader sees the same tables.
    events = DeltaTable(f"{base}/events").to_pyarrow_table()
    assert events.num_rows == len(expected_rows_after_dml())
    sink = DeltaTable(f"{base}/stream_dst")
    query_id = json.loads((tmp_path / "checkpoints" / "stream" / "metadata").read_text())["id"]
    assert sink.transaction_version(query_id) == 1  # batches 0 and 1; the empty run none


def test_batch_dml_and_stream_on_s3(standalone_cluster, object_store, tmp_path):
    base = object_store.uri("cluster")
    # DML on s3:// tables scans and rewrites on the Python data path (Spark's Parquet
    # reader cannot open s3:// from the wheel), in the executors' Python workers.
    result = run_job(standalone_cluster, base, tmp_path, object_store.env, "batch,dml,stream")
    assert_ran_on_the_cluster(standalone_cluster, result)
    assert_job_results(result)
    options = object_store.storage_options
    events = DeltaTable(f"{base}/events", storage_options=options).to_pyarrow_table()
    assert events.num_rows == len(expected_rows_after_dml())
    sink = DeltaTable(f"{base}/stream_dst", storage_options=options)
    query_id = json.loads((tmp_path / "checkpoints" / "stream" / "metadata").read_text())["id"]
    assert sink.transaction_version(query_id) == 1
