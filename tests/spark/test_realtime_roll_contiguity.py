"""The brain enforces exactly once for real-time rolls (issue 28, rtm-next2 §1.5): a
roll commits only if it starts where its partition's app transaction ends, an exact
replay commits nothing, anything else is refused; and a roll's files must hold its rows.

No Spark session: ``sink.commitRolls`` is called as the driver's endpoint calls it, with
rolls staged the way the connector's writers stage them. Two cache keys stand for two
endpoints (a restarted query's and its predecessor's committer, still in the brain): each
gets its own kept sink table, as two endpoints' calls do.
"""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.spark.bridge import _realtime
from deltaflow.table._commit import CommitRequest, roll_state, rolls_committed
from deltaflow.table.errors import ConcurrentWriteError

APP = "q"
EPOCH = 3
SCHEMA = {
    "type": "struct",
    "fields": [{"name": "id", "type": "integer", "nullable": True, "metadata": {}}],
}
_rolls = itertools.count()


def at(row: int, epoch: int = EPOCH) -> int:
    return epoch << 32 | row


@pytest.fixture()
def table(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([], pa.int32())}))
    return path


def stage(path: str, start: int, end: int, epoch: int = EPOCH) -> str:
    """A roll of partition 0 with ids ``start``..``end`` as a writer stages it."""
    directory = Path(path) / "_delta_staging" / f"e{epoch}" / f"p0-e{epoch}-a1-n{next(_rolls)}"
    directory.mkdir(parents=True)
    ids = pa.array(range(start, end), pa.int32())
    pq.write_table(pa.table({"id": ids}), directory / f"part-00000-{uuid.uuid4()}.parquet")
    return str(directory)


def commit(
    path: str, key: str, start: int, end: int, *, epoch: int = EPOCH, staged: bool = True
) -> dict[str, Any]:
    """``sink.commitRolls`` of one roll of partition 0, through the endpoint ``key``."""
    directory = stage(path, start, end, epoch) if staged else f"{path}/_delta_staging/gone"
    version = at(end, epoch)
    args = {
        "mode": "append",
        "schema": json.dumps(SCHEMA),
        "options": {"path": path},
        "conf": {},
        "stream": {"queryId": f"{key}/rtm", "batchId": version, "streamQueryId": key},
        "rolls": [
            {
                "directory": directory,
                "appId": f"{APP}/rtm-p0",
                "from": at(start, epoch),
                "version": version,
            }
        ],
    }
    return _realtime.commit_rolls(args)


def ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def logged(path: str) -> int | None:
    return DeltaTable(path).transaction_version(f"{APP}/rtm-p0")


def data_files(path: str) -> set[str]:
    return {p.name for p in Path(path).glob("*.parquet")}


def test_a_second_endpoint_cannot_commit_rows_another_committed(table: str) -> None:
    """Endpoint A (an old run's committer) commits 100-150 after B seeded 100: B's
    100-140 is refused (main committed it: rows 100-140 twice, the txn back to 140)."""
    commit(table, "new", 0, 100)
    commit(table, "old", 100, 150)  # the zombie: contiguous with the log, accepted
    files = data_files(table)
    with pytest.raises(ConcurrentWriteError) as refused:
        commit(table, "new", 100, 140)
    assert refused.value.kind == "ConcurrentTransaction"
    assert data_files(table) == files  # the refused roll's file was deleted
    assert ids(table) == list(range(150))
    assert logged(table) == at(150)
    # The query replays from the log: its next roll starts at 150.
    assert commit(table, "new", 150, 200)["skipped"] is False
    assert ids(table) == list(range(200))
    assert logged(table) == at(200)


def test_the_old_endpoint_cannot_commit_after_the_new_one(table: str) -> None:
    commit(table, "new", 0, 100)
    commit(table, "old", 0, 100)  # the old endpoint's table sees the log at 100 too
    commit(table, "new", 100, 140)
    with pytest.raises(ConcurrentWriteError):
        commit(table, "old", 100, 150)
    assert ids(table) == list(range(140))
    assert logged(table) == at(140)


def test_an_exact_replay_commits_nothing(table: str) -> None:
    commit(table, "new", 0, 100)
    version = DeltaTable(table).version()
    files = data_files(table)
    answer = commit(table, "old", 0, 100)
    assert answer["skipped"] is True
    assert DeltaTable(table).version() == version
    assert data_files(table) == files
    assert ids(table) == list(range(100))


def test_a_roll_whose_directory_is_gone_is_refused(table: str) -> None:
    """Main committed the txn with no rows: a replay would then skip them for good."""
    commit(table, "new", 0, 100)
    version = DeltaTable(table).version()
    with pytest.raises(ConcurrentWriteError) as refused:
        commit(table, "new", 100, 150, staged=False)
    assert refused.value.kind == "ConcurrentTransaction"
    assert DeltaTable(table).version() == version
    assert logged(table) == at(100)


def test_a_roll_short_of_its_rows_is_refused(table: str) -> None:
    commit(table, "new", 0, 100)
    files = data_files(table)
    directory = stage(table, 100, 120)  # 20 rows, announced as 50
    args = {
        "mode": "append",
        "schema": json.dumps(SCHEMA),
        "options": {"path": table},
        "conf": {},
        "stream": {"queryId": "new/rtm", "batchId": at(150), "streamQueryId": "new"},
        "rolls": [
            {"directory": directory, "appId": f"{APP}/rtm-p0", "from": at(100), "version": at(150)}
        ],
    }
    with pytest.raises(ConcurrentWriteError):
        _realtime.commit_rolls(args)
    assert data_files(table) == files  # the short roll's moved file was deleted
    assert logged(table) == at(100)


def test_a_roll_of_a_finished_epoch_is_refused(table: str) -> None:
    commit(table, "new", 0, 100, epoch=EPOCH + 1)
    with pytest.raises(ConcurrentWriteError):
        commit(table, "old", 100, 150)  # epoch EPOCH, the log holding EPOCH + 1
    with pytest.raises(ConcurrentWriteError):
        commit(table, "old", 0, 50)  # even from the epoch's start
    assert logged(table) == at(100, EPOCH + 1)
    assert ids(table) == list(range(100))


def test_an_epoch_starts_over_an_earlier_one(table: str) -> None:
    commit(table, "new", 0, 100, epoch=EPOCH - 1)
    commit(table, "new", 0, 30)
    assert logged(table) == at(30)
    assert len(ids(table)) == 130


def _request(*rolls: tuple[str, int, int]) -> CommitRequest:
    (app, _, end), more = rolls[0], rolls[1:]
    return CommitRequest(
        table_uri="file:///t",
        schema=SCHEMA,
        partition_columns=(),
        adds=(),
        read_version=7,
        app_id=app,
        app_version=end,
        more_transactions=tuple((a, e) for a, _, e in more),
        txn_from=tuple((a, s) for a, s, _ in rolls),
    )


def test_roll_states() -> None:
    assert roll_state(None, at(0), at(10)) == "contiguous"  # the first epoch's start
    assert roll_state(at(99, EPOCH - 1), at(0), at(10)) == "contiguous"  # a new epoch
    assert roll_state(at(10), at(10), at(20)) == "contiguous"
    assert roll_state(at(20), at(10), at(20)) == "replayed"
    assert roll_state(at(0, EPOCH + 1), at(0), at(10)) == "other"  # a finished epoch
    assert roll_state(at(15), at(10), at(20)) == "other"  # an overlap
    assert roll_state(at(25), at(10), at(20)) == "other"  # past the roll
    assert roll_state(at(5), at(10), at(20)) == "other"  # a gap
    assert roll_state(None, at(10), at(20)) == "other"  # rows the log never had
    assert roll_state(at(10, EPOCH - 1), at(10), at(20)) == "other"


def test_a_group_commits_only_when_every_roll_agrees() -> None:
    log = {"a": at(10), "b": at(20)}
    assert rolls_committed(log.get, _request(("a", at(10), at(15)), ("b", at(20), at(30)))) is False
    assert rolls_committed(log.get, _request(("a", at(0), at(10)), ("b", at(5), at(20)))) is True
    assert rolls_committed(log.get, _request(("c", at(0), at(5)))) is False  # a new partition
    for mixed in (
        _request(("a", at(10), at(15)), ("b", at(5), at(20))),  # one new, one replayed
        _request(("a", at(10), at(15)), ("b", at(10), at(30))),  # one overlapping
    ):
        with pytest.raises(ConcurrentWriteError) as refused:
            rolls_committed(log.get, mixed)
        assert refused.value.kind == "ConcurrentTransaction"
        assert refused.value.read_version == 7


def test_delta_rs_refuses_a_commit_whose_app_transaction_advanced_since_its_read(
    table: str,
) -> None:
    """What makes the check atomic on the delta-rs route (object stores Hadoop opens):
    delta-rs retries a lost blind append itself, but not past a winner's ``txn`` of the
    same app id, and deltaflow names that failure ``ConcurrentTransaction``."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction

    from deltaflow.table._commit_conflicts import conflict_kind

    def append(loaded: DeltaTable, name: str, version: int) -> None:
        loaded.create_write_transaction(
            [AddAction(name, 10, {}, 1, True, '{"numRecords":1}')],
            "append",
            loaded.schema(),
            None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(f"{APP}/rtm-p0", version)]
            ),
        )

    stale, winner = DeltaTable(table), DeltaTable(table)
    append(winner, "a.parquet", at(150))
    with pytest.raises(CommitFailedError) as refused:
        append(stale, "b.parquet", at(140))
    assert conflict_kind(str(refused.value)) == "ConcurrentTransaction"
    assert logged(table) == at(150)


def test_the_delta_rs_route_checks_rolls_too(table: str) -> None:
    """``_commit.commit``'s delta-rs route (a ``WRITE``, as on a table Hadoop opens that
    is not local) runs the same check against the caller's kept table."""
    from deltaflow.table import _commit

    def roll(kept: DeltaTable, start: int, end: int) -> _commit.CommitResult:
        name = f"r{start}-{end}-{uuid.uuid4().hex}.parquet"
        add = _commit.AddedFile(name, 10, {}, 1, json.dumps({"numRecords": end - start}))
        return _commit.commit(
            _commit.CommitRequest(
                table_uri=table,
                schema=json.loads(DeltaTable(table).schema().to_json()),
                partition_columns=(),
                adds=[add],
                read_version=kept.version(),
                app_id=f"{APP}/rtm-p0",
                app_version=at(end),
                txn_from=((f"{APP}/rtm-p0", at(start)),),
                table=kept,
            )
        )

    new, old = DeltaTable(table), DeltaTable(table)
    assert not roll(new, 0, 100).skipped
    old.update_incremental()
    assert not roll(old, 100, 150).skipped  # the zombie, contiguous
    new.update_incremental()
    with pytest.raises(ConcurrentWriteError):
        roll(new, 100, 140)  # main: skipped as "150 >= 140", then 140-200 duplicated 140-150
    stale = DeltaTable(table)  # the log at 150
    assert roll(new, 150, 200).version is not None
    with pytest.raises(ConcurrentWriteError):
        roll(stale, 150, 200)  # continuous at its read, but a txn of p0 landed since
    old.update_incremental()
    assert roll(old, 150, 200).skipped  # an exact replay
    assert logged(table) == at(200)


def test_a_group_of_partitions_commits_replays_or_is_refused_whole(table: str) -> None:
    def group(key: str, *rolls: tuple[int, int, int]) -> dict[str, Any]:
        """One commit of rolls ``(partition, start, end)``; ids are ``partition * 1000 + row``."""
        staged = []
        for partition, start, end in rolls:
            directory = stage(table, partition * 1000 + start, partition * 1000 + end)
            staged.append(
                {
                    "directory": directory,
                    "appId": f"{APP}/rtm-p{partition}",
                    "from": at(start),
                    "version": at(end),
                }
            )
        return _realtime.commit_rolls(
            {
                "mode": "append",
                "schema": json.dumps(SCHEMA),
                "options": {"path": table},
                "conf": {},
                "stream": {"queryId": f"{key}/rtm", "batchId": at(0), "streamQueryId": key},
                "rolls": staged,
            }
        )

    assert group("new", (0, 0, 10), (1, 0, 20))["skipped"] is False
    assert group("old", (0, 0, 10), (1, 0, 20))["skipped"] is True
    files = data_files(table)
    with pytest.raises(ConcurrentWriteError):
        group("old", (0, 0, 10), (1, 20, 30))  # p0 replayed, p1 new: neither
    assert data_files(table) == files
    assert group("new", (0, 10, 15), (1, 20, 30))["skipped"] is False
    assert ids(table) == [*range(15), *range(1000, 1030)]
    table_now = DeltaTable(table)
    assert table_now.transaction_version(f"{APP}/rtm-p0") == at(15)
    assert table_now.transaction_version(f"{APP}/rtm-p1") == at(30)
