"""One-row SQL statements on a 10k-row Delta table from two hosts: a classic PySpark
session and a Spark Connect client.

Since issue 26, UPDATE / DELETE / MERGE INTO run in deltaflow's brain, in the
statement's own session (lent to the brain through a Py4J gateway), on every host. This
times what a user waits for, per statement, from

* ``classic``: ``deltaflow.session()`` (local[2]) and ``spark.sql(...)``;
* ``connect``: a Spark Connect server started from the wheel with ``spark_conf()``
  (local[2], ``spark.driver.memory=2g``), and a client in another process,
  ``deltaflow.session(remote=...)``, sending the same SQL.

Each host runs in a child process of its own, on a fresh copy of the table (10k rows, 2
files, 4 columns, written by delta-rs): one-row ``INSERT``, ``UPDATE ... WHERE id = k``,
``DELETE ... WHERE id = k`` and a ``MERGE`` of one update and one insert (a ``VALUES``
source), order rotated per repetition, the first repetition dropped. Reported: p50 and
p95 / p99 seconds per statement, and the machine's load. ``--reps`` sets the warm repetitions
(default 10); ``--only classic`` or ``--only connect`` runs one host. Run with
``PYTHONPATH=<a checkout>/src`` to time another version (e.g. the py4j-callback route
before issue 26, ``--only classic``) with the same script.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import DATA_DIR, fresh_dir, loadavg, parse_args, percentile, save_result

ROWS = 10_000
CONNECT = "org.apache.spark.sql.connect.service.SparkConnectServer"


def make_table(path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    ids = pa.array(range(ROWS), pa.int64())
    table = pa.table(
        {
            "id": ids,
            "device": [f"device-{i % 100}" for i in range(ROWS)],
            "value": [i / 7 for i in range(ROWS)],
            "qty": pa.array([i % 10 for i in range(ROWS)], pa.int32()),
        }
    )
    write_deltalake(str(path), table.slice(0, ROWS // 2))
    write_deltalake(str(path), table.slice(ROWS // 2), mode="append")


def statements(path: str) -> dict[str, object]:
    """name -> a function of a counter, returning the SQL text."""
    return {
        "INSERT one row": lambda k: (
            f"INSERT INTO delta.`{path}` VALUES ({ROWS * 10 + k}, 'device-new', 1.5, 3)"
        ),
        "UPDATE one row": lambda k: f"UPDATE delta.`{path}` SET value = value + 1 WHERE id = {k}",
        "DELETE one row": lambda k: f"DELETE FROM delta.`{path}` WHERE id = {ROWS - 1 - k}",
        "MERGE 1 update + 1 insert": lambda k: (
            f"MERGE INTO delta.`{path}` AS t USING (SELECT * FROM VALUES"
            f" ({k + 100}L, 'device-merged', 2.5D, 4), ({ROWS * 20 + k}L, 'device-merged',"
            " 2.5D, 4) AS v(id, device, value, qty)) AS s ON t.id = s.id"
            " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ),
    }


def run_host(host: str, path: str, reps: int, port: int | None) -> dict[str, object]:
    """In a child process: the statements timed on ``host``."""
    import deltaflow

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.perf_counter()
    if host == "classic":
        spark = deltaflow.session(app_name="bench-hosts-dml", master="local[2]")
    else:
        spark = deltaflow.session(remote=f"sc://127.0.0.1:{port}")
    session_seconds = time.perf_counter() - started
    texts = statements(path)
    names = list(texts)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    counter = 0
    for rep in range(reps + 1):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            counter += 1
            sql = texts[name](counter)  # type: ignore[operator]
            start = time.perf_counter()
            spark.sql(sql).collect()
            elapsed = time.perf_counter() - start
            if rep:
                seconds[name].append(elapsed)
            print(f"  {host} rep {rep} {name}: {elapsed:.3f}s", file=sys.stderr, flush=True)
    spark.stop()
    return {"session_seconds": session_seconds, "seconds": seconds}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_connect_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    import pyspark

    import deltaflow

    spark_home = Path(pyspark.__file__).resolve().parent
    settings = {
        **deltaflow.spark_conf(),
        "spark.ui.enabled": "false",
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "4",
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
    }
    conf = [arg for k, v in settings.items() for arg in ("--conf", f"{k}={v}")]
    return subprocess.Popen(
        [
            str(spark_home / "bin" / "spark-submit"),
            *("--class", CONNECT, "--master", "local[2]"),
            *conf,
            "spark-internal",
        ],
        cwd=home,
        env={**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=(home / "server.log").open("w"),
    )


def wait_for_port(port: int, server: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the Connect server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the Connect server did not listen on {port} in {timeout} s")


def child(host: str, path: Path, reps: int, port: int | None) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", host, str(path), str(reps), str(port or 0)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if out.returncode != 0:
        raise RuntimeError(f"{host} failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    reps = 3 if args.quick else (args.reps if args.reps != 5 else 10)
    # A folder per run: two runs at once (two checkouts compared) must not share tables.
    base = fresh_dir(DATA_DIR / f"hosts_dml_{os.getpid()}")
    results: dict[str, object] = {"load_before": loadavg()}
    hosts = args.only.split(",") if args.only else ["classic", "connect"]
    for host in hosts:
        path = base / host
        make_table(path)
        if host == "classic":
            results[host] = child(host, path, reps, None)
            continue
        home = fresh_dir(base / "connect_server")
        home.mkdir()
        port = free_port()
        server = start_connect_server(home, port)
        try:
            wait_for_port(port, server, timeout=300)
            results[host] = child(host, path, reps, port)
        finally:
            server.terminate()
            server.wait(timeout=120)
    results["load_after"] = loadavg()
    shutil.rmtree(base, ignore_errors=True)
    print("\n| statement | host | p50 s | p95 s | p99 s |")
    print("| --- | --- | ---: | ---: | ---: |")
    first = results[hosts[0]]["seconds"]  # type: ignore[index]
    for name in first:
        for host in hosts:
            values = results[host]["seconds"][name]  # type: ignore[index]
            print(
                f"| {name} | {host} | {statistics.median(values):.2f}"
                f" | {percentile(values, 0.95):.2f} | {percentile(values, 0.99):.2f} |"
            )
    print(f"\nload before {results['load_before']}, after {results['load_after']}")
    save_result("hosts_dml", results)
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        host, path, reps, port = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(run_host(host, path, reps, port or None)))
    else:
        main()
