"""A long-running real-time sink's log (issue 28, "streaming tables stay healthy"): a
real-time sink commits 12-20 times a second and the log keeps 30 days of commits by
default, so ``_delta_log`` holds 100,000 files within hours. On a local disk every
delta-rs load walks that directory, which is no snapshot: commits landing during the walk
leave gaps delta-rs refuses. deltaflow's loads are pinned to the newest commit found by
name, and its background work on a table is paced by what it costs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.table import _auto_compact, _cluster_optimize, _log, _log_upkeep, _uri
from deltaflow.table._auto_compact import AutoCompactSettings
from deltaflow.table._pace import Pace
from deltaflow.table._snapshot import load_snapshot, open_latest
from tests.table.test_auto_compact import small_files
from tests.table.test_log_commit_next_version import _append
from tests.table.test_log_upkeep_background import background  # noqa: F401 (a fixture)

# Enough files that a walk of the log spans many of the committer's commits.
AGED_FILES = 25_000


def _age(path: str, files: int) -> None:
    """``files`` files in the log that no reader takes for a log entry."""
    log_dir = Path(path) / "_delta_log"
    for i in range(files):
        (log_dir / f"aged-{i:06d}.tmp").touch()


class _Committer:
    """Commits to ``path`` as fast as it can, each one put with a hard link (as
    deltaflow's log writer does): a commitInfo-only commit is a valid empty commit."""

    def __init__(self, path: str, interval: float = 0.01) -> None:
        self.log_dir = Path(path) / "_delta_log"
        self.interval = interval
        self.version = self.first = DeltaTable(path).version()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # At most ~10 s of commits: each load then replays every one of them.
        while not self._stop.is_set() and self.version < self.first + 1000:
            version = self.version + 1
            temp = self.log_dir / f".committing-{version}"
            info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}}
            temp.write_text(json.dumps(info) + "\n")
            with contextlib.suppress(FileExistsError):  # another writer took this version
                os.link(temp, self.log_dir / f"{version:020d}.json")
            temp.unlink()
            self.version = version
            self._stop.wait(self.interval)

    def __enter__(self) -> _Committer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_the_newest_commit_is_found_by_name_from_the_last_checkpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    assert _log.newest_local_version(path) == 0  # no checkpoint: from commit 0
    for n in range(1, 26):
        assert _append(path, [n], read_version=n - 1, checkpoint_interval=10) == n
    assert _log.last_checkpoint(_uri.normalize_uri(path)) == 20
    assert _log.newest_local_version(path) == 25
    assert _log.newest_local_version(_uri.normalize_uri(path)) == 25
    # Commits before the checkpoint are not needed (log cleanup removes them).
    for version in range(0, 20):
        os.unlink(os.path.join(path, "_delta_log", f"{version:020d}.json"))
    assert _log.newest_local_version(path) == 25
    assert open_latest(path).version() == 25
    assert len(open_latest(path).file_uris()) == 26
    # Far past the checkpoint (upkeep behind): the doubling and halving still land on it.
    for n in range(26, 140):
        assert _append(path, [n], read_version=n - 1, checkpoint_interval=1000) == n
    assert _log.newest_local_version(path) == 139
    assert _log.newest_local_version(str(tmp_path / "none")) is None
    assert _log.newest_local_version("s3://bucket/table") is None


def test_loads_see_every_commit_while_commits_land_in_a_large_log(tmp_path: Path) -> None:
    """delta-rs's own load of the newest version walks the directory and, with commits
    landing every few ms, finds gaps and fails; deltaflow's loads (pinned by name) never
    do, and each sees a version at least as new as the last one committed before it."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    _age(path, AGED_FILES)
    loads: list[Callable[[], int]] = [
        lambda: open_latest(path).version(),
        lambda: load_snapshot(_uri.normalize_uri(path)).version,
    ]
    with _Committer(path) as committer:
        unpinned_gaps = 0
        for _ in range(10):
            try:
                DeltaTable(path).version()
            except Exception as exc:  # delta-rs's kernel error, untyped
                assert "gap" in str(exc), exc
                unpinned_gaps += 1
                break
        # Without a gap in an unpinned load the scenario would test nothing.
        assert unpinned_gaps == 1
        for load in loads * 2:
            before = committer.version
            assert load() >= before
    assert committer.version > 20


def test_the_pace_waits_a_multiple_of_the_last_run() -> None:
    pace = Pace(9.0)
    assert pace.first_ready(["a", "b"]) == ("a", 0.0)
    now = time.monotonic()
    pace.ran("a", now - 0.5, now)  # 0.5 s: "a" waits 4.5 s
    assert pace.first_ready(["a", "b"]) == ("b", 0.0)
    waiting, wait = pace.first_ready(["a"])
    assert waiting is None and 4.0 < wait <= 4.5
    assert pace.first_ready(["a"], hurry=True) == ("a", 0.0)


def _until(changed: threading.Condition, condition: Callable[[], bool], timeout: float) -> bool:
    """Whether ``condition`` holds within ``timeout`` (a worker notifies ``changed`` after
    each run)."""
    with changed:
        return changed.wait_for(condition, timeout)


@pytest.mark.usefixtures("background")
def test_log_upkeep_is_paced_by_its_cost_and_a_flush_runs_what_waits(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    real = _log_upkeep._upkeep
    ran: list[int] = []

    def recorded(uri, version, configuration, storage_options):  # type: ignore[no-untyped-def]
        wrote = real(uri, version, configuration, storage_options)
        ran.append(version)
        return wrote

    monkeypatch.setattr(_log_upkeep, "_upkeep", recorded)
    # A checkpoint takes milliseconds here: a million times that is a large log's pace.
    monkeypatch.setattr(_log_upkeep._WORKER._pace, "factor", 1_000_000.0)
    monkeypatch.setattr(_log_upkeep, "SLOW_UPKEEP_SECONDS", 0.0)
    changed = _log_upkeep._WORKER._changed
    monkeypatch.setattr(_log_upkeep, "MANY_LOG_FILES", 20)
    caplog.set_level(logging.WARNING, logger=_log_upkeep.log.name)
    for n in range(1, 11):
        assert _append(path, [n], read_version=n - 1, checkpoint_interval=10) == n
    assert _until(changed, lambda: ran == [10], 30)
    for n in range(11, 21):
        assert _append(path, [n], read_version=n - 1, checkpoint_interval=10) == n
    # Due, but paced: it waits, and the table reads at every version meanwhile.
    assert not _until(changed, lambda: len(ran) > 1, 1.0)
    assert DeltaTable(path).version() == 20
    assert _log.last_checkpoint(_uri.normalize_uri(path)) == 10
    started = time.monotonic()
    assert _log_upkeep.flush(30)
    assert time.monotonic() - started < 15  # not the pace's minutes
    assert ran == [10, 20]
    assert _log.last_checkpoint(_uri.normalize_uri(path)) == 20
    # Slow upkeep is explained once (an hour) per table, with the setting to change.
    slow = [r.getMessage() for r in caplog.records if "log upkeep of" in r.getMessage()]
    assert len(slow) == 1, slow
    assert "delta.logRetentionDuration" in slow[0] and "interval 30 days" in slow[0]
    assert "_delta_log holds 2" in slow[0]  # 20-odd commits and a checkpoint


def test_background_compaction_is_paced_and_waiting_for_it_runs_what_waits(
    tmp_path: Path,
) -> None:
    worker = _auto_compact._BackgroundWorker()
    worker._pace.factor = 10_000.0  # after the first run, the next waits for minutes
    path = str(tmp_path / "t")
    small_files(path, 3)
    settings = AutoCompactSettings(min_num_files=3)

    def submit() -> None:
        worker.submit(_auto_compact.CompactionJob(path, (), frozenset({()}), settings))

    submit()
    assert worker.wait_idle(60)
    assert worker.outcomes[-1].files_removed == 3
    small_files(path, 3, start=3)
    submit()
    submit()  # merged with the waiting one
    assert not _until(worker._changed, lambda: len(worker.outcomes) > 1, 1.0)  # paced
    assert worker.wait_idle(60)  # runs it now
    assert len(worker.outcomes) == 2
    assert worker.outcomes[-1].files_removed == 4  # the first run's file and three more
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == list(range(6))
    worker.close()


def test_auto_compaction_commits_on_the_log_writer_when_delta_rs_finds_a_gap(
    tmp_path: Path,
) -> None:
    """delta-rs's OPTIMIZE loses the race to a busy writer, and its conflict check lists
    the large log and refuses the gap; the compaction is then made again and committed
    by deltaflow's log writer, which reads the commits it raced by name."""
    path = str(tmp_path / "t")
    small_files(path, 4)
    _age(path, AGED_FILES)
    worker = _auto_compact._BackgroundWorker()
    settings = AutoCompactSettings(min_num_files=3)
    with _Committer(path, interval=0.002) as committer:
        worker.submit(_auto_compact.CompactionJob(path, (), frozenset({()}), settings))
        assert worker.wait_idle(120)
    outcome = worker.outcomes[-1]
    assert outcome.version is not None, outcome
    assert (outcome.files_removed, outcome.files_added) == (4, 1)
    assert outcome.version <= committer.version + 1
    table = open_latest(path)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2, 3]
    assert len(table.file_uris()) == 1
    actions = _log.read_commit(_uri.normalize_uri(path), outcome.version) or []
    entry = next(a["commitInfo"] for _, a in actions if "commitInfo" in a)
    assert entry["operation"] == "OPTIMIZE"
    parameters = entry["operationParameters"]
    assert str(parameters["auto"]).lower() == "true"
    assert "isFull" in parameters  # the log writer's OPTIMIZE (delta-rs does not write it)
    worker.close()


def test_a_compaction_on_the_log_writer_reads_a_bounded_set_of_small_files(
    tmp_path: Path,
) -> None:
    """Only files under the small-file size, the smallest first, up to the byte budget:
    one run never reads a table's worth of mid-sized files into memory."""
    path = str(tmp_path / "t")
    small_files(path, 4)
    write_deltalake(path, pa.table({"id": pa.array(range(4, 20_004), pa.int64())}), mode="append")
    snapshot = load_snapshot(_uri.normalize_uri(path))
    sizes = sorted(e.size for e in snapshot.files())
    assert len(sizes) == 5 and sizes[-1] > sizes[-2]
    result = _cluster_optimize.cluster(snapshot, small=(sizes[-1], sum(sizes[:3])))
    assert result.version is not None
    assert sorted(result.files_removed) == sizes[:3]
    table = open_latest(path)
    assert len(table.file_uris()) == 3
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(20_004))
    # Nothing left under the size but one file: no commit.
    again = _cluster_optimize.cluster(load_snapshot(_uri.normalize_uri(path)), small=(sizes[0], 1))
    assert again.version is None


def test_a_real_time_sink_warns_once_of_a_log_its_retention_lets_grow_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A partition's start (``sink.transactions``) checks the target's log retention
    against the sink's commit cap, once per table and process."""
    from deltaflow.spark.bridge import _realtime

    default, short = str(tmp_path / "default"), str(tmp_path / "short")
    write_deltalake(default, pa.table({"k": [1]}))
    write_deltalake(
        short,
        pa.table({"k": [1]}),
        configuration={"delta.logRetentionDuration": "interval 2 hours"},
    )

    def start(path: str, interval_ms: int | None = None) -> list[str]:
        caplog.clear()
        options = {} if interval_ms is None else {"realTimeCommitIntervalMs": str(interval_ms)}
        with caplog.at_level(logging.WARNING, logger="deltaflow.realtime"):
            answer = _realtime.transactions(
                {"path": path, "appIds": ["q/rtm-p0"], "options": options}
            )
        assert answer["versions"] == {"q/rtm-p0": None}
        return [r.getMessage() for r in caplog.records if r.name == "deltaflow.realtime"]

    _realtime._LOG_SIZE.forget()
    try:
        # 30 days at 20 commits a second: ~52 million files.
        (warning,) = start(default)
        assert "51,840,000 files" in warning and "interval 30 days, the default" in warning
        assert "'delta.logRetentionDuration' = 'interval 2 hours'" in warning
        assert start(default) == []  # once per table
        assert start(short) == []  # 2 hours at 20 a second: 144,000 files
        _realtime._LOG_SIZE.forget()
        (warning,) = start(short, interval_ms=5)  # ... at 200 a second: 1,440,000
        assert "1,440,000 files" in warning and "(interval 2 hours)" in warning
        _realtime._LOG_SIZE.forget()
        missing = str(tmp_path / "missing")
        assert start(missing) == []  # no table yet: a later epoch checks it
        write_deltalake(missing, pa.table({"k": [1]}))
        assert len(start(missing)) == 1
    finally:
        _realtime._LOG_SIZE.forget()
