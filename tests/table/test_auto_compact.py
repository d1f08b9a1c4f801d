"""Auto compaction's table side: settings, the hook's choices, and its safety against
concurrent writers (delta-rs only, no Spark)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _auto_compact, _commit, _compaction_lease, _compaction_log, _dml_lease
from deltaflow.table._auto_compact import AutoCompactSettings
from deltaflow.table.errors import ConcurrentWriteError


def small_files(
    path: str,
    count: int,
    partitioned: bool = False,
    *,
    start: int = 0,
    configuration: dict[str, str | None] | None = None,
) -> None:
    if configuration is None:
        configuration = {"delta.autoOptimize.autoCompact": "true"}
    for i in range(start, start + count):
        data = {"id": pa.array([i], pa.int64())}
        if partitioned:
            data["p"] = pa.array([i % 2], pa.int64())
        write_deltalake(
            path,
            pa.table(data),
            mode="append",
            partition_by=["p"] if partitioned else None,
            configuration=configuration,
        )


def ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def job(path: str, **settings: int) -> _auto_compact.CompactionJob:
    return _auto_compact.CompactionJob(
        path, (), frozenset({()}), AutoCompactSettings(min_num_files=2, **settings)
    )


def test_settings_from_session_conf_and_precedence() -> None:
    settings = AutoCompactSettings.from_conf(
        {
            "spark.databricks.delta.autocompact.enabled": "TRUE",
            "spark.databricks.delta.autoCompact.minNumFiles": "7",
            "spark.databricks.delta.autoCompact.maxFileSize": "1000",
        }
    )
    assert (settings.enabled, settings.min_num_files, settings.small_file_size) == (True, 7, 500)
    assert AutoCompactSettings.from_conf(settings.to_conf()) == settings
    off = AutoCompactSettings(enabled=False)
    table_on = {"delta.autoOptimize.autoCompact": "auto"}
    assert not _auto_compact.enabled_for(off, table_on)  # the session wins
    assert _auto_compact.enabled_for(AutoCompactSettings(), table_on)
    assert _auto_compact.enabled_for(AutoCompactSettings(), {"delta.autoOptimize": "true"})
    assert not _auto_compact.enabled_for(AutoCompactSettings(), {})
    # A stream's writer: on unless the session or the table says otherwise.
    stream = AutoCompactSettings(stream=True)
    assert _auto_compact.enabled_for(stream, {})
    assert _auto_compact.enabled_for(stream, {"delta.autoOptimize.autoCompact": "sometimes"})
    assert not _auto_compact.enabled_for(stream, {"delta.autoOptimize.autoCompact": "false"})
    assert not _auto_compact.enabled_for(stream, {"delta.autoOptimize": "false"})
    assert not _auto_compact.enabled_for(replace(stream, enabled=False), {})
    with pytest.raises(InvalidOptionError) as caught:
        AutoCompactSettings.from_conf({"spark.databricks.delta.autoCompact.maxFileSize": "0"})
    assert caught.value.option == "spark.databricks.delta.autoCompact.maxFileSize"


def test_hook_compacts_only_partitions_with_enough_small_files(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 9, partitioned=True)  # p=0: 5 files, p=1: 4 files
    outcome = _auto_compact.after_commit(
        table_uri=path,
        partition_columns=["p"],
        added_partitions=[{"p": "0"}, {"p": "1"}],
        version=8,
        settings=AutoCompactSettings(min_num_files=5),
        configuration=None,
        load_table=lambda: DeltaTable(path),
    )
    assert outcome is not None and outcome.files_removed == 5 and outcome.partitions == 1
    counts = DeltaTable(path).get_add_actions(flatten=True).column("partition.p").to_pylist()
    assert sorted(counts) == [0, 1, 1, 1, 1]
    assert ids(path) == list(range(9))


def test_two_compactions_at_once_never_duplicate_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 10)
    outcomes: list[_auto_compact.CompactionOutcome] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(_auto_compact.run(job(path))))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert ids(path) == list(range(10))
    assert sum(o.files_removed for o in outcomes) == 10  # one of them compacted


def test_overwrite_after_a_compaction_replaces_the_compacted_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 4)
    read_version = DeltaTable(path).version()
    assert _auto_compact.run(job(path)).files_removed == 4
    pq.write_table(pa.table({"id": pa.array([100], pa.int64())}), os.path.join(path, "new.parquet"))
    added = _commit.AddedFile(
        "new.parquet",
        os.path.getsize(os.path.join(path, "new.parquet")),
        {},
        int(time.time() * 1000),
        json.dumps({"numRecords": 1}),
    )
    schema = json.loads(DeltaTable(path).schema().to_json())
    request = _commit.CommitRequest(
        path, schema, (), [added], mode="overwrite", read_version=read_version
    )
    _commit.commit(request)
    assert ids(path) == [100]  # delta-rs alone would keep 0..3 (the compacted copy)


def test_removes_of_files_a_compaction_replaced_conflict(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 4)
    table = DeltaTable(path)
    read_version = table.version()
    actions = table.get_add_actions(flatten=True)
    first_path = actions.column("path").to_pylist()[0]
    first_size = actions.column("size_bytes").to_pylist()[0]
    assert _auto_compact.run(job(path)).files_removed == 4
    schema = json.loads(table.schema().to_json())
    removed = _commit.RemovedFile(first_path, first_size, {})
    request = _commit.CommitRequest(path, schema, (), [], [removed], read_version=read_version)
    with pytest.raises(ConcurrentWriteError) as caught:
        _commit.commit(request)
    assert caught.value.kind == "ConcurrentDeleteRead"
    assert _compaction_log.lost_to_compaction(path, "ConcurrentDeleteRead", read_version)
    assert ids(path) == [0, 1, 2, 3]


def test_leases_keep_auto_compaction_off(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 4)
    with _dml_lease.holding(path) as lease:
        assert lease is not None
        assert _auto_compact.run(job(path)).skipped == "a DML is running on the table"
    held = _compaction_lease.try_acquire(path)
    assert held is not None
    try:
        assert _compaction_lease.try_acquire(path) is None
        assert _auto_compact.run(job(path)).files_removed == 0
    finally:
        _compaction_lease.release(path, held)
    assert _auto_compact.run(job(path)).files_removed == 4


def test_background_compaction(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 3)
    scheduled = _auto_compact.after_commit(
        table_uri=path,
        partition_columns=[],
        added_partitions=[{}],
        version=2,
        settings=AutoCompactSettings(min_num_files=3, background=True),
        configuration={"delta.autoOptimize.autoCompact": "true"},
    )
    assert scheduled is None
    assert _auto_compact.wait_for_background(60)
    assert len(DeltaTable(path).get_add_actions(flatten=True)) == 1
    assert ids(path) == [0, 1, 2]


def test_a_streams_table_is_compacted_from_ten_small_files_by_default(tmp_path: Path) -> None:
    """The stream default (no setting anywhere): in the background, from 10 small files."""
    stream = AutoCompactSettings(stream=True)
    path = str(tmp_path / "t")
    small_files(path, 9, configuration={})

    def commit(version: int) -> None:
        scheduled = _auto_compact.after_commit(
            table_uri=path,
            partition_columns=[],
            added_partitions=[{}],
            version=version,
            settings=stream,
            configuration={},
        )
        assert scheduled is None  # never in the stream's own call
        assert _auto_compact.wait_for_background(60)

    commit(8)
    assert len(DeltaTable(path).get_add_actions(flatten=True)) == 9  # under the threshold
    small_files(path, 1, start=9, configuration={})
    commit(9)
    assert len(DeltaTable(path).get_add_actions(flatten=True)) == 1
    assert ids(path) == list(range(10))


def test_exit_drops_waiting_runs_and_finishes_the_running_one(tmp_path: Path) -> None:
    """The worker's exit hook: nothing is left inside delta-rs while the interpreter ends."""
    worker = _auto_compact._BackgroundWorker()
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    small_files(first, 3)
    small_files(second, 3)
    worker.submit(job(first))
    worker.close()  # returns once no run is in progress
    assert worker.wait_idle(0)
    worker.submit(job(second))  # after exit began: ignored
    assert worker.wait_idle(0)
    assert len(DeltaTable(second).get_add_actions(flatten=True)) == 3
    assert ids(first) == [0, 1, 2]  # compacted or not, every row once


def test_the_background_worker_counts_its_own_commits_small_files_between_checks(
    tmp_path: Path,
) -> None:
    """A stream commits often; counting small files means loading the whole table. After
    one count the worker adds up the small files the jobs report and loads the table again
    only when a partition can have reached the threshold (or the count is too old)."""
    worker = _auto_compact._BackgroundWorker()
    path = str(tmp_path / "t")
    small_files(path, 3)

    def submit(added: int | None) -> _auto_compact.CompactionOutcome:
        small = None if added is None else {(): added}
        settings = AutoCompactSettings(min_num_files=5)
        worker.submit(
            _auto_compact.CompactionJob(path, (), frozenset({()}), settings, small_added=small)
        )
        assert worker.wait_idle(60)
        return worker.outcomes[-1]

    counted = submit(1)  # no count yet: the table is loaded
    assert counted.skipped == "no partition it wrote holds enough small files"
    assert counted.small_files == {(): 3}
    small_files(path, 1, start=3)
    assert submit(1).skipped == "too few small files (counted from this process's commits)"
    small_files(path, 1, start=4)
    done = submit(1)  # 5 by the count: the table is loaded and compacted
    assert (done.files_removed, done.small_files) == (5, {(): 1})
    assert ids(path) == list(range(5))
    # A job whose files' sizes are not known counts in the table again.
    small_files(path, 1, start=5)
    assert submit(None).small_files == {(): 2}
    # A count older than COUNT_SECONDS is redone, catching files the jobs did not report.
    small_files(path, 3, start=6)
    worker.COUNT_SECONDS = 0.0
    assert submit(0).small_files == {(): 1}  # 5 small files: compacted at once
    assert ids(path) == list(range(9))
    worker.close()


def test_a_streams_commits_report_their_small_files_and_the_table_is_loaded_once_per_compaction(
    tmp_path: Path,
) -> None:
    """End to end through ``_commit.commit`` (a stream's settings, the default worker): the
    first commit's check loads the table; the next ones are ruled out by the count of the
    small files they added, until the count reaches ten and the check loads and compacts."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    reasons = []
    for i in range(1, 11):
        name = f"part-{i}.parquet"
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), os.path.join(path, name))
        added = _commit.AddedFile(
            name, os.path.getsize(os.path.join(path, name)), {}, 0, json.dumps({"numRecords": 1})
        )
        table = DeltaTable(path)
        _commit.commit(
            _commit.CommitRequest(
                path,
                json.loads(table.schema().to_json()),
                (),
                [added],
                read_version=table.version(),
                auto_compact=AutoCompactSettings(stream=True),
            )
        )
        assert _auto_compact.wait_for_background(60)
        outcome = _auto_compact._WORKER.outcomes[-1]
        reasons.append(outcome.skipped or f"compacted {outcome.files_removed}")
    counted = "too few small files (counted from this process's commits)"
    assert reasons == [
        "no partition it wrote holds enough small files",  # loaded: 2 small files
        *[counted] * 7,  # 3 to 9 by the count
        "compacted 10",  # 10 by the count: loaded, compacted
        counted,  # the compaction's file and this commit's
    ]
    assert ids(path) == list(range(11))
