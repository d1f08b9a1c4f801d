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
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from deltaflow.spark.bridge import _ops, _snapshots
from deltaflow.spark.read._checks import _CONNECTOR_READ, _check_delta
from deltaflow.table import _conditional_put
from deltaflow.table._snapshot import load_snapshot
from deltaflow.table.errors import TableNotFoundError
from tests._object_store import ObjectStore, free_port, start_seaweedfs, store_fs
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


@pytest.fixture(autouse=True)
def no_cached_snapshots(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test counts from a brain that has loaded nothing, and no entry runs out while
    a loaded machine waits for the server's counters (the TTL test sets its own)."""
    monkeypatch.setattr(_snapshots, "TTL_SECONDS", 600.0)
    _snapshots.forget()
    yield
    _snapshots.forget()


def make_table(counted: Counted, monkeypatch: pytest.MonkeyPatch, commits: int) -> str:
    """A table of ``commits`` one-row appends (ids 0, 1, ...) on the server, as ``s3a://``
    (what the brain gets from S3A)."""
    for key, value in counted.store.env.items():
        monkeypatch.setenv(key, value)
    uri = counted.store.uri("requests")
    for n in range(commits):
        append(counted, "s3a" + uri.removeprefix("s3"), [n])
    return "s3a" + uri.removeprefix("s3")


def append(counted: Counted, table: str, ids: list[int]) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64())})
    uri = "s3" + table.removeprefix("s3a")
    write_deltalake(uri, data, mode="append", storage_options=counted.store.storage_options)


@pytest.fixture
def table(counted: Counted, monkeypatch: pytest.MonkeyPatch) -> str:
    """A two-commit table."""
    return make_table(counted, monkeypatch, 2)


@pytest.fixture
def one_commit(counted: Counted, monkeypatch: pytest.MonkeyPatch) -> str:
    """A one-commit table, as the S3 bench writes."""
    return make_table(counted, monkeypatch, 1)


def requests_of(counted: Counted, call) -> collections.Counter[str]:
    before = counted.counts()
    call()
    return counted.counts(changed_from=before) - before


def requests_with_a_marker(counted: Counted, table: str, call) -> collections.Counter[str]:
    """The requests of ``call``, which may make none, plus one HEAD made after it (the
    server counts it as a GET): waiting for that one to be counted cannot end before
    ``call``'s requests are counted too."""

    def call_then_head() -> None:
        call()
        assert not _conditional_put.object_exists(table + "/no-such-object")

    return requests_of(counted, call_then_head)


def plan_rows(counted: Counted, answer: dict) -> list[int]:
    """The ids in the files a ``scan.plan`` answer names, read straight from the server."""
    fs = store_fs(counted.store)
    paths = [f["location"].split("://", 1)[1] for f in answer["files"]]
    return sorted(
        i for p in paths for i in pq.read_table(p, filesystem=fs).column("id").to_pylist()
    )


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


# ---- the brain's snapshot cache (bridge/_snapshots.py) --------------------------------


def test_a_reads_load_and_plan_read_the_log_once(counted, one_commit):
    """``table.load`` then ``scan.plan`` of one read: one log load (1 LIST, GETs of
    ``_last_checkpoint`` and of the commit twice), then one HEAD of the next commit's name
    (counted by the server as a GET)."""
    answer: dict = {}

    def load_and_plan() -> None:
        _ops.load_table({"options": {"path": one_commit}})
        answer.update(_ops.plan_scan({"uri": one_commit}))

    made = requests_of(counted, load_and_plan)
    assert (made["LIST"], made["GET"]) == (1, 4), made
    assert plan_rows(counted, answer) == [0]


def test_a_repeated_read_costs_two_heads(counted, table):
    def load_and_plan() -> None:
        _ops.load_table({"options": {"path": table}})
        _ops.plan_scan({"uri": table})

    load_and_plan()
    made = requests_of(counted, load_and_plan)
    assert made == collections.Counter({"GET": 2}), made  # a HEAD each, counted as GETs


def test_a_plan_after_an_append_sees_the_new_rows(counted, table):
    _ops.load_table({"options": {"path": table}})
    assert plan_rows(counted, _ops.plan_scan({"uri": table})) == [0, 1]
    append(counted, table, [7])
    loaded = _ops.load_table({"options": {"path": table}})
    answer = _ops.plan_scan({"uri": table})
    assert loaded["version"] == answer["version"] == 2
    assert plan_rows(counted, answer) == [0, 1, 7]


def test_time_travel_to_a_loaded_version_makes_no_request(counted, table):
    answers: list = []

    def travel() -> None:
        _ops.load_table({"options": {"path": table, "versionAsOf": "0"}})
        answers.append(_ops.plan_scan({"uri": table, "version": 0}))

    first = requests_of(counted, travel)
    assert first["LIST"] >= 1, first
    again = requests_with_a_marker(counted, table, travel)
    assert again == collections.Counter({"GET": 1}), again  # the marker's HEAD alone
    assert [plan_rows(counted, a) for a in answers] == [[0], [0]]


def test_a_deleted_and_recreated_table_is_read_anew_after_the_ttl(counted, table, monkeypatch):
    """The gap the name probe leaves (the new table has not reached the cached version + 1
    yet) closes when the entry's TTL runs out."""
    _ops.load_table({"options": {"path": table}})
    assert plan_rows(counted, _ops.plan_scan({"uri": table})) == [0, 1]
    fs = store_fs(counted.store)
    fs.delete_dir(table.split("://", 1)[1])
    append(counted, table, [5])  # version 0 again, one row
    monkeypatch.setattr(_snapshots, "TTL_SECONDS", 0.0)
    answer = _ops.plan_scan({"uri": table})
    assert answer["version"] == 0
    assert plan_rows(counted, answer) == [5]


def test_a_load_that_finds_no_table_drops_the_cached_one(counted, table):
    _ops.load_table({"options": {"path": table}})
    store_fs(counted.store).delete_dir(table.split("://", 1)[1])
    # Within the TTL the name probe cannot tell (no version 2 either)...
    assert _ops.load_table({"options": {"path": table}})["exists"] is True
    # ...but any load that finds no table there drops the entry.
    with pytest.raises(TableNotFoundError):
        _ops.load_table({"options": {"path": table, "versionAsOf": "0"}})
    assert _ops.load_table({"options": {"path": table}})["exists"] is False


# ---- the classic reader's driver check (spark/read/_checks.py, P1) ---------------------


def test_the_driver_check_of_a_plain_read_reads_no_log(counted, table):
    state = {"options": {}, "schema": None}
    answer: list = []
    made = requests_with_a_marker(counted, table, lambda: answer.append(_check_delta(state, table)))
    assert answer == [_CONNECTOR_READ]
    assert made == collections.Counter({"GET": 1}), made  # the marker's HEAD alone


def test_a_marked_read_of_a_missing_table_raises_in_table_load(counted, table):
    """What the classic reader's ``load()`` gets from the connector for a missing path."""
    missing = table + "-nothing-here"
    with pytest.raises(TableNotFoundError) as info:
        _ops.load_table({"options": {"path": missing, "__deltaflow_read": "true"}})
    assert info.value.table_uri == missing
    # A write's table.load (no marker) still answers "no table yet".
    assert _ops.load_table({"options": {"path": missing}})["exists"] is False
