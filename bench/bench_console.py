"""The console's API latency on a root with 100 tables and a table with 10,000 versions.

Issue 16's bar: every API call answers in under 300 ms there. A real console server
(``ConsoleServer`` on 127.0.0.1, in this process) is asked over HTTP:

* **cold** (the server's background warm-up off): the first history page of the
  10,000-version table, the first page from its middle, and the first ``/api/tables``
  (opens every table: what the warm-up does before anyone asks);
* **warm, idle**: each endpoint ``--reps`` x 20 times in a row, p50 / p99 in ms;
* **warm, loaded**: the same while 4 client threads poll ``/api/tables`` and the big
  table's history as fast as they can and a writer commits to the big table every 250 ms
  (so the caches keep moving, as under a running stream).

The 10,000 versions are written as delta-spark ``STREAMING UPDATE`` commits (an app
transaction and one added file each) straight into the log, with one delta-rs
checkpoint at the end, as a long-running stream leaves them; the 100 small tables are
written by delta-rs (3 commits each). Data is cached in bench/.data/console.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from _common import DATA_DIR, loadavg, parse_args, save_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

ROOT = DATA_DIR / "console"
TABLES = 100
VERSIONS = 10_000


def build_root() -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    marker = ROOT / ".complete"
    if marker.exists():
        return
    for i in range(TABLES):
        path = str(ROOT / "many" / f"t{i:03d}")
        for j in range(3):
            data = pa.table({"id": list(range(j * 100, j * 100 + 100)), "v": [float(i)] * 100})
            write_deltalake(path, data, mode="append")
    big = ROOT / "big"
    write_deltalake(str(big), pa.table({"id": list(range(100)), "v": [0.0] * 100}))
    seed = next(big.glob("*.parquet"))
    query = str(uuid.uuid4())
    for version in range(1, VERSIONS):
        append_commit(big, seed, version, query)
    DeltaTable(str(big)).create_checkpoint()
    marker.write_text("ok")


def append_commit(table: Path, seed: Path, version: int, query: str) -> None:
    """One streaming micro-batch's commit: a hard link of ``seed`` as its new data file."""
    name = f"part-{version:05d}-{uuid.uuid4()}.parquet"
    os.link(seed, table / name)
    now = int(time.time() * 1000)
    actions = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "STREAMING UPDATE",
                "operationParameters": {
                    "outputMode": "Append",
                    "queryId": query,
                    "epochId": str(version),
                },
                "operationMetrics": {
                    "numAddedFiles": "1",
                    "numOutputRows": "100",
                    "numOutputBytes": str(seed.stat().st_size),
                },
                "isBlindAppend": True,
            }
        },
        {"txn": {"appId": query, "version": version, "lastUpdated": now}},
        {
            "add": {
                "path": name,
                "partitionValues": {},
                "size": seed.stat().st_size,
                "modificationTime": now,
                "dataChange": True,
                "stats": json.dumps({"numRecords": 100}),
            }
        },
    ]
    log = table / "_delta_log"
    tmp = log / f".{version:020d}.json.tmp"
    tmp.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    os.link(tmp, log / f"{version:020d}.json")  # fails if the version exists, like a commit
    tmp.unlink()


def get_ms(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
        assert response.status == 200
    return (time.perf_counter() - started) * 1000


def measure(base: str, paths: dict[str, str], n: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, path in paths.items():
        times = sorted(get_ms(base + path) for _ in range(n))
        out[name] = {
            "p50_ms": round(statistics.median(times), 2),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 2),
            "max_ms": round(times[-1], 2),
        }
    return out


def main() -> None:
    args = parse_args(__doc__ or "")
    from deltaflow.console import ConsoleConfig, ConsoleServer

    t0 = time.perf_counter()
    build_root()
    print(f"data ready in {time.perf_counter() - t0:.1f} s; load {loadavg()}")
    # Not warmed at start (the default warms every table in the background): the first
    # calls below show what the warm-up saves.
    server = ConsoleServer(ConsoleConfig.build([str(ROOT)], port=0), warm=False).start()
    base = server.url.rstrip("/")
    try:
        cold = {
            "big_history_first_ms": round(get_ms(base + "/api/table/history?id=big"), 1),
            "big_page_v5000_first_ms": round(
                get_ms(base + "/api/table/history?id=big&before=5000&limit=200"), 1
            ),
            "tables_first_ms": round(get_ms(base + "/api/tables"), 1),
        }
        latest = json.loads(
            urllib.request.urlopen(base + "/api/table/history?id=big&limit=1").read()
        )["latest"]
        paths = {
            "tables (101)": "/api/tables",
            "table big": "/api/table?id=big",
            "history big, newest 200": "/api/table/history?id=big",
            "history big, since latest-1": f"/api/table/history?id=big&since={latest - 1}",
            "history big, page at v5000": "/api/table/history?id=big&before=5000&limit=200",
            "files big": "/api/table/files?id=big",
            "streams": "/api/streams",
            "preview small": "/api/table/preview?id=many/t000&limit=20",
        }
        n = args.reps * 20
        load_idle = loadavg()
        idle = measure(base, paths, n)
        stop = threading.Event()
        seed = next((ROOT / "big").glob("*.parquet"))
        query = str(uuid.uuid4())

        def poll(path: str) -> None:
            while not stop.is_set():
                get_ms(base + path)

        def write() -> None:
            version = latest + 1
            while not stop.wait(0.25):
                append_commit(ROOT / "big", seed, version, query)
                version += 1

        threads = [threading.Thread(target=write)]
        threads += [
            threading.Thread(target=poll, args=(p,))
            for p in ("/api/tables", "/api/table/history?id=big") * 2
        ]
        for thread in threads:
            thread.start()
        load_busy = loadavg()
        busy = measure(base, paths, n)
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        server.close()
    print(f"cold: {cold}")
    print(f"{'endpoint':32} {'idle p50':>9} {'p99':>8} {'loaded p50':>11} {'p99':>8}  (ms)")
    for name in paths:
        print(
            f"{name:32} {idle[name]['p50_ms']:9.2f} {idle[name]['p99_ms']:8.2f}"
            f" {busy[name]['p50_ms']:11.2f} {busy[name]['p99_ms']:8.2f}"
        )
    print(f"load: idle {load_idle}; loaded {load_busy}; requests per endpoint {n}")
    save_result(
        "console",
        {
            "cold": cold,
            "idle": idle,
            "loaded": busy,
            "requests": n,
            "load_idle": load_idle,
            "load_loaded": load_busy,
        },
    )


if __name__ == "__main__":
    main()
