"""What a durable log entry costs on this disk (rtm-next M2): p50/p99 in microseconds.

1,000 x (1 KB write + fsync + hard link), as ``deltaflow._atomic.put_if_absent`` does,
without and with the directory fsync after the link, and with fdatasync.

``--brain-commits`` (rtm-next2 M3): the brain's real-time commit (``sink.commitRolls``,
the entry the JVM endpoint calls, one staged one-row roll each) on a local table whose log
already holds each given number of versions (hand-written commits and one checkpoint at
the end, as a long-running stream leaves the directory); prints the brain's per-epoch
timing line (logger ``deltaflow.realtime.commits``) per log length. Run it with each
tree's sources first on ``PYTHONPATH`` to compare two trees.

Usage: python bench/bench_fsync.py [directory] [count]
       python bench/bench_fsync.py --brain-commits [versions,...] [count] [directory]
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid


def run(folder: str, count: int, sync: str, dir_fsync: bool) -> list[float]:
    payload = os.urandom(1024)
    times = []
    for i in range(count):
        started = time.perf_counter()
        temp = os.path.join(folder, f".{i:020d}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, payload)
        (os.fdatasync if sync == "fdatasync" else os.fsync)(fd)
        os.close(fd)
        os.link(temp, os.path.join(folder, f"{i:020d}.json"))
        os.unlink(temp)
        if dir_fsync:
            dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
        times.append((time.perf_counter() - started) * 1e6)
    return times


def grow_log(path: str, versions: int) -> None:
    """A local table with ``versions`` commits: version 0 by delta-rs, the rest written by
    hand (a commitInfo and another writer's app transaction each, no files), then one
    checkpoint at the newest version."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(path, pa.table({"id": pa.array([], pa.int32())}))
    log_dir = os.path.join(path, "_delta_log")
    now = int(time.time() * 1000)
    for v in range(1, versions):
        info = {"timestamp": now, "operation": "STREAMING UPDATE", "operationParameters": {}}
        txn = {"appId": "other", "version": v, "lastUpdated": now}
        with open(os.path.join(log_dir, f"{v:020d}.json"), "w") as f:
            f.write(json.dumps({"commitInfo": info}) + "\n" + json.dumps({"txn": txn}) + "\n")
    if versions > 1:
        DeltaTable(path).create_checkpoint()


def brain_commits(versions: int, count: int, root: str | None) -> str:
    """``count`` brain commits on a log of ``versions``: the brain's timing line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from deltaflow.spark.bridge import _realtime
    from deltaflow.table import _auto_compact, _log_upkeep

    _log_upkeep.run_in_background(True)  # as in the brain: checkpoints off the commit path
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    _realtime.timing_log.addHandler(Keep())
    _realtime.timing_log.setLevel(logging.INFO)
    schema = {"type": "struct", "fields": [{"name": "id", "type": "integer", "nullable": True}]}
    query = f"bench-{versions}"
    with tempfile.TemporaryDirectory(dir=root) as folder:
        path = os.path.join(folder, "t")
        grow_log(path, versions)
        for n in range(count):
            roll = os.path.join(path, "_delta_staging", "e1", f"p0-e1-a1-n{n}")
            os.makedirs(roll)
            ids = pa.table({"id": pa.array([n], pa.int32())})
            pq.write_table(ids, os.path.join(roll, f"part-00000-{uuid.uuid4()}.parquet"))
            _realtime.commit_rolls(
                {
                    "mode": "append",
                    "schema": json.dumps(schema),
                    "options": {"path": path},
                    "conf": {},
                    "stream": {"queryId": f"{query}/rtm", "batchId": 0, "streamQueryId": query},
                    "rolls": [
                        {
                            "directory": roll,
                            "appId": f"{query}/rtm-p0",
                            "from": 1 << 32 | n,
                            "version": 1 << 32 | (n + 1),
                        }
                    ],
                }
            )
        _realtime.flush_timings()
        _log_upkeep.flush(120)
        _auto_compact.wait_for_background(120)
    return lines[-1] if lines else "(no timing line)"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--brain-commits":
        sizes = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1,10000").split(",")]
        count = int(sys.argv[3]) if len(sys.argv) > 3 else 200
        root = sys.argv[4] if len(sys.argv) > 4 else None
        for versions in sizes:
            line = brain_commits(versions, count, root)
            print(f"log of {versions} versions, load {os.getloadavg()[0]:.2f}: {line}")
        return
    root = sys.argv[1] if len(sys.argv) > 1 else None
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(f"load {os.getloadavg()[0]:.2f}, {count} entries of 1 KB")
    for sync, dir_fsync in (("fsync", False), ("fsync", True), ("fdatasync", True)):
        with tempfile.TemporaryDirectory(dir=root) as folder:
            q = statistics.quantiles(run(folder, count, sync, dir_fsync), n=100)
            label = f"{sync} + link{' + dir fsync' if dir_fsync else ''}"
            print(f"{label:30s} p50 {q[49]:8.0f} us  p99 {q[98]:8.0f} us")


if __name__ == "__main__":
    main()
