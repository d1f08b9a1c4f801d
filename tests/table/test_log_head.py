"""The real-time sink's log head (issue 28, rtm-next2 §3.2): after one seed load, the
commit path (``sink.commitRolls``, the brain entry the JVM endpoint calls) and every
partition's ``Start`` (``sink.transactions``) neither list ``_delta_log`` nor load or
refresh a delta-rs table, while another writer appends, OPTIMIZEs and changes the
metadata; the head's app transactions equal a fresh load's after every commit.

No Spark session: rolls are staged as the connector's writers stage them (the helpers of
``tests/spark/test_realtime_roll_contiguity.py``). The instrument (monkeypatched
``DeltaTable`` loads and refreshes, ``os.listdir`` / ``os.scandir`` of ``_delta_log`` and
the log writer's ``_list_names``) records and refuses calls made on the committing
thread; background upkeep and compaction threads load their own tables, off the commit
path, and are not counted.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field

from deltaflow.spark.bridge import _ops, _realtime
from deltaflow.table import _auto_compact, _log_commit, _log_head, _log_upkeep, _uri
from deltaflow.table._snapshot import load_snapshot
from deltaflow.table.errors import ConcurrentWriteError
from tests.spark.test_realtime_roll_contiguity import APP, at, commit, ids

OWNER = APP  # the endpoint's key ``<app>/rtm``, as the JVM names it
P0, P1 = f"{APP}/rtm-p0", f"{APP}/rtm-p1"


class Instrument:
    """Refuses (and records) log listings and delta-rs loads on the thread that commits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.thread = threading.get_ident()
        self.armed = False  # refuse (else only count loads)
        self.paused = False  # the test's own reads, the other writer's commits
        self.calls: list[str] = []
        self.loads = 0  # DeltaTable() by the code under test on this thread, armed or not
        real_init = DeltaTable.__init__

        def init(table: DeltaTable, *args: Any, **kwargs: Any) -> None:
            if threading.get_ident() == self.thread and not self.paused:
                self.loads += 1
            self._check("DeltaTable()")
            real_init(table, *args, **kwargs)

        monkeypatch.setattr(DeltaTable, "__init__", init)
        for name in ("update_incremental", "load_as_version", "update"):
            monkeypatch.setattr(DeltaTable, name, self._refusing(getattr(DeltaTable, name), name))
        for name in ("listdir", "scandir"):
            monkeypatch.setattr(os, name, self._refusing_log(getattr(os, name), f"os.{name}"))
        monkeypatch.setattr(
            _log_commit, "_list_names", self._refusing(_log_commit._list_names, "_list_names")
        )

    def _check(self, what: str) -> None:
        if self.armed and not self.paused and threading.get_ident() == self.thread:
            self.calls.append(what)
            raise AssertionError(f"{what} on the real-time commit path")

    def _refusing(self, real: Callable[..., Any], what: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._check(what)
            return real(*args, **kwargs)

        return call

    def _refusing_log(self, real: Callable[..., Any], what: str) -> Callable[..., Any]:
        def call(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if "_delta_log" in str(path):
                self._check(what)
            return real(path, *args, **kwargs)

        return call

    @contextmanager
    def off(self) -> Iterator[None]:
        """The test's own reads and the other writer's commits."""
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused


@pytest.fixture
def table(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([], pa.int32())}))
    # In the brain, checkpoints run on a background worker (off the commit path).
    _log_upkeep.run_in_background(True)
    try:
        yield path
    finally:
        assert _log_upkeep.flush(60)
        _log_upkeep.run_in_background(False)
        assert _auto_compact.wait_for_background(60)
        _realtime._HEADS.forget(_uri.normalize_uri(path))


def roll(path: str, start: int, end: int) -> dict[str, Any]:
    return commit(path, OWNER, start, end)


def start(path: str, *apps: str) -> dict[str, int | None]:
    """A partition's ``Start``: ``sink.transactions`` as the endpoint asks it."""
    versions = _realtime.transactions({"path": path, "appIds": list(apps)})["versions"]
    return dict(versions)


def head_of(path: str) -> _log_head.LogHead:
    head = _realtime._HEADS.get(_uri.normalize_uri(path), f"{OWNER}/rtm")
    assert head is not None
    return head


def other_append(path: str, first: int) -> None:
    rows = pa.table({"id": pa.array([first], pa.int32())})
    write_deltalake(path, rows, mode="append", schema_mode="merge")


class PlanCount:
    """How many times the sink plans a write (a spy: the real planning runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = _ops.plan_write

        def plan_write(*args: Any, **kwargs: Any) -> dict[str, Any]:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(_ops, "plan_write", plan_write)


def test_commits_go_on_without_listing_or_loading_the_log(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    instrument = Instrument(monkeypatch)
    plans = PlanCount(monkeypatch)
    # The epoch starts: its writer factory asks for the interval; partition 0's Start seeds.
    _realtime.transactions({"path": table, "appIds": []})
    assert start(table, P0) == {P0: None}
    assert instrument.loads == 1
    instrument.armed = True

    theirs: list[int] = []
    schema_before = None
    for n in range(200):
        assert start(table, P0) == {P0: at(n * 10) if n else None}
        with instrument.off():
            if n % 25 == 7:  # another writer appends (delta-rs WRITE): absorbed by name
                other_append(table, 100_000 + n)
                theirs.append(100_000 + n)
            if n == 120:  # and compacts (dataChange=false removes and adds)
                # Once the stream's own background compaction is idle: two delta-rs
                # compactions at once would both commit (docs/architecture.md, "Why
                # leases"), and this one takes no lease.
                assert _auto_compact.wait_for_background(60)
                DeltaTable(table).optimize.compact()
            if n == 160:  # and adds a column: the next plan sees it, made once more
                schema_before = head_of(table).snapshot().schema
                DeltaTable(table).alter.add_columns([Field("note", "string", True)])
        answer = roll(table, n * 10, n * 10 + 10)
        assert answer["skipped"] is False
        with instrument.off():
            fresh = DeltaTable(table)
            head = head_of(table)
            assert head.txn(P0) == fresh.transaction_version(P0) == at(n * 10 + 10)
            assert head.txn(P1) == fresh.transaction_version(P1) is None
            assert head.version <= fresh.version()  # background compaction may follow
    assert instrument.calls == []
    assert instrument.loads == 1
    assert plans.count == 2  # the first commit's plan, then after the new column only
    with instrument.off():
        head = head_of(table)
        fresh_snapshot = load_snapshot(_uri.normalize_uri(table), version=head.version)
        assert head.snapshot() == fresh_snapshot
        assert head.snapshot().schema != schema_before
        assert sorted(ids(table)) == sorted([*range(2000), *theirs])


def test_a_metadata_change_racing_a_commit_fails_it_and_the_head_stays_exact(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ALTER that lands between the plan and the put fails the commit
    (``MetadataChanged``, as on main: delta-spark's rule for a concurrent metadata
    change); the head moved over it, and the replayed roll commits with no load."""
    instrument = Instrument(monkeypatch)
    start(table, P0, P1)
    roll(table, 0, 10)
    instrument.armed = True
    real_put = _log_commit.put_version
    raced: list[int] = []

    def put_after_an_alter(log_dir: str, version: int, payload: bytes) -> bool:
        if not raced:
            with instrument.off():
                DeltaTable(table).alter.add_columns([Field("note", "string", True)])
            raced.append(version)
        return real_put(log_dir, version, payload)

    monkeypatch.setattr(_log_commit, "put_version", put_after_an_alter)
    files = {p.name for p in Path(table).glob("*.parquet")}
    with pytest.raises(ConcurrentWriteError) as failed:
        roll(table, 10, 20)
    assert failed.value.kind == "MetadataChanged"
    assert {p.name for p in Path(table).glob("*.parquet")} == files  # its file deleted
    with instrument.off():
        head = head_of(table)
        assert head.version == DeltaTable(table).version() == raced[0]
        assert head.snapshot() == load_snapshot(_uri.normalize_uri(table))
        assert head.txn(P0) == at(10)
    assert start(table, P0, P1) == {P0: at(10), P1: None}
    assert roll(table, 10, 20)["skipped"] is False  # the replay
    assert instrument.calls == []
    with instrument.off():
        assert DeltaTable(table).transaction_version(P0) == at(20)
        assert sorted(ids(table)) == list(range(20))


def test_a_second_endpoint_commit_is_absorbed_by_name(table: str) -> None:
    """Two owners (an old run's endpoint and a new one) keep two heads; each learns the
    other's commit from the put it loses, and the contiguity check refuses the overlap."""
    roll(table, 0, 100)
    commit(table, "old", 100, 150)  # the old run's head seeds at the log's end, commits
    with pytest.raises(ConcurrentWriteError) as refused:
        roll(table, 100, 140)  # caught up by name: the log holds 150, not 100
    assert refused.value.kind == "ConcurrentTransaction"
    assert head_of(table).txn(P0) == at(150)
    assert roll(table, 150, 200)["skipped"] is False
    assert DeltaTable(table).transaction_version(P0) == at(200)


def test_a_head_far_behind_is_seeded_again(table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    instrument = Instrument(monkeypatch)
    roll(table, 0, 10)
    loads = instrument.loads
    monkeypatch.setattr(_log_head, "MAX_CATCH_UP", 3)
    with instrument.off():
        for n in range(2):
            other_append(table, 1000 + n)
    assert roll(table, 10, 20)["skipped"] is False  # 2 behind: read by name
    assert instrument.loads == loads
    with instrument.off():
        for n in range(5):
            other_append(table, 2000 + n)
    loads = instrument.loads
    assert roll(table, 20, 30)["skipped"] is False  # 5 behind: one full load instead
    assert instrument.loads == loads + 1
    with instrument.off():
        assert head_of(table).txn(P0) == DeltaTable(table).transaction_version(P0) == at(30)


def test_an_idle_head_whose_successors_were_cleaned_up_is_seeded_again(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Log cleanup removed the commits after the head (a checkpoint covers them): the
    head must not write its next version again; it sees the checkpoint and re-seeds."""
    roll(table, 0, 10)
    head = head_of(table)
    for n in range(3):
        other_append(table, 1000 + n)
    latest = DeltaTable(table)
    latest.create_checkpoint()
    log_dir = Path(table) / "_delta_log"
    for version in range(head.version + 1, latest.version() + 1):
        (log_dir / f"{version:020d}.json").unlink()
    monkeypatch.setattr(_log_head, "IDLE_CHECK_SECONDS", 0.0)
    assert roll(table, 10, 20)["version"] == latest.version() + 1
    assert head_of(table) is not head
    assert DeltaTable(table).transaction_version(P0) == at(20)


def test_a_log_replaced_under_the_head_is_never_written_past(table: str) -> None:
    """The table was dropped and made again at its path (a new, shorter log): the head
    sees its commit file is another and re-seeds; the rolls then do not continue the new
    log's app transactions (it has none), so the commit is refused and the new log keeps
    contiguous versions."""
    for n in range(4):
        roll(table, 10 * n, 10 * n + 10)
    old = head_of(table)
    assert old.version >= 4
    shutil.rmtree(Path(table, "_delta_log"))
    write_deltalake(table, pa.table({"id": pa.array([1000], pa.int32())}), mode="overwrite")
    other_append(table, 1001)
    with pytest.raises(ConcurrentWriteError, match="do not continue its app transactions"):
        roll(table, 40, 50)
    assert head_of(table) is not old
    assert head_of(table).version == 1
    names = sorted(p.name for p in Path(table, "_delta_log").glob("*.json"))
    assert names == [f"{v:020d}.json" for v in range(2)], names
