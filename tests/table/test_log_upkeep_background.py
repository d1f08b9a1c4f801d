"""Log upkeep off the commit path (issue 28, rtm-next §2.1): in a long-lived process (the
brain) a due checkpoint runs on a background worker per process, after the commit
returned; two never overlap; every reader reads the table at every step; what still waits
when the process stops is flushed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.table import _log_upkeep, _uri
from deltaflow.table._snapshot import load_snapshot
from tests.table.test_log_commit_next_version import _append


@pytest.fixture
def background() -> Iterator[None]:
    _log_upkeep.run_in_background(True)
    try:
        yield
    finally:
        assert _log_upkeep.flush(60)
        _log_upkeep.run_in_background(False)


@pytest.fixture
def table(tmp_path) -> str:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    return path


def _checkpoints(path: str) -> list[int]:
    names = os.listdir(os.path.join(path, "_delta_log"))
    return sorted(int(n[:20]) for n in names if n.endswith(".checkpoint.parquet"))


class _Gate:
    """Wraps the real upkeep: records the thread and overlap, and can hold it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold: bool) -> None:
        self.real = _log_upkeep._upkeep
        self.open = threading.Event()
        if not hold:
            self.open.set()
        self.entered = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.threads: set[str] = set()
        self.versions: list[int] = []
        monkeypatch.setattr(_log_upkeep, "_upkeep", self)

    def __call__(self, uri, version, configuration, storage_options) -> bool:  # type: ignore[no-untyped-def]
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.threads.add(threading.current_thread().name)
            self.versions.append(version)
        self.entered.set()
        try:
            assert self.open.wait(30)
            return self.real(uri, version, configuration, storage_options)
        finally:
            with self.lock:
                self.inside -= 1


def test_a_checkpoint_is_written_after_the_commit_returned(table, background, monkeypatch) -> None:
    gate = _Gate(monkeypatch, hold=True)
    for n in range(1, 11):
        assert _append(table, [n], read_version=n - 1, checkpoint_interval=10) == n
    # Version 10 is committed and readable while its checkpoint is still held back.
    assert gate.entered.wait(30)
    assert _checkpoints(table) == []
    assert DeltaTable(table).version() == 10
    assert len(load_snapshot(_uri.normalize_uri(table)).files()) == 11
    gate.open.set()
    assert _log_upkeep.flush(60)
    assert _checkpoints(table) == [10]
    assert gate.threads == {"deltaflow-log-upkeep"}
    with open(os.path.join(table, "_delta_log", "_last_checkpoint")) as f:
        assert '"version":10' in f.read().replace(" ", "")


def test_checkpoints_coalesce_and_never_overlap_while_readers_read(
    tmp_path, background, monkeypatch
) -> None:
    """Commits run on at interval 2; while one checkpoint is held the next due ones queue
    and coalesce to the newest. Readers (delta-rs, deltaflow's snapshot) see every
    version with every row at each step."""
    table = str(tmp_path / "every2")
    config = {"delta.checkpointInterval": "2"}
    write_deltalake(table, pa.table({"id": pa.array([0], pa.int64())}), configuration=config)
    gate = _Gate(monkeypatch, hold=True)
    for n in range(1, 31):
        assert _append(table, [n], read_version=n - 1, checkpoint_interval=2) == n
        if n == 2:
            assert gate.entered.wait(30)  # the checkpoint of 2 is now held
        assert DeltaTable(table).version() == n
        assert len(DeltaTable(table).to_pyarrow_table()) == n + 1
        assert len(load_snapshot(_uri.normalize_uri(table)).files()) == n + 1
    gate.open.set()
    assert _log_upkeep.flush(60)
    assert gate.most_inside == 1
    # 2 ran; 4..30 waited as one (the newest), not fourteen checkpoints.
    assert gate.versions == [2, 30]
    assert _checkpoints(table) == [2, 30]
    reopened = DeltaTable(table)
    assert reopened.version() == 30
    assert sorted(reopened.to_pyarrow_table().column("id").to_pylist()) == list(range(31))


def test_without_a_long_lived_process_the_checkpoint_is_written_in_the_commit(table) -> None:
    assert not _log_upkeep._WORKER.enabled
    for n in range(1, 11):
        _append(table, [n], read_version=n - 1, checkpoint_interval=10)
    assert _checkpoints(table) == [10]


def test_a_process_that_exits_keeps_its_queued_checkpoint(table) -> None:
    """A process running upkeep in the background exits right after its commit (no
    explicit flush): the ``atexit`` hook runs the queued checkpoint before it goes."""
    script = (
        "import sys\n"
        "from deltaflow.table import _log_upkeep\n"
        "from tests._waiting import wait_until\n"
        "from tests.table.test_log_commit_next_version import _append\n"
        "_log_upkeep.run_in_background(True)\n"
        "for n in range(1, 11):\n"
        "    _append(sys.argv[1], [n], read_version=n - 1, checkpoint_interval=10)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", script, table], check=True, timeout=120, env=env)
    assert _checkpoints(table) == [10]


def test_a_brain_stopped_by_sigterm_writes_its_queued_checkpoint_first(table) -> None:
    """The driver retires its brain with SIGTERM (``Brain.scala``): the brain's handler
    runs the checkpoint still queued (here held back 2 s) before the process exits."""
    script = (
        "import signal, sys, threading, time\n"
        "from deltaflow.spark.bridge import _server\n"
        "from deltaflow.table import _log_upkeep\n"
        "from tests._waiting import wait_until\n"
        "from tests.table.test_log_commit_next_version import _append\n"
        "real = _log_upkeep._upkeep\n"
        "def held(*args):\n"
        "    time.sleep(2)\n"
        "    return real(*args)\n"
        "_log_upkeep._upkeep = held\n"
        "def commits():\n"
        "    # once main() has put upkeep in the background and its SIGTERM handler in place\n"
        "    wait_until(\n"
        "        lambda: signal.getsignal(signal.SIGTERM) is _server._stop_on_sigterm,\n"
        "        60,\n"
        "        'the brain to start',\n"
        "    )\n"
        "    for n in range(1, 11):\n"
        "        _append(sys.argv[1], [n], read_version=n - 1, checkpoint_interval=10)\n"
        "    print('COMMITTED', file=sys.stderr, flush=True)\n"
        "threading.Thread(target=commits).start()\n"
        "_server.main()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    brain = subprocess.Popen(
        [sys.executable, "-c", script, table],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert brain.stderr is not None
        for line in brain.stderr:
            if "COMMITTED" in line:
                break
        assert _checkpoints(table) == []  # queued, held back
        brain.send_signal(signal.SIGTERM)
        assert brain.wait(60) == 128 + signal.SIGTERM
    finally:
        if brain.poll() is None:
            brain.kill()
            brain.wait(30)
    assert _checkpoints(table) == [10]
