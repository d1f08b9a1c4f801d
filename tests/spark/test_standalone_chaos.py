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

3. With Hadoop's S3A (``tests/_s3a.py``, Spark 4.1+) everything moves to ``s3a://``,
   RocksDB state included: a windowed count (``_chaos_stream_job.py windows``) survives a
   SIGKILLed worker (its process group: worker, executor, Python workers) and two SIGKILLed
   drivers, every window exactly once (docs/architecture.md, "Stateful streams on S3A,
   killed").
"""

from __future__ import annotations

import collections
import itertools
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from tests import _object_store, _s3a
from tests._standalone import StandaloneCluster, cluster_conf, driver_environment
from tests._waiting import wait_until
from tests.spark._chaos_stream_job import WINDOW_SECONDS
from tests.spark.test_chaos import (
    ROWS_PER_COMMIT,
    Child,
    Feeder,
    chaos_seed,
    kill_at_random_moments,
    source_batch,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.cluster]

KILLS = 2  # one at a batch, one at start-up; each restart starts a driver and two executors
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


# --- A stateful stream with its RocksDB state on S3A, a worker and the driver killed -------
#
# Everything on s3a:// (source, sink, checkpoint, state), docs/notes/s3a-next.md 4.C: the
# executors write the RocksDB state through Hadoop's S3A, so when a worker dies its
# partitions' state is reloaded from the store by the other executor.

WINDOW_ROWS = 40  # rows per upstream commit, one second of event time apart
WINDOW_KEYS = 3
WINDOW_EPOCH = 1_700_000_000  # event time of event 0 (UTC seconds, a window boundary)
FAR_FUTURE = 10**6  # seconds ahead: moves the watermark past every window
WINDOW_UPSTREAM_COMMITS = 300  # bounds the source if the first driver is slow


def window_batch(first: int, count: int, offset: int = 0) -> pa.Table:
    ids = list(range(first, first + count))
    return pa.table(
        {
            "event_id": pa.array(ids, pa.int64()),
            "key": pa.array([f"k{(i * 7) % WINDOW_KEYS}" for i in ids], pa.string()),
            "event_time": pa.array(
                [(WINDOW_EPOCH + i + offset) * 1_000_000 for i in ids], pa.timestamp("us", "UTC")
            ),
        }
    )


class WindowUpstream(Feeder):
    """Appends WINDOW_ROWS events per commit, event time rising, to a table on S3."""

    def __init__(self, uri: str, options: dict[str, str]) -> None:
        super().__init__(1.0, WINDOW_UPSTREAM_COMMITS)
        self.uri, self.options = uri, options

    def step(self, number: int) -> None:
        batch = window_batch((number + 1) * WINDOW_ROWS, WINDOW_ROWS)
        write_deltalake(self.uri, batch, mode="append", storage_options=self.options)


def expected_windows(store: _object_store.ObjectStore, source: str) -> dict[tuple[int, str], int]:
    """(window start in UTC seconds, key) -> count of the source's rows, as Spark's tumbling
    windows count them; without the window of the far-future event (the watermark never
    passes its end, so it is never emitted)."""
    rows = DeltaTable(source, storage_options=store.storage_options).to_pyarrow_table()
    counts: collections.Counter[tuple[int, str]] = collections.Counter()
    for row in rows.to_pylist():
        seconds = int(row["event_time"].timestamp())
        counts[(seconds - seconds % WINDOW_SECONDS, row["key"])] += 1
    latest = max(start for start, _ in counts)
    return {w: n for w, n in counts.items() if w[0] + WINDOW_SECONDS < latest}


def windows_differ(
    store: _object_store.ObjectStore, sink: str, expected: dict[tuple[int, str], int]
) -> str | None:
    """None when the sink holds each expected window exactly once with its count (and no
    other); else what differs."""
    try:
        table = DeltaTable(sink, storage_options=store.storage_options).to_pyarrow_table()
    except TableNotFoundError:
        return "no sink table yet"
    got = [(int(r["window_start"].timestamp()), r["key"], r["count"]) for r in table.to_pylist()]
    twice = [w for w, n in collections.Counter((s, k) for s, k, _ in got).items() if n > 1]
    counts = {(s, k): n for s, k, n in got}
    wrong = {
        w: (counts.get(w), expected.get(w))
        for w in {*counts, *expected}
        if counts.get(w) != expected.get(w)
    }
    if twice or wrong:
        return f"windows twice {twice[:5]}; (got, expected) {sorted(wrong.items())[:8]}"
    return None


def checkpoint_keys(store: _object_store.ObjectStore, key: str) -> list[str]:
    selector = pafs.FileSelector(key, recursive=True)
    infos = _object_store.store_fs(store).get_file_info(selector)
    return sorted(i.path.removeprefix(key + "/") for i in infos if i.type == pafs.FileType.File)


def sink_batch_ids(store: _object_store.ObjectStore, sink_key: str) -> tuple[set[str], list[int]]:
    """The sink's app ids and the batch ids of its commits, in version order."""
    fs = _object_store.store_fs(store)
    app_ids: set[str] = set()
    batch_ids: list[int] = []
    for key in [k for k in checkpoint_keys(store, sink_key) if k.startswith("_delta_log/")]:
        if not key.endswith(".json"):
            continue
        with fs.open_input_stream(f"{sink_key}/{key}") as stream:
            actions = [json.loads(line) for line in stream.read().decode().splitlines() if line]
        for txn in (a["txn"] for a in actions if "txn" in a):
            app_ids.add(txn["appId"])
            batch_ids.append(txn["version"])
    return app_ids, batch_ids


def batch_ids_said(lines: list[str]) -> list[int]:
    return [int(line.split()[2]) for line in lines if line.startswith("PROGRESS")]


@pytest.mark.timeout(1200)
def test_rocksdb_state_on_s3a_survives_a_killed_worker_and_driver(
    standalone_cluster, object_store, tmp_path
):
    import pyspark

    if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (4, 1):
        pytest.skip("checkpoints on S3A need Spark 4.1+ (Hadoop 3.4.2's conditional create)")
    s3a = _s3a.s3a_conf_or_skip(object_store)
    seed = chaos_seed()
    rng, context = random.Random(seed), f"seed {seed}"
    began = time.monotonic()

    def phase(name: str) -> None:
        print(f"state on S3A: {name} at {time.monotonic() - began:.0f}s", flush=True)

    source, sink, checkpoint = (object_store.uri(n) for n in ("source", "windows", "ck"))
    s3a_of = {u: "s3a://" + u.removeprefix("s3://") for u in (source, sink, checkpoint)}
    write_deltalake(
        source, window_batch(0, WINDOW_ROWS), storage_options=object_store.storage_options
    )
    conf = _s3a.with_s3a(cluster_conf(standalone_cluster, object_store.env), s3a)
    env = driver_environment(conf, object_store.env)
    args = ["windows", s3a_of[source], s3a_of[sink], s3a_of[checkpoint]]
    log = tmp_path / "child.log"

    def start() -> Child:
        return Child(args, log, env=env)

    said: list[list[int]] = []  # batch ids each driver printed

    upstream = WindowUpstream(source, object_store.storage_options)
    try:
        said.append(kill_a_worker_then_the_driver(standalone_cluster, upstream, rng, phase, start))
        phase("driver killed mid-stream")
        child = start()
        try:
            child.wait_for("STARTED", START_TIMEOUT)
            child.run_for(rng.uniform(0.0, 20.0))
        finally:
            child.kill()
            said.append(batch_ids_said(child.drain()))
        phase("driver killed during its start")
        # 3. A last driver runs until the sink is exact: the upstream stops, one event far
        #    in the future moves the watermark past every window, which a batch then emits.
        far = (upstream.steps + 1) * WINDOW_ROWS
        write_deltalake(
            source, window_batch(far, 1, FAR_FUTURE), mode="append",
            storage_options=object_store.storage_options,
        )  # fmt: skip
        expected = expected_windows(object_store, source)
        child = start()
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while windows_differ(object_store, sink, expected):  # checked after each batch
                child.wait_for("PROGRESS", deadline - time.monotonic())
        finally:
            child.kill()
            said.append(batch_ids_said(child.drain()))
    finally:
        if upstream.ident is not None:
            upstream.stop()
    phase(f"exact; {upstream.steps} upstream commits, batch ids said {said}")

    assert windows_differ(object_store, sink, expected) is None, context
    assert len(expected) > 10 * WINDOW_KEYS, expected  # windows of many batches
    # Batch ids continue across restarts (a replayed batch keeps its id, none restarts at 0).
    runs = [ids for ids in said if ids]
    for before, after in itertools.pairwise(runs):
        assert after[0] >= before[-1], f"{context}: batch ids {said}"
    # Each batch committed to the sink once, by the one query.
    sink_key = sink.removeprefix("s3://")
    app_ids, batch_ids = sink_batch_ids(object_store, sink_key)
    assert len(app_ids) == 1 and batch_ids == sorted(set(batch_ids)), (context, batch_ids)
    # The state lives on the store: RocksDB changelogs/snapshots of both partitions; and no
    # temporary object was left in the checkpoint by the killed writers.
    keys = checkpoint_keys(object_store, checkpoint.removeprefix("s3://"))
    for partition in ("0", "1"):
        state = [k for k in keys if k.startswith(f"state/0/{partition}/")]
        assert any(k.endswith((".changelog", ".zip")) for k in state), (partition, keys[:40])
    temps = [k for k in keys if k.rsplit("/", 1)[-1].startswith(".") or k.endswith(".tmp")]
    assert not temps, temps


def kill_a_worker_then_the_driver(
    cluster: StandaloneCluster,
    upstream: WindowUpstream,
    rng: random.Random,
    phase: Callable[[str], None],
    start: Callable[[], Child],
) -> list[int]:
    """The first driver: one worker's process group (worker, its executor and Python
    workers) SIGKILLed while the query runs, the query going on with the other executor
    (the killed one's state partition reloaded from S3A), the worker started again and
    given an executor; then the driver SIGKILLed a little after a batch. Returns the batch
    ids the driver printed; the worker is running again whatever happened."""
    child = start()
    victim = cluster.workers[rng.randrange(len(cluster.workers))]
    try:
        child.wait_for("PROGRESS", START_TIMEOUT)
        upstream.start()  # from here on batches have rows (a commit a second)
        line = wait_for_rows(child, START_TIMEOUT)
        child.run_for(rng.uniform(0.0, 2.0))
        victim.kill()
        killed_at = int(line.split()[2])
        phase(f"a worker killed after batch {killed_at}")
        while int(wait_for_rows(child, START_TIMEOUT).split()[2]) <= killed_at + 1:
            pass
        phase("batches with rows ran on the other executor")
        victim.restart()
        cluster.wait_all_alive()
        # The running application gets an executor on the restarted worker again.
        wait_until(
            lambda: cores_in_use(cluster) == 2, START_TIMEOUT, "an executor on the restarted worker"
        )
        phase("restarted worker in use")
        wait_for_rows(child, START_TIMEOUT)
        child.run_for(rng.uniform(0.0, 3.0))
    finally:
        child.kill()
        # No more commits: the next drivers start on a small backlog (their start-up,
        # not the data, is what the rest of the test spends).
        if upstream.ident is not None:
            upstream.stop()
        if victim.proc.poll() is not None:  # the test failed before the restart
            victim.restart()
            cluster.wait_all_alive()
    return batch_ids_said(child.drain())


def wait_for_rows(child: Child, timeout: float) -> str:
    """The next ``PROGRESS`` line of a batch that read rows."""
    deadline = time.monotonic() + timeout
    while True:
        line = child.wait_for("PROGRESS", deadline - time.monotonic())
        if int(line.split()[3]) > 0:
            return line


def cores_in_use(cluster: StandaloneCluster) -> int:
    workers = cluster.state().get("workers", [])
    assert isinstance(workers, list)
    return sum(int(w.get("coresused", 0)) for w in workers if w.get("state") == "ALIVE")
