"""Which deletion vector files a table still references (VACUUM's keep list), read from
JSON commits and from a checkpoint alike."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from deltaflow.table import _dv_references
from deltaflow.table._uri import normalize_uri
from tests.table.dv_fixtures import add_deletion_vectors


def _dv_files(root: Path) -> set[Path]:
    return set(root.rglob("deletion_vector_*.bin"))


def _keys(paths: set[Path]) -> set[str]:
    return {_dv_references.file_key(normalize_uri(str(p))) for p in paths}


def test_live_and_recently_removed_vectors_are_referenced_from_commits_and_checkpoints(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t")
    for part in range(2):
        write_deltalake(path, pa.table({"id": [part * 10 + i for i in range(5)]}), mode="append")
    first, second = sorted(u.rsplit("/", 1)[-1] for u in DeltaTable(path).file_uris())
    add_deletion_vectors(path, {first: [1]}, prefix="ab")
    replaced = _dv_files(tmp_path)
    add_deletion_vectors(path, {first: [2]})  # replaces the first file's vector
    live = _dv_files(tmp_path) - replaced
    add_deletion_vectors(path, {second: [0]}, inline=True)  # in the log: no file
    assert len(replaced) == len(live) == 1
    assert any(p.parent.name == "ab" for p in replaced)
    later = int(time.time() * 1000) + 3_600_000

    def check() -> None:
        # Inside the retention, the tombstone keeps the replaced vector; past it, only
        # the live one is referenced.
        assert _dv_references.referenced_files(path, 0) == _keys(replaced | live)
        assert _dv_references.referenced_files(path, later) == _keys(live)

    check()
    DeltaTable(path).create_checkpoint()
    for commit in (tmp_path / "t" / "_delta_log").glob("*.json"):
        commit.unlink()  # the checkpoint alone must tell the same
    check()
