"""Chaos on object storage, on a real cluster: the stateful Delta -> Delta stream of
test_chaos.py (tests/spark/_chaos_stream_job.py: silver = filter + projection, gold = counts
per key in complete mode) with every table on S3 (SeaweedFS) and its driver on the
standalone cluster of tests/_standalone.py.

1. The driver process (its JVM, brain and Python workers) is SIGKILLed at random moments,
   then started again; the executors on the workers die with their application.
2. The S3 gateway is killed under the running stream and started again on the same data:
   the stream must recover, or fail with a typed deltaflow error; after a restart the
   result is exact.

Checkpoints live on a local directory the driver and the executors share (the stateful
gold query's state store is written by executors): Spark's Hadoop layer cannot open
``s3://`` from the pyspark wheel.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake

from tests import _object_store
from tests._standalone import StandaloneCluster, cluster_conf, driver_environment
from tests._waiting import wait_until
from tests.spark.test_chaos import (
    ROWS_PER_COMMIT,
    Child,
    Feeder,
    chaos_seed,
    kill_at_random_moments,
    source_batch,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.cluster]

KILLS = 3  # each restart starts a driver and two executors: bounded, not exhaustive
UPSTREAM_MAX_COMMITS = 60
START_TIMEOUT = 420  # a driver + executors + a first batch on 2 loaded cores
OUTAGE = 8.0  # seconds the gateway stays down (the stream's sink retries over that)


class S3Upstream(Feeder):
    """Appends ROWS_PER_COMMIT rows with unique event ids per commit, to a table on S3."""

    def __init__(self, uri: str, options: dict[str, str], interval: float = 1.0) -> None:
        super().__init__(interval, UPSTREAM_MAX_COMMITS)
        self.uri, self.options = uri, options

    def step(self, number: int) -> None:
        write_deltalake(
            self.uri, source_batch(number + 1), mode="append", storage_options=self.options
        )


def stream_tables(store: _object_store.ObjectStore, tmp: Path) -> list[str]:
    """source, silver, gold on S3; their checkpoints on the shared local disk."""
    source, silver, gold = (store.uri(n) for n in ("source", "silver", "gold"))
    write_deltalake(source, source_batch(0), storage_options=store.storage_options)
    return [source, silver, gold, str(tmp / "ck_silver"), str(tmp / "ck_gold")]


def stream_child(
    cluster: StandaloneCluster, store_env: dict[str, str], tables: list[str], mode: str, log: Path
) -> Child:
    conf = cluster_conf(cluster, store_env)
    conf["spark.sql.shuffle.partitions"] = "1"
    env = driver_environment(conf, store_env)
    return Child(["stream", *tables, mode], log, env=env)


def assert_exact(store: _object_store.ObjectStore, tables: list[str], commits: int, ctx: str):
    source, silver, gold = tables[:3]
    options = store.storage_options
    source_rows = DeltaTable(source, storage_options=options).to_pyarrow_table().to_pylist()
    assert len(source_rows) == (commits + 1) * ROWS_PER_COMMIT, ctx
    expected_silver = collections.Counter(
        (r["event_id"], r["key"], r["value"] * 2) for r in source_rows if r["value"] % 3 != 0
    )
    got_silver = collections.Counter(
        (r["event_id"], r["key"], r["doubled"])
        for r in DeltaTable(silver, storage_options=options).to_pyarrow_table().to_pylist()
    )
    lost, duplicated = expected_silver - got_silver, got_silver - expected_silver
    assert not lost and not duplicated, (
        f"{ctx}: {len(lost)} lost, {len(duplicated)} duplicated or wrong silver rows,"
        f" e.g. {list(lost)[:5]} {list(duplicated)[:5]}"
    )
    expected_gold = collections.Counter(r["key"] for r in source_rows)
    got_gold = {
        r["key"]: r["count"]
        for r in DeltaTable(gold, storage_options=options).to_pyarrow_table().to_pylist()
    }
    assert got_gold == dict(expected_gold), ctx


def catch_up(start: Callable[[], Child]) -> None:
    final = start()
    final.wait_for("DONE", START_TIMEOUT)
    final.finish(120)


@pytest.mark.timeout(1800)
def test_s3_stream_on_the_cluster_killed_at_random_moments(
    standalone_cluster, object_store, tmp_path
):
    seed = chaos_seed()
    rng, context = random.Random(seed), f"seed {seed}"
    tables = stream_tables(object_store, tmp_path)
    log = tmp_path / "child.log"
    started = time.monotonic()

    def start(mode: str) -> Callable[[], Child]:
        return lambda: stream_child(standalone_cluster, object_store.env, tables, mode, log)

    upstream = S3Upstream(tables[0], object_store.storage_options)
    upstream.start()
    try:
        kill_at_random_moments(
            start("loop"), KILLS, rng, after_progress=3.0, after_start=20.0, timeout=START_TIMEOUT
        )
    finally:
        upstream.stop()
    catch_up(start("once"))
    print(f"{upstream.steps} upstream commits, {KILLS} kills: {time.monotonic() - started:.0f}s")
    assert_exact(object_store, tables, upstream.steps, context)


def append_commits(store: _object_store.ObjectStore, uri: str, commits: range) -> None:
    for commit in commits:
        write_deltalake(
            uri, source_batch(commit), mode="append", storage_options=store.storage_options
        )


@pytest.mark.timeout(1200)
def test_s3_gateway_restarted_under_a_running_stream_on_the_cluster(standalone_cluster, tmp_path):
    """Its own SeaweedFS (the session's store stays up for other tests), killed and started
    again on the same data directory and port while the stream runs."""
    began = time.monotonic()

    def phase(name: str) -> None:  # where the minutes go, in the test's output
        print(f"gateway restart: {name} at {time.monotonic() - began:.0f}s", flush=True)

    endpoint = f"http://127.0.0.1:{_object_store.free_port()}"
    data_dir = tmp_path / "seaweedfs"
    data_dir.mkdir()
    log = tmp_path / "child.log"
    gateway = _object_store.start_seaweedfs(data_dir, endpoint)
    store = gateway.__enter__()
    try:
        tables = stream_tables(store, tmp_path)
        child = stream_child(standalone_cluster, store.env, tables, "loop", log)
        try:
            phase("gateway up, stream starting")
            child.wait_for("PROGRESS", START_TIMEOUT)
            phase("stream progressing")
            append_commits(store, tables[0], range(1, 5))  # while the stream reads
            gateway.__exit__(None, None, None)  # SIGKILL: the gateway vanishes mid-stream
            child.run_for(OUTAGE)
            gateway = _object_store.start_seaweedfs(data_dir, endpoint)
            store = gateway.__enter__()
            phase("gateway restarted")
            # The S3 port answers before the volume servers re-registered with the master;
            # until then reading a file is a 500.
            wait_until(lambda: readable(store, tables[0]), 120, "the source readable again")
            phase("source readable")
            failed_meanwhile = failure(child.drain())
            append_commits(store, tables[0], range(5, 7))
            # From here on, a silver batch with rows ran after the restart.
            outcome = failed_meanwhile or recovered_or_failed(child)
            # A stream that recovered catches up by itself: no second driver (its start is
            # most of this test's minutes on a loaded machine) unless it stops short.
            caught_up = outcome == "recovered" and running_stream_caught_up(store, tables, child)
        finally:
            child.kill()
        phase(f"the stream {outcome}")
        print(f"gateway restart: child said {child.drain()}")
        if not caught_up:
            catch_up(lambda: stream_child(standalone_cluster, store.env, tables, "once", log))
        phase("caught up")
        assert_exact(store, tables, 6, "gateway restart")
    finally:
        gateway.__exit__(None, None, None)


def running_stream_caught_up(
    store: _object_store.ObjectStore, tables: list[str], child: Child
) -> bool:
    """Whether the running stream's silver and gold become exact (all 6 upstream commits)
    before it exits or START_TIMEOUT passes."""

    def exact() -> bool:
        try:
            assert_exact(store, tables, 6, "running stream")
        except AssertionError:
            return False
        return True

    deadline = time.monotonic() + START_TIMEOUT
    while child.proc.poll() is None and time.monotonic() < deadline:
        if exact():
            return True
        child.run_for(2.0)
    return False


def readable(store: _object_store.ObjectStore, uri: str) -> bool:
    try:
        DeltaTable(uri, storage_options=store.storage_options).to_pyarrow_table()
    except OSError:
        return False
    return True


def failure(lines: list[str]) -> str | None:
    """How the child's query failed, if it did; an untyped failure fails the test."""
    failed = [line for line in lines if line.startswith("FAILED")]
    if not failed:
        return None
    kind = failed[-1].split()[2]
    assert kind != "untyped", f"untyped failure: {failed[-1]}"
    return f"failed cleanly ({failed[-1][:300]})"


def recovered_or_failed(child: Child) -> str:
    """Wait until the running stream finishes a silver batch with rows (it recovered) or
    ends with a typed deltaflow error; fail on an untyped failure or a timeout."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            line = child.wait_for("PROGRESS silver", deadline - time.monotonic())
        except AssertionError:
            outcome = failure(child.drain())
            assert outcome, f"the stream neither progressed nor failed\n{child.stderr_tail()}"
            return outcome
        if int(line.split()[3]) > 0:
            return "recovered"
