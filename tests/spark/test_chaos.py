"""Crash safety: streaming jobs and appenders killed with SIGKILL at random moments.

The killed jobs run in child processes (tests/spark/_chaos_stream_job.py), each with its
own Spark driver. SIGKILL goes to the child's whole process group: the Python driver, its
JVM and the JVM's Python workers die at once, as in a machine crash. The random moments
come from a seeded RNG: set DELTAFLOW_CHAOS_SEED to replay a failing run (the seed is
printed and appears in every assertion message).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests._waiting import wait_while_running
from tests.spark._chaos_stream_job import KEYS

HERE = Path(__file__).parent
JOB = str(HERE / "_chaos_stream_job.py")

STREAM_KILLS = 4  # half at a batch's progress, half at start-up; ~40 s each on CI (6 until
# CI neared its 90 minutes; each run kills at other random moments)
ROWS_PER_COMMIT = 200
UPSTREAM_INTERVAL = 1.0  # seconds between upstream commits
UPSTREAM_MAX_COMMITS = 400  # bounds the source even if the kills are slow
APPEND_KILLS = 3
APPEND_ROWS = 2000
START_TIMEOUT = 180  # JVM start-up plus a first batch, on a busy 2-core machine


def chaos_seed() -> int:
    seed = int(os.environ.get("DELTAFLOW_CHAOS_SEED", random.randrange(2**32)))
    print(f"chaos seed: {seed} (replay with DELTAFLOW_CHAOS_SEED={seed})")
    return seed


class Child:
    """A child job in its own process group; its stdout lines are read on a thread."""

    def __init__(
        self, args: list[str], log_path: Path, job: str = JOB, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, job, *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
            cwd=log_path.parent,  # the job's warehouse and catalog (metastore) go here
            env=env or {**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("EOF")

    def wait_for(self, prefix: str, timeout: float) -> str:
        """The next stdout line starting with ``prefix``; fails on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {prefix!r} within {timeout}s\n{self.stderr_tail()}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line
            if line == "EOF" or line.startswith("FAILED"):
                self.proc.wait(10)
                raise AssertionError(
                    f"child ended ({line}, rc={self.proc.returncode}) before {prefix!r}\n"
                    + self.stderr_tail()
                )

    def run_for(self, seconds: float) -> None:
        """Let the child run ``seconds`` (the random moment of a kill), or until it exits."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(seconds)

    def drain(self) -> list[str]:
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return self.seen

    def kill(self) -> None:
        """SIGKILL the child and everything it started (JVM, Python workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def finish(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        finally:
            self.kill()  # nothing left behind, whatever happened
        assert self.proc.returncode == 0, self.stderr_tail()

    def stderr_tail(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()[-6000:]


class Feeder(threading.Thread):
    """Calls ``step(n)`` for n = 0, 1, ... every ``interval`` seconds until stopped or
    ``limit`` steps are done; ``stop()`` re-raises whatever a step raised."""

    def __init__(self, interval: float, limit: int) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.limit = limit
        self.steps = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def step(self, number: int) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self.stopped.is_set() and self.steps < self.limit:
                self.step(self.steps)
                self.steps += 1
                self.stopped.wait(self.interval)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def stop(self) -> None:
        self.stopped.set()
        self.join(60)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


class Upstream(Feeder):
    """Appends ROWS_PER_COMMIT rows with unique event ids per commit until stopped."""

    def __init__(self, path: str) -> None:
        super().__init__(UPSTREAM_INTERVAL, UPSTREAM_MAX_COMMITS)
        self.path = path

    @property
    def commits(self) -> int:
        return self.steps

    def step(self, number: int) -> None:
        write_deltalake(self.path, source_batch(number + 1), mode="append")


def source_batch(commit: int) -> pa.Table:
    first = commit * ROWS_PER_COMMIT
    event_ids = list(range(first, first + ROWS_PER_COMMIT))
    return pa.table(
        {
            "event_id": pa.array(event_ids, pa.int64()),
            "key": pa.array([f"k{(i * 7919) % KEYS}" for i in event_ids], pa.string()),
            "value": pa.array([(i * 31) % 101 for i in event_ids], pa.int64()),
        }
    )


def versions(path: str) -> range:
    return range(DeltaTable(path).version() + 1)


def commit_actions(path: str, version: int) -> list[dict[str, Any]]:
    text = Path(path, "_delta_log", f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_versions_load(path: str, context: str) -> None:
    """Every version loads with deltalake and refers only to files that exist."""
    for version in versions(path):
        table = DeltaTable(path, version=version)
        missing = [f for f in table.file_uris() if not Path(f.removeprefix("file://")).exists()]
        assert not missing, f"{context}: version {version} of {path} lacks {missing}"


def assert_exactly_once_commits(path: str, checkpoint: str, context: str) -> None:
    """Each sink commit carries the query's app transaction, batch ids strictly rising
    (the stream's auto compactions, ``dataChange=false`` rearrangements, are not sink
    commits)."""
    query_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    batch_ids = []
    for version in versions(path):
        actions = commit_actions(path, version)
        if _compaction(actions):
            continue
        txns = [a["txn"] for a in actions if "txn" in a]
        assert [t["appId"] for t in txns] == [query_id], f"{context}: version {version}: {txns}"
        batch_ids.append(txns[0]["version"])
    assert batch_ids == sorted(set(batch_ids)), f"{context}: {path} batch ids {batch_ids}"


def _compaction(actions: list[dict[str, Any]]) -> bool:
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    return info.get("operation") == "OPTIMIZE" and all(f["dataChange"] is False for f in files)


def kill_at_random_moments(
    start: Callable[[], Child],
    kills: int,
    rng: random.Random,
    *,
    after_progress: float,
    after_start: float,
    timeout: float = START_TIMEOUT,
    describe: Callable[[], str] = lambda: "",
) -> None:
    """Start the child ``kills`` times and SIGKILL it each time. Even kills come up to
    ``after_progress`` seconds after the restarted job finished a batch (so the next one is
    under way); odd ones up to ``after_start`` seconds after it started (recovery,
    listing, planning, the first batch, a commit)."""
    for kill in range(kills):
        cycle = time.monotonic()
        child = start()
        try:
            after = child.wait_for("PROGRESS" if kill % 2 == 0 else "STARTED", timeout)
            delay = rng.uniform(0.0, after_progress if kill % 2 == 0 else after_start)
            child.run_for(delay)
        finally:
            child.kill()
        print(
            f"kill {kill} after {time.monotonic() - cycle:.0f}s, {delay:.2f}s after"
            f" {after.split()[0]};{describe()} child said {child.drain()}"
        )


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stream_killed_at_random_moments_loses_and_duplicates_nothing(table_path, tmp_path):
    seed = chaos_seed()
    rng = random.Random(seed)
    context = f"seed {seed}"
    source, silver, gold = table_path("source"), table_path("silver"), table_path("gold")
    ck_silver, ck_gold = table_path("ck_silver"), table_path("ck_gold")
    write_deltalake(source, source_batch(0))
    args = ["stream", source, silver, gold, ck_silver, ck_gold]
    log = tmp_path / "child.log"
    started = time.monotonic()

    upstream = Upstream(source)
    upstream.start()
    try:
        kill_at_random_moments(
            lambda: Child([*args, "loop"], log),
            STREAM_KILLS,
            rng,
            after_progress=2.0,
            after_start=15.0,
        )
    finally:
        upstream.stop()
    print(f"{upstream.commits} upstream commits; {time.monotonic() - started:.0f}s to here")

    final = Child([*args, "once"], log)
    final.wait_for("DONE", START_TIMEOUT)
    final.finish(60)
    print(f"total {time.monotonic() - started:.0f}s")

    source_rows = DeltaTable(source).to_pyarrow_table().to_pylist()
    assert len(source_rows) == (upstream.commits + 1) * ROWS_PER_COMMIT, context
    expected_silver = collections.Counter(
        (r["event_id"], r["key"], r["value"] * 2) for r in source_rows if r["value"] % 3 != 0
    )
    got_silver = collections.Counter(
        (r["event_id"], r["key"], r["doubled"])
        for r in DeltaTable(silver).to_pyarrow_table().to_pylist()
    )
    lost = expected_silver - got_silver
    duplicated = got_silver - expected_silver
    assert not lost and not duplicated, (
        f"{context}: {len(lost)} lost, {len(duplicated)} duplicated or wrong silver rows,"
        f" e.g. {list(lost)[:5]} {list(duplicated)[:5]}"
    )
    expected_gold = collections.Counter(r["key"] for r in source_rows)
    got_gold = {r["key"]: r["count"] for r in DeltaTable(gold).to_pyarrow_table().to_pylist()}
    assert got_gold == dict(expected_gold), context

    for path, checkpoint in ((silver, ck_silver), (gold, ck_gold)):
        assert_exactly_once_commits(path, checkpoint, context)
        assert_versions_load(path, context)
    latest_source = DeltaTable(source)
    assert all(Path(f.removeprefix("file://")).exists() for f in latest_source.file_uris())


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_appender_killed_mid_commit_leaves_only_whole_commits(table_path, tmp_path):
    seed = chaos_seed()
    rng = random.Random(seed)
    context = f"seed {seed}"
    path = table_path("appended")
    write_deltalake(
        path, pa.table({"batch": pa.array([], pa.int32()), "row": pa.array([], pa.int64())})
    )
    log = tmp_path / "child.log"
    acknowledged: set[int] = set()

    for run in range(APPEND_KILLS + 1):
        last = run == APPEND_KILLS
        batches = 2 if last else 100
        child = Child(["append", path, str(run * 1000), str(batches), str(APPEND_ROWS)], log)
        try:
            if last:
                child.wait_for("DONE", START_TIMEOUT)
                child.finish(60)
            else:
                child.wait_for("COMMITTED", START_TIMEOUT)
                child.run_for(rng.uniform(0.0, 2.0))  # the random moment of the kill
        finally:
            child.kill()
        acknowledged |= {int(line.split()[1]) for line in child.drain() if "COMMITTED" in line}
        print(f"run {run}: acknowledged so far {sorted(acknowledged)}")

    assert_versions_load(path, context)
    previous: collections.Counter[int] = collections.Counter()
    for version in versions(path)[1:]:
        counts = collections.Counter(
            DeltaTable(path, version=version).to_pyarrow_table().column("batch").to_pylist()
        )
        added = counts - previous
        # One commit per write, each holding one whole batch.
        assert list(added.values()) == [APPEND_ROWS], f"{context}: version {version}: {added}"
        assert not previous - counts, f"{context}: version {version} lost rows"
        previous = counts
    assert set(previous) >= acknowledged, f"{context}: {acknowledged - set(previous)} lost"


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_vacuum_removes_what_a_killed_write_staged(spark, table_path, tmp_path):
    """A write killed between staging and commit leaves ``_delta_staging/<job>``, which
    delta-rs's VACUUM skips (a ``_`` directory); ours removes it once it is older than the
    retention, and leaves a younger one (a write that may still be running) alone."""
    from deltaflow import DeltaTable as SparkDeltaTable

    path = table_path("killed")
    write_deltalake(path, pa.table({"id": pa.array([-1], pa.int64()), "note": ["seed"]}))
    staging = Path(path) / "_delta_staging"
    child = Child([path], tmp_path / "child.log", job=str(HERE / "_killed_write_job.py"))
    try:
        child.wait_for("READY", START_TIMEOUT)
        # Killed once Spark's committer has set up its task output inside the staging dir.
        wait_while_running(
            lambda: bool(list(staging.glob("*/_temporary/*"))),
            child.proc,
            START_TIMEOUT,
            "the write staging its task output",
            child.stderr_tail,
        )
    finally:
        child.kill()
    assert "DONE" not in child.drain()
    (leftover,) = staging.iterdir()
    assert DeltaTable(path).version() == 0  # nothing committed

    # Eight days old: past the default retention of seven.
    old = time.time() - 8 * 24 * 3600
    for entry in [leftover, *leftover.rglob("*")]:
        os.utime(entry, (old, old))
    # A staging directory as a running write has it: recent files under _temporary.
    fresh = staging / "0badf00d-live"
    (fresh / "_temporary" / "0").mkdir(parents=True)
    (fresh / "_temporary" / "0" / "part-00000.parquet").write_bytes(b"PAR1")

    SparkDeltaTable.forPath(spark, path).vacuum()

    assert not leftover.exists()
    assert fresh.exists()
    assert DeltaTable(path).to_pyarrow_table().column("id").to_pylist() == [-1]
