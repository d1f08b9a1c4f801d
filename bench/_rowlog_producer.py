"""The row-log variant's event source, in its own process (as the Kafka anchor's is):
``<table path> <rate> <app id>`` appends events ``0, 1, ...`` at ``rate`` per second to the
table's row log (``docs/notes/rowlog.md``), one synced frame per 1 ms tick, each row's
``ts`` the wall-clock moment (ns) the event was due on the rate's schedule, and prints
``SENT <n>`` every 50 ms. Every second it commits the rows logged since its last commit
to the Delta table, as a Parquet file tagged with their log positions and the app
transaction ``<app id>/rtm-p0`` (what a real-time sink with ``realTimeRowLog`` does). When
stdin closes it commits what is left, prints the last count and exits."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow.table import _rowlog
from deltaflow.table._commit import AddedFile, CommitRequest, commit
from deltaflow.table._log_commit import ReadSet
from deltaflow.table._snapshot import open_latest

TICK_S = 0.001
REPORT_S = 0.05
COMMIT_S = 1.0
SCHEMA = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("ts", pa.int64())])


class Materializer:
    """Commits logged rows to the table, tagged with their positions (epoch 0, partition 0)."""

    def __init__(self, path: str, app_id: str) -> None:
        self.path = path
        self.app_id = app_id
        self.writer = _rowlog.encode_writer(app_id)
        self.pending: list[pa.RecordBatch] = []
        self.committed = 0  # rows of epoch 0 the table holds
        self.lock = threading.Lock()
        table = open_latest("file://" + path)
        self.version = table.version()
        self.schema = json.loads(table.schema().to_json())

    def add(self, batch: pa.RecordBatch) -> None:
        with self.lock:
            self.pending.append(batch)

    def commit(self) -> None:
        with self.lock:
            batches, self.pending = self.pending, []
        if not batches:
            return
        data = pa.Table.from_batches(batches, SCHEMA)
        start, end = self.committed, self.committed + data.num_rows
        name = f"part-{uuid.uuid4().hex}.parquet"
        pq.write_table(data, os.path.join(self.path, name))
        ids = data.column("id")
        stats = (
            f'{{"numRecords":{data.num_rows},"minValues":{{"id":{pa.compute.min(ids)}}},'
            f'"maxValues":{{"id":{pa.compute.max(ids)}}},"nullCount":{{"id":0}}}}'
        )
        added = AddedFile(
            name,
            os.path.getsize(os.path.join(self.path, name)),
            {},
            int(time.time() * 1000),
            stats,
            tags={_rowlog.TAG: _rowlog.tag(self.writer, 0, 0, start, end)},
        )
        result = commit(
            CommitRequest(
                table_uri="file://" + self.path,
                schema=self.schema,
                partition_columns=(),
                adds=[added],
                read_version=self.version,
                app_id=f"{self.app_id}/rtm-p0",
                app_version=end,  # epoch 0: 0 << 32 | rows
                read=ReadSet(blind_append=True),
                operation="STREAMING UPDATE",
            )
        )
        self.version = result.version
        self.committed = end


def main(path: str, rate: int, app_id: str) -> None:
    materializer = Materializer(path, app_id)
    log = _rowlog.SegmentWriter(
        _rowlog.partition_dir(path, materializer.writer, 0), 0, 0, fsync=True
    )
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    def commit_every_second() -> None:
        while not stop.wait(COMMIT_S):
            materializer.commit()

    committer = threading.Thread(target=commit_every_second, daemon=True)
    committer.start()
    started, wall = time.monotonic(), time.time()
    reported, sent = started, 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        if due > sent:
            ids = range(sent, due)
            batch = pa.record_batch(
                [
                    pa.array(ids, pa.int64()),
                    pa.array(["click"] * len(ids)),
                    # When each event was due, not when it was logged: a writer held back
                    # shows as latency, as for the Kafka anchor's producer.
                    pa.array([int((wall + i / rate) * 1e9) for i in ids], pa.int64()),
                ],
                schema=SCHEMA,
            )
            log.append(batch)
            materializer.add(batch)
            sent = due
        if time.monotonic() - reported >= REPORT_S:
            print(f"SENT {sent}", flush=True)
            reported = time.monotonic()
        stop.wait(TICK_S)
    committer.join(30)
    materializer.commit()
    log.close()
    print(f"SENT {sent}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
