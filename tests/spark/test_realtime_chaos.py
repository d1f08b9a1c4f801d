"""Crash safety of the real-time mode Delta sink: the driver killed with SIGKILL at random
moments mid-epoch (its JVM and the brain with it), restarted from the checkpoint; at the
end the table holds each row exactly once. The job is tests/spark/_realtime_chaos_job.py;
the kills follow test_chaos.py (its ``Child``, a seeded RNG: DELTAFLOW_CHAOS_SEED replays).
The source is Spark's real-time memory source, or a Delta table's change data feed that
the test inserts into, updates and deletes from while the stream runs and while it is down.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.spark._compat import PYSPARK_MINOR
from tests._waiting import wait_while_running
from tests.spark.test_cdf_read import CDF, people
from tests.spark.test_chaos import START_TIMEOUT, Child, chaos_seed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

JOB = str(Path(__file__).parent / "_realtime_chaos_job.py")
ROWS = 3000
KILLS = 2
CDF_KILLS = 1  # each run starts a JVM and a session: CI's budget for this variant is ~90 s
DEDUP_KILLS = 1  # the same budget
CHANGE = ("id", "p", "v", "_change_type", "_commit_version")


def test_sigkill_of_the_driver_mid_epoch_keeps_each_row_once(tmp_path) -> None:
    rng = random.Random(chaos_seed())
    location, checkpoint = str(tmp_path / "table"), str(tmp_path / "ck")
    args = [location, checkpoint, str(ROWS)]
    kill_mid_epoch(args, tmp_path, rng)
    finish_and_check_ids(args, tmp_path, location, list(range(ROWS)))


def kill_mid_epoch(args: list[str], tmp_path: Path, rng: random.Random) -> None:
    """``KILLS`` runs of the job, each killed at a random moment after rows landed."""
    for kill in range(KILLS):
        child = Child(args, tmp_path / f"run{kill}.log", job=JOB)
        try:
            wait_until_rows_landed(child)
            child.run_for(rng.uniform(0.0, 1.5))
        finally:
            child.kill()


def wait_until_rows_landed(child: Child) -> None:
    """Until the child reports rows of its epoch in the table (a kill then lands mid-epoch,
    after commits the restart must recognise)."""
    while int(child.wait_for("ROWS", START_TIMEOUT).split()[1]) == 0:
        pass


def finish_and_check_ids(args: list[str], tmp_path: Path, location: str, expected: list[int]):
    """A last run until every row has landed; then each id is in the table once."""
    final = Child(args, tmp_path / "final.log", job=JOB)
    try:
        final.wait_for("DONE", START_TIMEOUT + 120)
    finally:
        final.kill()
    ids = DeltaTable(location).to_pyarrow_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)), f"duplicates: {len(ids) - len(set(ids))}"
    assert sorted(ids) == expected


class Upstream:
    """Changes to the change-feed source, one commit each: appends, updates and deletes in
    turn (delta-rs writes ``_change_data`` files for the updates and deletes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.next_id = 20
        write_deltalake(path, people(list(range(self.next_id))), configuration=CDF)
        self.steps = 0

    def step(self) -> None:
        table, k = DeltaTable(self.path), self.steps
        if k % 3 == 0:
            ids = list(range(self.next_id, self.next_id + 5))
            self.next_id += 5
            write_deltalake(table, people(ids), mode="append")
        elif k % 3 == 1:
            table.update(predicate=f"id % 7 = {k % 7}", updates={"v": f"v + {k * 1000}"})
        else:
            table.delete(f"id = {k}")
        self.steps += 1

    def feed(self) -> list[tuple[Any, ...]]:
        """Every change of every version, read by delta-rs (the reference)."""
        changes = pa.table(DeltaTable(self.path).load_cdf(starting_version=0).read_all())
        return sorted(zip(*(changes.column(n).to_pylist() for n in CHANGE), strict=True))


def landed(location: str) -> list[tuple[Any, ...]]:
    try:
        table = DeltaTable(location).to_pyarrow_table()
    except Exception:  # no first commit yet
        return []
    return sorted(zip(*(table.column(n).to_pylist() for n in CHANGE), strict=True))


def test_sigkill_of_the_driver_mid_change_feed_keeps_each_change_once(tmp_path) -> None:
    rng, started = random.Random(chaos_seed()), time.monotonic()
    source, location = str(tmp_path / "source"), str(tmp_path / "table")
    upstream = Upstream(source)
    args = [location, str(tmp_path / "ck"), str(10**9), source]  # runs until killed
    for kill in range(CDF_KILLS):
        child = Child(args, tmp_path / f"run{kill}.log", job=JOB)
        try:
            child.wait_for("ROWS", START_TIMEOUT)  # the query runs
            for _ in range(rng.randint(4, 8)):  # changes while the stream runs
                upstream.step()
            child.run_for(rng.uniform(0.0, 1.0))
        finally:
            child.kill()
        upstream.step()  # and while it is down
    final = Child(args, tmp_path / "final.log", job=JOB)
    try:
        final.wait_for("ROWS", START_TIMEOUT)
        upstream.step()
        upstream.step()
        expected = upstream.feed()
        wait_while_running(
            lambda: len(landed(location)) >= len(expected),
            final.proc,
            120,
            f"{len(expected)} changes in the sink",
            final.stderr_tail,
        )
    finally:
        final.kill()
    kinds = {row[3] for row in expected}
    assert kinds == {"insert", "update_preimage", "update_postimage", "delete"}
    assert landed(location) == expected  # each change once: none lost, none twice
    print(f"{len(expected)} changes, {upstream.steps} commits, {time.monotonic() - started:.0f} s")


@pytest.mark.skipif(
    PYSPARK_MINOR < (4, 3), reason="dropDuplicates in real-time mode is Spark >= 4.3"
)
def test_sigkill_of_the_driver_mid_dedup_keeps_each_id_once(tmp_path) -> None:
    """``dropDuplicates`` in real time: its state store and the sink's commits are
    rolled back together to the epoch's start; the replay must neither write an id twice
    nor drop one the killed run's state had seen (an id sent again while the driver is
    down is a duplicate too)."""
    rng = random.Random(chaos_seed())
    source, location = str(tmp_path / "source"), str(tmp_path / "table")
    sent: list[int] = []

    def send(ids: list[int]) -> None:
        frame = pa.table({"id": pa.array(ids, pa.int32()), "n": pa.array(ids, pa.int32())})
        write_deltalake(source, frame, mode="append")
        sent.extend(ids)

    def some_new_and_some_again(width: int = 10) -> list[int]:
        fresh = list(range(max(sent, default=-1) + 1, max(sent, default=-1) + 1 + width))
        again = rng.sample(sorted(set(sent)), min(len(set(sent)), width // 2))
        return fresh + again + fresh[:2]  # duplicates inside one commit too

    send(some_new_and_some_again())
    distinct = 10**9  # runs until killed
    args = [location, str(tmp_path / "ck"), str(distinct), source, "dedup"]
    for kill in range(DEDUP_KILLS):
        child = Child(args, tmp_path / f"run{kill}.log", job=JOB)
        try:
            wait_until_rows_landed(child)
            for _ in range(rng.randint(4, 8)):  # commits while the stream runs
                send(some_new_and_some_again())
                child.run_for(rng.uniform(0.0, 0.3))
        finally:
            child.kill()
        send(some_new_and_some_again())  # and while it is down
    expected = sorted(set(sent))
    final_args = [location, str(tmp_path / "ck"), str(len(expected)), source, "dedup"]
    finish_and_check_ids(final_args, tmp_path, location, expected)


def test_sigkill_of_the_driver_mid_row_log_chain_keeps_each_row_once(tmp_path) -> None:
    """Two real-time queries with row logs (docs/notes/rowlog.md): ids into table A, and A
    (read through its row log) into table B, the driver killed mid-epoch. At the end both
    tables hold each id once, and B's row log, read from its start position by position,
    holds exactly B's rows."""
    from deltaflow.table import _rowlog

    rng = random.Random(chaos_seed())
    location, down = str(tmp_path / "a"), str(tmp_path / "b")
    args = [location, str(tmp_path / "ck"), str(ROWS), down, "rowlog"]
    kill_mid_epoch(args, tmp_path, rng)
    finish_and_check_ids(args, tmp_path, down, list(range(ROWS)))
    upstream = DeltaTable(location).to_pyarrow_table().column("id").to_pylist()
    assert sorted(upstream) == list(range(ROWS))
    logged: list[int] = []
    for partition in sorted(Path(down, _rowlog.DIRECTORY).glob("*/p*")):
        tail = _rowlog.PartitionTail(str(partition), _rowlog.Position(0, 0))
        logged += [i for batch in tail.poll() for i in batch.column("id").to_pylist()]
    assert sorted(logged) == list(range(ROWS))


def test_a_first_epoch_lost_with_its_driver_restarts_at_the_same_snapshot(tmp_path) -> None:
    """Spark records a real-time epoch's offsets only at its end. A driver killed in the
    first epoch of a query over a Delta table (no ``startingVersion``) starts that epoch
    again from the initial offset: it must resolve to the snapshot the killed run read,
    not the table's latest, which Z-ordering has since rewritten in another row order (the
    sink would drop the wrong rows as already committed, and write others twice)."""
    source, location = str(tmp_path / "source"), str(tmp_path / "table")
    for start in range(1950, -1, -50):  # the snapshot: 40 files, highest ids first
        ids = pa.array(range(start, start + 50), pa.int32())
        write_deltalake(source, pa.table({"id": ids}), mode="append")
    args = [location, str(tmp_path / "ck"), "10000000", source, "copy"]
    child = Child(args, tmp_path / "run0.log", job=JOB)
    try:
        wait_until_rows_landed(child)  # some of the snapshot committed; killed at once
    finally:
        child.kill()
    assert not list((tmp_path / "ck" / "commits").iterdir())  # killed in the first epoch
    DeltaTable(source).optimize.z_order(["id"])  # one file, lowest ids first
    more = pa.table({"id": pa.array(range(2000, 2050), pa.int32())})
    write_deltalake(source, more, mode="append")
    final_args = [location, str(tmp_path / "ck"), "2050", source, "copy"]
    finish_and_check_ids(final_args, tmp_path, location, list(range(2050)))
