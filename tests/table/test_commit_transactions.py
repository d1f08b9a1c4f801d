"""Several app transactions in one commit (``CommitRequest.more_transactions``, the
real-time sink's one commit per interval across partitions): each recorded, a replay of
all of them skipped, a commit with only some recorded refused as a conflict. Through
delta-rs (``WRITE``) and deltaflow's log writer (``STREAMING UPDATE``)."""

from __future__ import annotations

import json
import os

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltaflow.table import _commit, _uri
from deltaflow.table.errors import ConcurrentWriteError


@pytest.mark.parametrize("operation", ["WRITE", "STREAMING UPDATE"])
def test_several_app_transactions_in_one_commit(table_path, operation) -> None:
    path = table_path()
    deltalake.write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    uri = _uri.normalize_uri(path)

    def added(value: int) -> _commit.AddedFile:
        name = f"part-{value}.parquet"
        pq.write_table(pa.table({"id": pa.array([value], pa.int64())}), os.path.join(path, name))
        stats = {"numRecords": 1, "minValues": {"id": value}, "maxValues": {"id": value}}
        return _commit.AddedFile(
            name, os.path.getsize(os.path.join(path, name)), {}, 0, json.dumps(stats)
        )

    def commit(value: int, txns: list[tuple[str, int]]) -> _commit.CommitResult:
        table = deltalake.DeltaTable(path)
        return _commit.commit(
            _commit.CommitRequest(
                table_uri=uri,
                schema=json.loads(table.schema().to_json()),
                partition_columns=(),
                adds=[added(value)],
                read_version=table.version(),
                app_id=txns[0][0],
                app_version=txns[0][1],
                more_transactions=tuple(txns[1:]),
                operation=operation,
            )
        )

    first = commit(1, [("q/rtm-p0", 5), ("q/rtm-p1", 7)])
    assert not first.skipped
    table = deltalake.DeltaTable(path)
    assert table.transaction_version("q/rtm-p0") == 5
    assert table.transaction_version("q/rtm-p1") == 7
    assert commit(2, [("q/rtm-p0", 5), ("q/rtm-p1", 7)]).skipped  # a replay of both
    with pytest.raises(ConcurrentWriteError) as raised:
        commit(3, [("q/rtm-p0", 5), ("q/rtm-p1", 9)])  # one recorded, one not
    assert raised.value.kind == "ConcurrentTransaction"
    ids = sorted(deltalake.DeltaTable(path).to_pyarrow_table().column("id").to_pylist())
    assert ids == [0, 1]
