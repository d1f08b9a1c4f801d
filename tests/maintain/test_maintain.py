"""`deltaflow maintain`: discovery, decisions, commits in the history, the CLI process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow import maintain
from deltaflow.spark.commands import _describe
from tests._waiting import wait_until
from tests.table.dv_fixtures import add_deletion_vectors

MAINTAIN = [sys.executable, "-m", "deltaflow.cli", "maintain"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def small_files(path: Path, count: int, *, partitioned: bool = False, **kw: object) -> None:
    for i in range(count):
        data = pa.table({"id": [i, i + 1000], "p": [i % 2, i % 2]})
        write_deltalake(
            str(path), data, mode="append", partition_by=["p"] if partitioned else None, **kw
        )


def rows(path: Path) -> list[dict[str, object]]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True))


def live_ids(path: Path) -> list[int]:
    """The ids of the live rows, deletion vectors applied (delta-rs's reader refuses them)."""
    import numpy as np
    import pyarrow.parquet as pq

    from deltaflow.table._snapshot import load_snapshot

    snapshot = load_snapshot(str(path))
    deleted = snapshot.deleted_rows()
    out: list[int] = []
    for entry in snapshot.files(stats=False):
        ids = pq.read_table(path / entry.path).column("id").to_numpy()
        out.extend(np.delete(ids, deleted.get(entry.path, [])).tolist())
    return sorted(out)


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [*MAINTAIN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_discovery_finds_nested_tables_and_ignores_the_rest(tmp_path: Path) -> None:
    small_files(tmp_path / "a" / "t1", 2, partitioned=True)
    small_files(tmp_path / "b" / "c" / "t2", 1)
    (tmp_path / "b" / "plain").mkdir()
    (tmp_path / "b" / "plain" / "data.parquet").write_bytes(b"not a table")
    (tmp_path / "notes.txt").write_text("x")
    # A folder inside a table is the table's own: a stray _delta_log there is not a table.
    (tmp_path / "a" / "t1" / "p=0" / "inner" / "_delta_log").mkdir(parents=True)
    found = maintain.find_tables([str(tmp_path), str(tmp_path / "a")])
    assert found == [str(tmp_path / "a" / "t1"), str(tmp_path / "b" / "c" / "t2")]
    assert maintain.find_tables([str(tmp_path / "a" / "t1")]) == [str(tmp_path / "a" / "t1")]


@pytest.mark.parametrize("kind", ["missing", "not_a_directory"])
def test_a_bad_root_is_a_typed_error_naming_it(tmp_path: Path, kind: str) -> None:
    root = {
        "missing": str(tmp_path / "nope"),
        "not_a_directory": str(tmp_path / "file.txt"),
    }[kind]
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(maintain.MaintainRootError) as caught:
        maintain.run_pass([str(tmp_path), root])
    assert caught.value.kind == kind
    assert caught.value.path == root


def test_cli_once_compacts_small_files_keeping_the_rows(tmp_path: Path) -> None:
    table = tmp_path / "lake" / "events"
    small_files(table, 24, partitioned=True)
    healthy = tmp_path / "lake" / "healthy"
    small_files(healthy, 2)
    before, healthy_version = rows(table), DeltaTable(str(healthy)).version()
    result = cli("--once", "--min-small-files", "10", str(tmp_path / "lake"))
    assert result.returncode == 0, result.stderr
    assert f"{table} OPTIMIZE ran" in result.stderr
    assert f"{healthy} OPTIMIZE skipped" in result.stderr
    assert rows(table) == before
    assert len(DeltaTable(str(table)).file_uris()) == 2  # one per partition
    assert DeltaTable(str(healthy)).version() == healthy_version  # left alone
    # The history (DESCRIBE HISTORY's rows, and delta-rs's) says it was automatic.
    newest = _describe.history(str(table), 1)[0]
    assert newest[4] == "OPTIMIZE"
    assert newest[5]["auto"] == "true"
    commit = DeltaTable(str(table)).history(1)[0]
    assert "partition(s) hold 10+ files" in commit[maintain.MARKER_KEY]


def test_dry_run_commits_nothing(tmp_path: Path) -> None:
    table = tmp_path / "t"
    small_files(table, 12, configuration={"delta.deletedFileRetentionDuration": "interval 0 hours"})
    write_deltalake(str(table), pa.table({"id": [1], "p": [0]}), mode="overwrite")
    version = DeltaTable(str(table)).version()
    listing = sorted(os.listdir(table))
    result = cli("--once", "--dry-run", "--min-small-files", "5", str(table))
    assert result.returncode == 0, result.stderr
    assert f"{table} CHECKPOINT would run" in result.stderr
    assert f"{table} VACUUM would run" in result.stderr
    assert DeltaTable(str(table)).version() == version
    assert sorted(os.listdir(table)) == listing
    assert not (table / "_delta_log" / "_last_checkpoint").exists()


def test_checkpoint_vacuum_and_purge_follow_the_tables_properties(tmp_path: Path) -> None:
    short = tmp_path / "short"  # retention 0 hours by its own property: vacuumed
    small_files(short, 12, configuration={"delta.deletedFileRetentionDuration": "interval 0 hours"})
    write_deltalake(str(short), pa.table({"id": [7], "p": [1]}), mode="overwrite")
    default = tmp_path / "default"  # the default 7 days: removed files stay
    small_files(default, 2)
    write_deltalake(str(default), pa.table({"id": [7], "p": [1]}), mode="overwrite")
    dv = tmp_path / "dv"
    write_deltalake(str(dv), pa.table({"id": list(range(10)), "p": [0] * 10}))
    add_deletion_vectors(str(dv), {DeltaTable(str(dv)).file_uris()[0].rsplit("/", 1)[1]: [1, 2]})
    dv_rows = live_ids(dv)

    report = maintain.run_pass([str(tmp_path)])

    report.raise_for_failures()
    ran = {(a.table, a.action) for a in report.ran()}
    assert (str(short), "CHECKPOINT") in ran
    assert (str(short), "VACUUM") in ran
    assert (str(dv), "REORG PURGE") in ran
    assert not [a for a in report.ran() if a.table == str(default)]
    assert (short / "_delta_log" / "_last_checkpoint").exists()
    assert len([f for f in os.listdir(short) if f.endswith(".parquet")]) == 1
    assert len([f for f in os.listdir(default) if f.endswith(".parquet")]) == 3
    operations = {h["operation"]: h for h in DeltaTable(str(short)).history(2)}
    assert set(operations) == {"VACUUM START", "VACUUM END"}
    assert all(h["operationParameters"]["auto"] == "true" for h in operations.values())
    assert live_ids(dv) == dv_rows == [0, 3, 4, 5, 6, 7, 8, 9]
    purge = DeltaTable(str(dv)).history(1)[0]
    assert purge["operation"] == "REORG" and maintain.MARKER_KEY in purge
    # A second pass finds nothing left to do: no new commit anywhere.
    versions = {t: DeltaTable(str(t)).version() for t in (short, default, dv)}
    assert not maintain.run_pass([str(tmp_path)]).ran()
    assert versions == {t: DeltaTable(str(t)).version() for t in (short, default, dv)}


def test_a_broken_table_fails_the_pass_but_not_the_others(tmp_path: Path) -> None:
    (tmp_path / "broken" / "_delta_log").mkdir(parents=True)  # a log without commits
    (tmp_path / "broken" / "_delta_log" / "00000000000000000000.json").write_text("{oops\n")
    small_files(tmp_path / "good", 6)
    result = cli("--once", "--min-small-files", "5", str(tmp_path))
    assert result.returncode == 1
    assert f"{tmp_path / 'broken'} LOAD failed" in result.stderr
    assert f"{tmp_path / 'good'} OPTIMIZE ran" in result.stderr
    assert "1 of 2 tables failed" in result.stderr
    missing = cli("--once", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert str(tmp_path / "nope") in missing.stderr and "does not exist" in missing.stderr


def test_the_loop_runs_passes_until_sigterm(tmp_path: Path) -> None:
    table = tmp_path / "t"
    small_files(table, 2)
    log = tmp_path / "maintain.log"
    with open(log, "w") as err:
        process = subprocess.Popen(
            [*MAINTAIN, "--interval", "0.5", "--min-small-files", "5", str(tmp_path)],
            stderr=err,
            env={**os.environ, "PYTHONPATH": SRC},
        )
    try:
        # Two passes logged: the loop goes on after the first.
        wait_until(
            lambda: log.read_text().count(f"{table} LOG CLEANUP") >= 2,
            120,
            "two maintenance passes",
        )
        small_files(table, 6)  # a later pass finds them
        wait_until(lambda: f"{table} OPTIMIZE ran" in log.read_text(), 120, "a compaction")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Traceback" not in log.read_text()


def test_a_clustered_table_is_clustered_incrementally(spark, tmp_path: Path) -> None:
    table = tmp_path / "clustered"
    spark.sql(f"CREATE TABLE delta.`{table}` (x BIGINT, y BIGINT) USING delta CLUSTER BY (x, y)")
    for n in range(6):
        spark.range(n * 10, n * 10 + 10).selectExpr("id AS x", "id % 3 AS y").coalesce(
            1
        ).write.format("delta").mode("append").save(str(table))
    before = rows(table)
    options = maintain.MaintainOptions(min_small_files=5)

    report = maintain.run_pass([str(tmp_path)], options)

    assert [a.action for a in report.ran()] == ["OPTIMIZE"], report.actions
    assert rows(table) == before
    newest = _describe.history(str(table), 1)[0]
    assert newest[4] == "OPTIMIZE"
    assert newest[5]["auto"] == "true" and json.loads(newest[5]["clusterBy"]) == ["x", "y"]
    version = DeltaTable(str(table)).version()
    assert not maintain.run_pass([str(tmp_path)], options).ran()  # all clustered now
    assert DeltaTable(str(table)).version() == version
