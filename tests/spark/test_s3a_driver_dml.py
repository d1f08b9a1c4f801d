"""DML from the Python API on ``s3a://`` runs on the JVM path: the driver Python (where
``DeltaTable.merge`` plans its target scan and rewrite) learns from its session's JVM which
object-store schemes Hadoop opens, as the brain does from the connector's variable. Before,
it did not, and a MERGE into an ``s3a://`` table read and rewrote every touched file on the
Python data path (``bench_s3.py --s3a --profile``: no S3A request during the MERGE, 4 CPU-s
in Python workers). The driver is a child process with the S3A jars (``_s3a_dml_job.py``),
so no S3A class path reaches this process's shared session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).with_name("_s3a_dml_job.py"))
TIMEOUT = 600  # a driver JVM's start, a write and a MERGE on a busy 2-core machine


def test_a_python_api_merge_on_s3a_takes_the_jvm_path(object_store, tmp_path):
    from tests import _s3a

    conf = _s3a.s3a_conf_or_skip(object_store)
    s3 = object_store.uri("driver-dml")
    # No AWS_* in the driver's environment: the driver Python's own log reads (df.write.save
    # plans the write here, through delta-rs) take them from fs.s3a.* as the brain does.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "PYSPARK_PYTHON": sys.executable,
        "DELTAFLOW_JOB_CONF": json.dumps(conf),
    }
    done = subprocess.run(
        [sys.executable, JOB, "s3a://" + s3.removeprefix("s3://")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["opens"] is True
    made = result["merge_requests"]
    # The rewritten file and the inserted rows went through S3A (the JVM's Parquet writer),
    # the target was read through it too.
    assert made["object_put_request"] >= 1, made
    assert made["action_http_get_request"] >= 1, made
    assert result["updated_or_inserted"] == 20
    table = DeltaTable(s3, storage_options=object_store.storage_options)
    assert table.to_pyarrow_table().num_rows == 110


def test_the_brains_variable_wins_over_the_drivers_answer(monkeypatch):
    """In the brain the connector's variable decides (also when it names nothing:
    ``jvmPath=false``); in a driver Python, without it, what ``register()`` learned."""
    from deltaflow.spark.read import _native

    monkeypatch.setattr(_native, "_driver_object_stores", frozenset({"s3a"}))
    monkeypatch.delenv(_native.HADOOP_SCHEMES_VARIABLE, raising=False)
    _native.hadoop_object_stores.cache_clear()
    try:
        assert _native.hadoop_opens("s3a://b/t")
        assert not _native.hadoop_opens("gs://b/t")
        monkeypatch.setenv(_native.HADOOP_SCHEMES_VARIABLE, "")
        _native.hadoop_object_stores.cache_clear()
        assert not _native.hadoop_opens("s3a://b/t")
    finally:
        monkeypatch.undo()
        _native.hadoop_object_stores.cache_clear()


def test_a_session_without_s3a_learns_no_object_store(spark):
    from deltaflow.spark.read import _native

    assert _native.learn_driver_object_stores(spark) == frozenset()
    assert not _native.hadoop_opens("s3a://b/t")
