"""Stream checkpoints on S3A without renames, fenced: deltaflow's checkpoint manager
(``DeltaflowCheckpointFileManager``, set by ``deltaflow.session()`` on Spark 4.1+) against a
real S3 server (SeaweedFS).

Every Spark driver here is a child process (``_s3a_checkpoint_job.py``) with the S3A jars on
its class path (``tests/_s3a.py``; this process's classic session has none), so drivers can
be SIGKILLed and two can share a checkpoint. The tests read the store with their own S3
client and the tables with delta-rs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from tests import _object_store
from tests.spark.test_chaos import Child

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).with_name("_s3a_checkpoint_job.py"))
START_TIMEOUT = 300  # a driver JVM's start and first batch on a busy 2-core machine


@pytest.fixture(scope="module")
def job_env(object_store: _object_store.ObjectStore) -> dict[str, str]:
    import pyspark

    from tests import _s3a

    if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (4, 1):
        pytest.skip("checkpoints on S3A need Spark 4.1+ (Hadoop 3.4.2's conditional create)")
    conf = _s3a.s3a_conf_or_skip(object_store)
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "DELTAFLOW_JOB_CONF": json.dumps(conf),
    }


@pytest.fixture
def where(object_store: _object_store.ObjectStore) -> Any:
    """``(s3a_uri, s3_uri, bucket/key)`` of one fresh location."""

    def make(name: str) -> tuple[str, str, str]:
        s3 = object_store.uri(name)
        return "s3a://" + s3.removeprefix("s3://"), s3, s3.removeprefix("s3://")

    return make


def keys_under(store: _object_store.ObjectStore, prefix: str) -> list[str]:
    infos = _object_store.store_fs(store).get_file_info(pafs.FileSelector(prefix, recursive=True))
    return sorted(i.path.removeprefix(prefix + "/") for i in infos if i.type == pafs.FileType.File)


def read(store: _object_store.ObjectStore, key: str) -> bytes:
    with _object_store.store_fs(store).open_input_stream(key) as stream:
        return bytes(stream.read())


def child(env: dict[str, str], tmp_path: Path, name: str, *args: str) -> Child:
    log = tmp_path / name / "job.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return Child(list(args), log, job=JOB, env=env)


def append(store: _object_store.ObjectStore, s3: str, first: int, count: int) -> None:
    ids = list(range(first, first + count))
    data = pa.table({"id": pa.array(ids, pa.int64()), "k": [str(i % 3) for i in ids]})
    write_deltalake(s3, data, mode="append", storage_options=store.storage_options)


def sink_ids(store: _object_store.ObjectStore, s3: str) -> list[int]:
    table = DeltaTable(s3, storage_options=store.storage_options)
    return sorted(r["id"] for r in table.to_pyarrow_table().to_pylist())


def numbered(keys: list[str], folder: str) -> list[int]:
    return sorted(
        int(k.split("/")[1]) for k in keys if k.startswith(folder + "/") and k[-1].isdigit()
    )


def temp_objects(keys: list[str]) -> list[str]:
    return [k for k in keys if k.rsplit("/", 1)[-1].startswith(".") or k.endswith(".tmp")]


def test_the_manager_writes_final_keys_put_if_absent(job_env, object_store, where, tmp_path):
    s3a, _, key = where("manager")
    local = tmp_path / "local_checkpoint"
    (local / "offsets").mkdir(parents=True)
    job = child(job_env, tmp_path, "manager", "manager", s3a, str(local))
    found = json.loads(job.wait_for("RESULT ", START_TIMEOUT).removeprefix("RESULT "))
    job.finish(120)

    assert found["configured"] == "org.apache.spark.sql.deltaflow.DeltaflowCheckpointFileManager"
    # Two writers of offsets/0: the first wins, the second gets Hadoop's
    # FileAlreadyExistsException (Spark's CONCURRENT_STREAM_LOG_UPDATE), the object keeps
    # the first's bytes; the same bytes again (a retried upload) are no conflict.
    assert "RenameBased" not in found["stream_class"]
    assert found["first_close"] is None
    assert found["second_close"] == "org.apache.hadoop.fs.FileAlreadyExistsException"
    assert found["second_cancel"] is None
    assert found["same_bytes_close"] is None
    assert read(object_store, key + "/offsets/0") == b"first writer"
    # cancel() published nothing; overwrite=true replaced; a cancelled overwrite kept v2.
    assert found["cancelled_exists"] is False
    assert read(object_store, key + "/state/0/0/1.delta") == b"state v2"
    # Conditional create switched off: Spark's rename path (a temp file, then the key).
    assert "RenameBased" in found["fallback_stream_class"]
    assert found["fallback_close"] is None
    assert read(object_store, key + "/commits/0") == b"renamed"
    keys = keys_under(object_store, key)
    assert keys == ["commits/0", "offsets/0", "state/0/0/1.delta"], keys
    # A local path delegates to Spark: its hidden temp file before close, fenced as ever.
    assert "RenameBased" in found["local_stream_class"]
    assert [n for n in found["local_before_close"] if n.startswith(".0.")], found
    assert (local / "offsets" / "0").read_bytes() == b"local"
    assert found["local_second_close"] == "org.apache.hadoop.fs.FileAlreadyExistsException"


@pytest.fixture
def stream_tables(object_store: _object_store.ObjectStore, where: Any) -> Iterator[Any]:
    source, sink, checkpoint = where("src"), where("dst"), where("ckpt")
    append(object_store, source[1], 0, 20)
    yield source, sink, checkpoint


def test_a_killed_and_a_stopped_driver_leave_no_temp_objects(
    job_env, object_store, stream_tables, tmp_path
):
    (source_a, source_s3, _), (sink_a, sink_s3, _), (ckpt_a, _, ckpt_key) = stream_tables
    looping = child(job_env, tmp_path, "loop", "stream", source_a, sink_a, ckpt_a, "loop")
    try:
        looping.wait_for("PROGRESS ", START_TIMEOUT)
        for first in (20, 30):  # two more batches, then SIGKILL mid-stream
            append(object_store, source_s3, first, 10)
            looping.wait_for("PROGRESS ", 120)
        append(object_store, source_s3, 40, 10)
        looping.run_for(0.5)
    finally:
        looping.kill()
    killed = keys_under(object_store, ckpt_key)
    assert not temp_objects(killed), killed
    last_offset = max(numbered(killed, "offsets"))

    append(object_store, source_s3, 50, 10)
    once = child(job_env, tmp_path, "once", "stream", source_a, sink_a, ckpt_a, "once")
    done = once.wait_for("DONE ", START_TIMEOUT)
    once.finish(120)
    assert int(done.split()[1]) > numbered(killed, "commits")[-1]
    stopped = keys_under(object_store, ckpt_key)
    assert not temp_objects(stopped), stopped
    offsets, commits = numbered(stopped, "offsets"), numbered(stopped, "commits")
    assert offsets == list(range(len(offsets))) and offsets[-1] >= last_offset
    assert commits == offsets  # every planned batch committed, ids continue
    assert sink_ids(object_store, sink_s3) == list(range(60))


def test_two_drivers_on_one_checkpoint_one_is_fenced(
    job_env, object_store, stream_tables, tmp_path
):
    (source_a, source_s3, _), (sink_a, sink_s3, _), (ckpt_a, _, ckpt_key) = stream_tables
    first = child(job_env, tmp_path, "first", "stream", source_a, sink_a, ckpt_a, "loop")
    try:
        first.wait_for("PROGRESS ", START_TIMEOUT)
    except BaseException:
        first.kill()
        raise
    # The second joins a running stream: the race is on a batch's offsets or commit file
    # (two drivers started together race on the query's metadata file instead).
    second = child(job_env, tmp_path, "second", "stream", source_a, sink_a, ckpt_a, "loop")
    drivers = [first, second]
    try:
        # New data every moment: both plan batches until one loses.
        deadline, loser, n = time.monotonic() + 2 * START_TIMEOUT, None, 20
        while loser is None and time.monotonic() < deadline:
            append(object_store, source_s3, n, 5)
            n += 5
            for driver in drivers:
                driver.run_for(0.5)
                if driver.proc.poll() is not None:
                    loser = driver
        assert loser is not None, "neither driver was fenced\n" + second.stderr_tail()
        read_until = time.monotonic() + 30
        while "EOF" not in loser.drain() and time.monotonic() < read_until:
            loser.run_for(0.1)
        assert any(line.startswith("FAILED fenced") for line in loser.seen), (
            loser.seen,
            loser.stderr_tail(),
        )
        winner = second if loser is first else first
        assert winner.proc.poll() is None, winner.stderr_tail()
        if "STARTED" not in winner.drain():
            winner.wait_for("STARTED", START_TIMEOUT)
        winner.drain()  # what it printed so far: the next PROGRESS is a new batch
        append(object_store, source_s3, n, 5)
        n += 5
        winner.wait_for("PROGRESS ", 120)  # the other keeps running
        assert winner.proc.poll() is None
        # The winner alone carries the stream on: every id once (the loser's batches, if it
        # planned any, are not in the sink twice).
        deadline = time.monotonic() + 2 * START_TIMEOUT
        while len(sink_ids(object_store, sink_s3)) < n and time.monotonic() < deadline:
            assert winner.proc.poll() is None, winner.stderr_tail()
            winner.run_for(0.5)
    finally:
        for driver in drivers:
            driver.kill()
    assert sink_ids(object_store, sink_s3) == list(range(n))  # exactly once
    keys = keys_under(object_store, ckpt_key)
    assert not temp_objects(keys), keys
