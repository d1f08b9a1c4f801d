"""How many requests the brain's log reads cost on a real S3 server (SeaweedFS, its own
request counters): every request is a round trip the driver waits for before a query's
tasks start, so a scan or a write on S3 pays for each one (issue 29's targets)."""

from __future__ import annotations

import collections
import pickle
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltaflow.spark.bridge import _ops
from deltaflow.table._snapshot import load_snapshot
from tests._object_store import ObjectStore, free_port, start_seaweedfs
from tests._waiting import wait_until


class Counted:
    def __init__(self, store: ObjectStore, metrics_port: int) -> None:
        self.store, self.url = store, f"http://127.0.0.1:{metrics_port}/metrics"

    def counts(
        self, changed_from: collections.Counter[str] | None = None
    ) -> collections.Counter[str]:
        """The server's S3 requests so far by type (its GET includes HEAD), once settled.
        The server counts a request just after answering it, later still on a loaded
        machine: with ``changed_from``, first wait (up to 30 s) until the counts differ from
        it (every call measured makes a request); then until four reads 0.2 s apart
        agree."""
        if changed_from is not None:
            wait_until(lambda: self._read() != changed_from, 30, "the server to count a request")
        reads = [self._read()]

        def settled() -> bool:
            reads.append(self._read())
            return len(reads) >= 4 and all(r == reads[-1] for r in reads[-4:])

        wait_until(settled, 30, "the server's request counts to settle")
        return reads[-1]

    def wait_until_up(self, timeout: float = 60) -> None:
        """The metrics endpoint starts after the S3 port the launcher waits for."""

        def answers() -> bool:
            try:
                self._read()
            except OSError:
                return False
            return True

        wait_until(answers, timeout, f"metrics at {self.url}")

    def _read(self) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        with urllib.request.urlopen(self.url, timeout=10) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("SeaweedFS_s3_request_total{"):
                    labels, value = line.rsplit(" ", 1)
                    counts[labels.split('type="', 1)[1].split('"', 1)[0]] += int(float(value))
        return counts


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Counted]:
    port = free_port()
    data = Path(tmp_path_factory.mktemp("seaweedfs-counted"))
    # Its own S3 port: the process's planned endpoint may already be served by the shared
    # server (tests/conftest.py), and a second server there would exit at once.
    endpoint = f"http://127.0.0.1:{free_port()}"
    with start_seaweedfs(data, endpoint, extra_args=[f"-metricsPort={port}"]) as store:
        counted = Counted(store, port)
        counted.wait_until_up()
        yield counted


@pytest.fixture
def table(counted: Counted, monkeypatch: pytest.MonkeyPatch) -> str:
    """A two-commit table on the server, as ``s3a://`` (what the brain gets from S3A)."""
    for key, value in counted.store.env.items():
        monkeypatch.setenv(key, value)
    uri = counted.store.uri("requests")
    for n in range(2):
        data = pa.table({"id": pa.array([n], pa.int64())})
        write_deltalake(uri, data, mode="append", storage_options=counted.store.storage_options)
    return "s3a" + uri.removeprefix("s3")


def requests_of(counted: Counted, call) -> collections.Counter[str]:
    before = counted.counts()
    call()
    return counted.counts(changed_from=before) - before


def test_table_load_lists_the_log_once(counted, table):
    """``table.load`` (every read, write and stream start): one LIST of ``_delta_log``, no
    separate existence check before the load."""
    made = requests_of(counted, lambda: _ops.load_table({"options": {"path": table}}))
    assert made["LIST"] == 1, made


def test_a_missing_table_still_loads_as_absent(counted, table):
    """A new table's write starts with this: one LIST finds no log, nothing more."""
    answer: dict = {}

    def load() -> None:
        answer.update(_ops.load_table({"options": {"path": table + "-nothing-here"}}))

    made = requests_of(counted, load)
    assert answer["exists"] is False, answer
    assert made["LIST"] == 1, made


def test_a_snapshots_file_list_reuses_the_loaded_log(counted, table):
    """``scan.plan``: the snapshot's file list comes from the log its load read, not from a
    second load of the same version (a LIST and a GET per commit fewer)."""

    def load_and_list() -> None:
        files = load_snapshot(table, version=1).files()
        assert len(files) == 2

    made = requests_of(counted, load_and_list)
    assert made["LIST"] == 1, made
    plan = requests_of(counted, lambda: _ops.plan_scan({"uri": table, "version": 1}))
    assert plan["LIST"] == 1, plan


def test_a_pickled_snapshot_leaves_the_loaded_table_behind(counted, table):
    snapshot = load_snapshot(table)
    copy = pickle.loads(pickle.dumps(snapshot))
    assert "delta_table" not in copy.__dict__
    assert copy == snapshot
    assert len(copy.files()) == 2
