"""A stream sink's commit on delta-rs vs deltaflow's log writer, interleaved in one run.

Since issue 12 part 5 a micro-batch commit to a local table is named ``STREAMING UPDATE``,
which delta-rs cannot record, so deltaflow's log writer writes it. This times that
commit against delta-rs's (operation ``WRITE``) for a one-file append with an app
transaction, both on the sink's open delta-rs table (as the connector's sink keeps it),
alternating on the same table (60 versions to start). No Spark: the commit step alone.

Reported: p50 / p90 milliseconds per route over ``--commits`` commits each, and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from deltaflow.table import _commit


def _added(path: str) -> _commit.AddedFile:
    name = f"part-{uuid.uuid4()}.parquet"
    pq.write_table(pa.table({"x": pa.array([1], pa.int64())}), os.path.join(path, name))
    stats = {"numRecords": 1, "minValues": {"x": 1}, "maxValues": {"x": 1}, "nullCount": {"x": 0}}
    size = os.path.getsize(os.path.join(path, name))
    return _commit.AddedFile(name, size, {}, int(time.time() * 1000), json.dumps(stats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=40)
    commits = parser.parse_args().commits
    path = os.path.join(tempfile.mkdtemp(), "t")
    write_deltalake(path, pa.table({"x": pa.array([0], pa.int64())}))
    for i in range(59):
        write_deltalake(path, pa.table({"x": pa.array([i], pa.int64())}), mode="append")
    schema = json.loads(DeltaTable(path).schema().to_json())
    table = DeltaTable(path)
    times: dict[str, list[float]] = {"WRITE": [], "STREAMING UPDATE": []}
    for i in range(commits):
        order = list(times) if i % 2 == 0 else list(reversed(times))
        for operation in order:
            table.update_incremental()
            request = _commit.CommitRequest(
                table_uri="file://" + path,
                schema=schema,
                partition_columns=(),
                adds=[_added(path)],
                read_version=table.version(),
                app_id="query-" + operation,
                app_version=i,
                operation=operation,
                table=table,
                commit_info={"operationParameters": {"outputMode": "Append", "epochId": str(i)}},
            )
            started = time.perf_counter()
            _commit.commit(request)
            times[operation].append((time.perf_counter() - started) * 1000)
    print(f"load average {os.getloadavg()[0]:.1f}, {commits} commits per route")
    for operation, values in times.items():
        route = "delta-rs" if operation == "WRITE" else "log writer"
        p90 = sorted(values)[int(len(values) * 0.9)]
        print(
            f"{route:10s} ({operation}): p50 {statistics.median(values):.1f} ms, p90 {p90:.1f} ms"
        )


if __name__ == "__main__":
    main()
