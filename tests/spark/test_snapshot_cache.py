"""The brain's snapshot cache (``spark/bridge/_snapshots.py``) on local tables, in this
process (the bridge's operations are plain functions; no Spark needed). Its request counts
on S3 are in ``tests/table/test_log_requests_s3.py``."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import write_deltalake

from deltaflow.spark.bridge import _server, _snapshots
from deltaflow.table import _uri


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_snapshots, "TTL_SECONDS", 600.0)
    _snapshots.forget()
    yield
    _snapshots.forget()


def make(path: Path, ids: list[int]) -> str:
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64())}), mode="append")
    return _uri.normalize_uri(str(path))


def test_an_unchanged_table_is_loaded_once(tmp_path):
    uri = make(tmp_path / "t", [1])
    first = _snapshots.snapshot(uri)
    assert _snapshots.snapshot(uri) is first
    assert _snapshots.snapshot(uri, version=0) is first  # the latest is that version


def test_a_new_commit_is_seen_by_name(tmp_path):
    uri = make(tmp_path / "t", [1])
    first = _snapshots.snapshot(uri)
    make(tmp_path / "t", [2])
    second = _snapshots.snapshot(uri)
    assert (first.version, second.version) == (0, 1)
    assert sorted(f.num_records or 0 for f in second.files()) == [1, 1]
    assert len(first.files()) == 1  # a snapshot handed out stays as it was


def test_time_travel_entries_are_kept_per_version(tmp_path):
    uri = make(tmp_path / "t", [1])
    make(tmp_path / "t", [2])
    old = _snapshots.snapshot(uri, version=0)
    assert _snapshots.snapshot(uri, version=0) is old
    assert _snapshots.snapshot(uri).version == 1


def test_an_entry_past_its_ttl_is_loaded_anew(tmp_path, monkeypatch):
    uri = make(tmp_path / "t", [1])
    first = _snapshots.snapshot(uri)
    monkeypatch.setattr(_snapshots, "TTL_SECONDS", 0.0)
    assert _snapshots.snapshot(uri) is not first


def test_a_committing_operation_drops_its_tables_entries(tmp_path):
    uri = make(tmp_path / "t", [1])
    other = make(tmp_path / "u", [1])
    first, kept = _snapshots.snapshot(uri), _snapshots.snapshot(other)
    answer = _server.answer(
        {"id": 1, "op": "sql.vacuum", "args": {"uri": uri, "dryRun": True, "retentionHours": 168}}
    )
    assert "error" not in answer, answer
    assert _snapshots.snapshot(uri) is not first
    assert _snapshots.snapshot(other) is kept


def test_the_cache_is_bounded_by_entries_and_files(tmp_path, monkeypatch):
    uris = [make(tmp_path / f"t{n}", [n]) for n in range(3)]
    monkeypatch.setattr(_snapshots, "ENTRIES_KEPT", 2)
    loaded = [_snapshots.snapshot(u) for u in uris]
    assert _snapshots.snapshot(uris[2]) is loaded[2]
    assert _snapshots.snapshot(uris[0]) is not loaded[0]  # the least recently used went
    monkeypatch.setattr(_snapshots, "FILES_KEPT", 0)  # a table with files is never kept
    first = _snapshots.snapshot(uris[1])
    assert _snapshots.snapshot(uris[1]) is not first


# ---- a table made again at the same path (issue 29 follow-up) --------------------------


def remake(path: Path, commits: list[list[int]]) -> str:
    """The table at ``path`` dropped (its folder removed) and written again, one commit
    per list of ids: the new log is no longer than the old one."""
    shutil.rmtree(path)
    uri = ""
    for ids in commits:
        uri = make(path, ids)
    return uri


def test_a_table_made_again_with_as_many_versions_is_loaded_anew(tmp_path):
    uri = make(tmp_path / "t", [1])
    make(tmp_path / "t", [2])
    assert _snapshots.snapshot(uri).version == 1
    remake(tmp_path / "t", [[7], [8]])  # version 1 again, and no version 2: the probe passes
    fresh = _snapshots.snapshot(uri)
    assert fresh.version == 1
    assert sorted(ids_of(fresh)) == [7, 8]


def test_a_table_made_again_with_fewer_versions_is_loaded_anew(tmp_path):
    uri = make(tmp_path / "t", [1])
    make(tmp_path / "t", [2])
    make(tmp_path / "t", [3])
    assert _snapshots.snapshot(uri).version == 2
    remake(tmp_path / "t", [[9]])
    fresh = _snapshots.snapshot(uri)
    assert (fresh.version, ids_of(fresh)) == (0, [9])
    # The old table's entry went with it: the new one is now the cached one.
    assert _snapshots.snapshot(uri) is fresh


def test_time_travel_into_a_table_made_again_reads_the_new_table(tmp_path):
    uri = make(tmp_path / "t", [1])
    make(tmp_path / "t", [2])
    old = _snapshots.snapshot(uri, version=0)
    assert ids_of(old) == [1]
    remake(tmp_path / "t", [[5], [6]])
    assert ids_of(_snapshots.snapshot(uri, version=0)) == [5]
    assert sorted(ids_of(_snapshots.snapshot(uri, version=1))) == [5, 6]


def test_a_commit_file_rewritten_in_place_is_a_new_table(tmp_path):
    """Same inode, new content (a copy over the old log, as ``cp -r`` does): its size or
    modification time differ."""
    uri = make(tmp_path / "t", [1])
    first = _snapshots.snapshot(uri)
    commit = tmp_path / "t" / "_delta_log" / f"{0:020d}.json"
    make(tmp_path / "u", [2, 3])
    text = (tmp_path / "u" / "_delta_log" / f"{0:020d}.json").read_text()
    for part in (tmp_path / "u").glob("*.parquet"):
        shutil.copy(part, tmp_path / "t")
    with commit.open("w") as out:  # truncates: the same file (inode) as before
        out.write(text)
    again = _snapshots.snapshot(uri)
    assert again is not first
    assert sorted(ids_of(again)) == [2, 3]


def test_an_unchanged_local_table_costs_one_stat_more_per_hit(tmp_path, monkeypatch):
    """A hit stats the cached version's commit (the mark) and the next version's name (the
    probe, ``os.path.exists``); nothing else touches the log."""
    uri = make(tmp_path / "t", [1])
    first = _snapshots.snapshot(uri)
    stats: list[str] = []
    real_stat = os.stat

    def counted_stat(path, *args, **kwargs):
        stats.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(_snapshots.os, "stat", counted_stat)
    assert _snapshots.snapshot(uri) is first
    assert [Path(p).name for p in stats] == [f"{0:020d}.json", f"{1:020d}.json"]


def ids_of(snapshot: _snapshots.Snapshot) -> list[int]:
    paths = [_uri.local_path(_uri.join(snapshot.uri, unquote(f.path))) for f in snapshot.files()]
    return sorted(ds.dataset(paths, format="parquet").to_table()["id"].to_pylist())


def test_a_request_naming_stale_snapshots_drops_them_before_it_is_answered(tmp_path):
    """What the connector sends after a scan failed on a missing file (``MissingFiles``):
    the table's entries go before the request that carries it is planned."""
    uri = make(tmp_path / "t", [1])
    other = make(tmp_path / "u", [1])
    first, kept = _snapshots.snapshot(uri), _snapshots.snapshot(other)
    request = {"id": 1, "op": "scan.plan", "args": {"uri": uri}, "staleSnapshots": [uri]}
    out = io.StringIO()
    _server.serve(io.StringIO(json.dumps(request) + "\n"), out)
    answer = json.loads(out.getvalue())
    assert "error" not in answer, answer
    assert _snapshots.snapshot(uri) is not first  # scan.plan loaded it anew
    assert _snapshots.snapshot(other) is kept
