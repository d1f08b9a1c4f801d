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
import pyarrow.fs as pafs
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


def test_put_if_absent_on_s3_never_overwrites_and_fails_typed(object_store):
    from deltaflow import ObjectStoreError
    from deltaflow.table import _conditional_put

    _object_store.plan_environment()
    uri = object_store.uri("put") + "/_delta_log/00000000000000000000.json"
    assert _conditional_put.put_if_absent(uri, b"first\n")
    assert not _conditional_put.put_if_absent(uri, b"second\n")
    fs = pafs.S3FileSystem(
        access_key=object_store.env["AWS_ACCESS_KEY_ID"],
        secret_key=object_store.env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=object_store.endpoint,
        region=object_store.env["AWS_REGION"],
    )
    with fs.open_input_stream(uri.removeprefix("s3://")) as f:
        assert f.read() == b"first\n"

    wrong = {**object_store.storage_options, "AWS_SECRET_ACCESS_KEY": "not-the-secret-1234"}
    with pytest.raises(ObjectStoreError) as caught:
        _conditional_put.put_if_absent(uri + ".other", b"x", storage_options=wrong)
    assert caught.value.kind == "credentials"
    assert caught.value.table_uri == uri + ".other"
    assert "not-the-secret-1234" not in str(caught.value)
    assert object_store.env["AWS_SECRET_ACCESS_KEY"] not in str(caught.value)
