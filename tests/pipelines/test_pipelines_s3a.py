"""A declarative pipeline stored on S3 with Hadoop's S3A on the session's class path: its
streaming checkpoints live beside its tables on the object store, with no
``pipelines.checkpointRoot`` (issue 29 part 4).

Each update runs in a driver process of its own (``_s3a_pipeline_job.py``): the S3A jars
must be on the JVM's class path when it starts, and this process's shared session has none.
``s3://`` is deliberately not mapped to S3A there, so the checkpoints of the ``s3://``
storage are written as ``s3a://`` (the same bucket and keys).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pyarrow.fs as pafs
import pytest

from deltaflow.pipelines._flow_identity import IDENTITY_FILE
from tests import _object_store
from tests._standalone import driver_environment
from tests.pipelines.test_pipelines_s3 import table_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job_conf(object_store: _object_store.ObjectStore) -> dict[str, str]:
    from tests import _s3a

    conf = _s3a.s3a_conf_or_skip(object_store)
    for unmapped in ("spark.hadoop.fs.s3.impl", "spark.hadoop.fs.AbstractFileSystem.s3.impl"):
        conf.pop(unmapped)
    return conf


def run_update(
    conf: dict[str, str], store: _object_store.ObjectStore, source: str, storage: str, rows: Any
) -> dict[str, Any]:
    job = [sys.executable, "-m", "tests.pipelines._s3a_pipeline_job", source, storage]
    done = subprocess.run(
        [*job, json.dumps(rows)],
        env=driver_environment(conf, store.env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(results[-1].removeprefix("RESULT "))


def keys_under(store: _object_store.ObjectStore, uri: str) -> list[str]:
    fs, path = _object_store.store_fs(store), uri.removeprefix("s3://")
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    return sorted(i.path.removeprefix(path + "/") for i in fs.get_file_info(selector))


def test_checkpoints_live_under_the_pipelines_s3_storage(job_conf, object_store, tmp_path) -> None:
    source, storage = object_store.uri("orders"), object_store.uri("pipeline")
    # The two drivers share one catalog (embedded Derby under this warehouse), this test's own.
    job_conf = {**job_conf, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}

    first = run_update(job_conf, object_store, source, storage, [[1, "a", 10.0], [2, "b", -1.0]])
    assert first["state"] == "COMPLETED", first
    assert first["rows"]["bronze"] == 2 and first["rows"]["silver"] == 1
    checkpoints = keys_under(object_store, f"{storage}/checkpoints")
    for flow in ("bronze", "silver"):
        # Spark's offset and commit logs and the runner's identity file, on the store.
        wanted = {"offsets/0", "commits/0", "metadata", IDENTITY_FILE}
        assert {f"{flow}/{name}" for name in wanted} <= set(checkpoints), checkpoints
    assert not any(k.rsplit("/", 1)[-1].endswith(".tmp") for k in checkpoints), checkpoints

    # A second update, a new driver: the checkpoints on the store carry the position on.
    again = run_update(job_conf, object_store, source, storage, [[3, "b", 7.0]])
    assert again["state"] == "COMPLETED", again
    assert again["rows"]["bronze"] == 1 and again["rows"]["silver"] == 1
    assert "bronze/commits/1" in keys_under(object_store, f"{storage}/checkpoints")
    silver = sorted(r["id"] for r in table_rows(object_store, f"{storage}/tables/silver"))
    assert silver == [1, 3]
    gold = {r["kind"]: r["total"] for r in table_rows(object_store, f"{storage}/tables/gold")}
    assert gold == {"a": 10.0, "b": 7.0}
