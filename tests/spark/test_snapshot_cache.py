"""The brain's snapshot cache (``spark/bridge/_snapshots.py``) on local tables, in this
process (the bridge's operations are plain functions; no Spark needed). Its request counts
on S3 are in ``tests/table/test_log_requests_s3.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
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
