"""The log writer takes a version without listing ``_delta_log`` (issue 28, rtm-next §2.1).

A commit first tries ``read_version + 1`` by put-if-absent; on a lost race it reads the
versions written since by name and checks each for conflicts. The "other writers" here
are real ones: delta-rs appends, property changes and app transactions, and a second
log-writer commit.
"""

from __future__ import annotations

import json
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltaflow.table import _commit, _log_commit, _uri
from deltaflow.table.errors import ConcurrentWriteError

APP = "rtm-query/rtm-p0"


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def _add(path: str, ids: list[int]) -> dict[str, object]:
    name = f"part-{uuid.uuid4()}.parquet"
    pq.write_table(_rows(ids), os.path.join(path, name))
    return {
        "path": name,
        "size": os.path.getsize(os.path.join(path, name)),
        "partitionValues": {},
        "modificationTime": 0,
        "dataChange": True,
        "stats": f'{{"numRecords":{len(ids)}}}',
    }


def _append(path: str, ids: list[int], read_version: int, **more: object) -> int:
    """Our blind append (a real-time sink's commit) of ``ids`` read at ``read_version``."""
    interval = int(str(more.pop("checkpoint_interval", 1000)))
    request = _log_commit.LogCommitRequest(
        table_uri=_uri.normalize_uri(path),
        read_version=read_version,
        operation="STREAMING UPDATE",
        operation_parameters={"outputMode": "Append"},
        adds=[_add(path, ids)],
        app_id=APP,
        app_version=read_version + 1,
        read=_log_commit.ReadSet(blind_append=True),
        partitioned=False,
        checkpoint_interval=interval,
        **more,  # type: ignore[arg-type]
    )
    return _log_commit.commit(request)


@pytest.fixture
def table(tmp_path) -> str:
    path = str(tmp_path / "t")
    write_deltalake(path, _rows([0]))
    return path


@pytest.fixture
def no_listing(monkeypatch):
    """Listing the log raises: a commit that lists fails the test."""

    def refuse(log_dir: str) -> list[str]:
        raise AssertionError(f"the commit listed {log_dir}")

    monkeypatch.setattr(_log_commit, "_list_names", refuse)


def _ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def test_a_commit_takes_the_next_version_without_listing(table, no_listing) -> None:
    assert _append(table, [1], read_version=0) == 1
    assert _append(table, [2], read_version=1) == 2
    assert _ids(table) == [0, 1, 2]


def test_a_collision_retries_at_the_next_version_after_checking_the_winner(
    table, no_listing
) -> None:
    write_deltalake(table, _rows([10]), mode="append")  # another writer takes version 1
    assert _append(table, [1], read_version=0) == 2
    assert _ids(table) == [0, 1, 10]
    # The winner was checked: a winner that conflicts fails the commit, nothing written.
    DeltaTable(table).alter.set_table_properties({"delta.appendOnly": "false"})  # version 3
    with pytest.raises(ConcurrentWriteError) as raised:
        _append(table, [2], read_version=2)
    assert raised.value.kind == "MetadataChanged"
    assert "version 3" in str(raised.value)
    assert not os.path.exists(os.path.join(table, "_delta_log", f"{4:020d}.json"))


@pytest.mark.parametrize("conflicting", [1, 2, 3])
def test_every_version_another_writer_wrote_in_between_is_checked(
    table, no_listing, conflicting
) -> None:
    """Versions 1-3 come from delta-rs; the one that records our app transaction (at any
    position) is found, so none of them is skipped."""
    for version in (1, 2, 3):
        properties = None
        if version == conflicting:
            properties = CommitProperties(app_transactions=[Transaction(APP, 99)])
        write_deltalake(table, _rows([version * 10]), mode="append", commit_properties=properties)
    with pytest.raises(ConcurrentWriteError) as raised:
        _append(table, [1], read_version=0)
    assert raised.value.kind == "ConcurrentTransaction"
    assert f"version {conflicting}" in str(raised.value)
    assert DeltaTable(table).version() == 3


def test_versions_in_between_that_do_not_conflict_are_passed(table, no_listing) -> None:
    for ids in ([10], [20], [30]):
        write_deltalake(table, _rows(ids), mode="append")
    assert _append(table, [1], read_version=0) == 4
    assert _ids(table) == [0, 1, 10, 20, 30]


def test_own_versions_in_between_are_not_conflicts(table, no_listing) -> None:
    """A transaction that changed the schema first (its own version 1) then commits."""
    DeltaTable(table).alter.set_table_properties({"delta.appendOnly": "false"})
    assert _append(table, [1], read_version=0, own_versions=frozenset({1})) == 2


def test_a_streaming_commit_through_the_commit_entry_point_does_not_list(table, no_listing) -> None:
    """The whole route a real-time sink's commit takes (``_commit.commit`` with the table
    the sink keeps), upkeep included, 12 commits: a checkpoint at 10, and no listing."""
    kept = DeltaTable(table)
    schema = json.loads(kept.schema().to_json())
    for n in range(1, 13):
        add = _add(table, [n])
        request = _commit.CommitRequest(
            table_uri=_uri.normalize_uri(table),
            schema=schema,
            partition_columns=(),
            adds=[
                _commit.AddedFile(
                    str(add["path"]), int(str(add["size"])), {}, 0, str(add["stats"]), True
                )
            ],
            read_version=kept.version(),
            app_id=APP,
            app_version=n,
            operation="STREAMING UPDATE",
            commit_info={"operationParameters": {"outputMode": "Append"}},
            table=kept,
        )
        assert _commit.commit(request).version == n
    assert _ids(table) == list(range(13))
    assert os.path.exists(os.path.join(table, "_delta_log", f"{10:020d}.checkpoint.parquet"))
