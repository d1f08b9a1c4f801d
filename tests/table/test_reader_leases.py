"""Reader leases and the versions VACUUM keeps for them, on real delta-rs tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.table import _reader_leases, _vacuum_guard
from deltaflow.table._reader_leases import LEASE_DIR, LeaseHolder
from tests._waiting import wait_until


def _lease_files(path: str) -> list[str]:
    folder = os.path.join(path, LEASE_DIR)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _append(path: str, value: int) -> None:
    write_deltalake(path, pa.table({"id": pa.array([value], pa.int64())}), mode="append")


def test_holder_writes_on_first_need_and_on_going_down_but_not_on_going_up(tmp_path):
    path = str(tmp_path / "t")
    holder = LeaseHolder(path, timeout=3600.0, reader="test reader")
    holder.need(5)
    (lease,) = _reader_leases.read_leases(path)
    assert (lease.lease_id, lease.version) == (holder.lease_id, 5)
    assert "test reader" in lease.reader and lease.is_live(3600.0)

    holder.need(9)  # moving forward: the recorded 5 still errs low, nothing is written
    assert _reader_leases.read_leases(path)[0].version == 5
    holder.need(3)  # going back (a replayed batch): written at once
    assert _reader_leases.read_leases(path)[0].version == 3

    holder.release()
    assert _lease_files(path) == []
    holder.need(1)  # a released holder never writes again
    assert _lease_files(path) == []


def test_heartbeat_raises_the_version_once_due(tmp_path):
    path = str(tmp_path / "t")
    holder = LeaseHolder(path, timeout=0.4, reader="r")  # refreshes every 0.1 s
    holder.need(2)
    holder.need(7)
    # The process's heartbeat thread (or the next call) writes the current version.
    wait_until(
        lambda: _reader_leases.read_leases(path)[0].version == 7, 10, "the heartbeat's version"
    )
    first = _reader_leases.read_leases(path)[0].heartbeat_ms
    wait_until(
        lambda: _reader_leases.read_leases(path)[0].heartbeat_ms != first,
        10,
        "a later heartbeat",
    )
    holder.release()
    assert _lease_files(path) == []


def test_live_and_expired_and_unreadable_leases(tmp_path):
    path = str(tmp_path / "t")
    now_ms = int(time.time() * 1000)
    _reader_leases._put(path, "fresh", json.dumps({"version": 1, "heartbeat": now_ms}).encode())
    stale = {"version": 0, "heartbeat": now_ms - 7_200_000, "reader": "killed stream"}
    _reader_leases._put(path, "stale", json.dumps(stale).encode())
    _reader_leases._put(path, "torn", b'{"version": 1, "heart')
    live, expired = _reader_leases.live_leases(path, 3600.0)
    assert [lease.lease_id for lease in live] == ["fresh"]
    assert [lease.lease_id for lease in expired] == ["stale"]


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (None, 3600.0),
        ("interval 30 minutes", 1800.0),
        ("2 hours", 7200.0),
        ("interval 1 day", 86400.0),
        ("10 seconds", 10.0),
        ("soon", 3600.0),
    ],
)
def test_timeout_property(raw, seconds):
    configuration = {} if raw is None else {"deltaflow.vacuum.readerLeaseTimeout": raw}
    assert _reader_leases.timeout_seconds(configuration) == seconds


def test_guard_keeps_the_lease_version_and_each_version_before_a_remove(tmp_path):
    path = str(tmp_path / "t")
    for i in range(3):
        _append(path, i)  # versions 0..2
    DeltaTable(path).optimize.compact()  # 3: removes
    _append(path, 3)  # 4
    DeltaTable(path).delete("id = 3")  # 5: removes
    _append(path, 4)  # 6
    latest = DeltaTable(path).version()
    assert latest == 6

    assert _vacuum_guard.guard(path, latest, {}).keep_versions == ()  # no leases
    holder = LeaseHolder(path, timeout=3600.0, reader="r")
    holder.need(1)
    guard = _vacuum_guard.guard(path, latest, {})
    assert guard.keep_versions == (1, 2, 4)
    assert guard.oldest is not None and guard.oldest.lease_id == holder.lease_id
    holder.need(0)
    assert _vacuum_guard.guard(path, latest, {}).keep_versions == (0, 2, 4)
    # A short table timeout makes the same lease expired: nothing is kept for it.
    short = {"deltaflow.vacuum.readerLeaseTimeout": "interval 1 millisecond"}
    wait_until(
        lambda: bool(_vacuum_guard.guard(path, latest, short).expired), 5.0, "the lease to lapse"
    )
    guard = _vacuum_guard.guard(path, latest, short)
    assert (guard.keep_versions, len(guard.expired)) == ((), 1)
    holder.release()


def test_a_lease_of_an_ended_process_on_this_machine_is_not_live(tmp_path):
    path = str(tmp_path / "t")
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **_OUT)
    host, boot, namespace, _ = _reader_leases._this_process().split("|")
    now_ms = int(time.time() * 1000)
    for name, pid in (("ended", int(child.stdout)), ("running", os.getpid())):
        process = "|".join([host, boot, namespace, str(pid)])
        payload = {"version": 0, "heartbeat": now_ms, "process": process}
        _reader_leases._put(path, name, json.dumps(payload).encode())
    elsewhere = {"version": 0, "heartbeat": now_ms, "process": f"other-host|{boot}|x|1"}
    _reader_leases._put(path, "elsewhere", json.dumps(elsewhere).encode())
    live, expired = _reader_leases.live_leases(path, 3600.0)
    assert sorted(lease.lease_id for lease in live) == ["elsewhere", "running"]
    assert [lease.lease_id for lease in expired] == ["ended"]


_OUT = {"capture_output": True, "text": True, "check": True}
