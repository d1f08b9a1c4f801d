"""Writers in several processes racing on one ``s3://`` table (a real S3 server, SeaweedFS):
delta-rs appends, deltaflow log-writer appends and a read-modify-write DML, all at once.

Both commit paths take a version with a put-if-absent (``If-None-Match: *``); a lost race
is re-checked for conflicts and retried at the next version. So no commit overwrites
another, no row is lost or doubled, and every commit a writer was told succeeded is in
the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests import _object_store

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("_s3_commit_job.py")
COMMITS = 8
MODES = {"w0": "append-log", "w1": "append-delta-rs", "w2": "update"}


def test_concurrent_writers_from_three_processes_lose_and_double_nothing(object_store):
    _object_store.plan_environment()  # this process reads the table through the env too
    uri, options = object_store.uri("race"), object_store.storage_options
    schema = pa.schema([("writer", pa.string()), ("i", pa.int64()), ("value", pa.int64())])
    seed = pa.table({"writer": ["w2"], "i": [-1], "value": [0]}, schema=schema)
    write_deltalake(uri, seed, storage_options=options)

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        **object_store.env,
        "PYTHONPATH": os.pathsep.join(
            [str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")]
        ),
    }
    workers = {
        writer: subprocess.Popen(
            [sys.executable, str(JOB), uri, writer, mode, str(COMMITS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for writer, mode in MODES.items()
    }
    reported: list[dict[str, object]] = []
    for writer, process in workers.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"{writer} failed:\n{err[-3000:]}"
        reported.extend(json.loads(line) for line in out.splitlines() if line.strip())
        assert object_store.env["AWS_SECRET_ACCESS_KEY"] not in err + out

    table = DeltaTable(uri, storage_options=options)
    rows = table.to_pyarrow_table().to_pylist()
    appended = sorted((r["writer"], r["i"]) for r in rows if r["writer"] != "w2")
    expected = sorted((w, i) for w in ("w0", "w1") for i in range(COMMITS))
    assert appended == expected  # every append once: none lost, none doubled
    assert [r["value"] for r in rows if r["writer"] == "w2"] == [COMMITS]  # no lost update

    # Every commit a writer was told succeeded is in the log, each at its own version.
    assert len(reported) == len(MODES) * COMMITS
    in_log = {h["testCommit"]: h.get("version") for h in table.history() if "testCommit" in h}
    for report in reported:
        assert f"{report['writer']}/{report['i']}" in in_log
    versions = [r["version"] for r in reported if r["version"] is not None]
    assert len(versions) == len(set(versions)) == 2 * COMMITS
    assert table.version() == len(MODES) * COMMITS  # the seed at 0, then one version each
