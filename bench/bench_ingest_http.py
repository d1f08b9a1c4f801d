"""HTTP ingest (`deltaflow serve`): events/s and acknowledgement latency on loopback.

Starts `deltaflow serve` as a subprocess on 127.0.0.1 with one unpartitioned table,
then drives it from this process with 50 concurrent keep-alive connections (asyncio
raw sockets, pre-built request bytes: the load generator must cost as little CPU as
possible, because it shares the machine's 2 cores with the server). Each request holds
``--events-per-request`` NDJSON events of ~200 bytes. Reports acknowledged events/s and
p50 / p99 / max acknowledgement latency (request sent -> 200 received), and checks
that the table holds exactly the acknowledged rows.

``--stores local s3`` runs the same load against a table on local disk and one on S3
(a SeaweedFS server started for the run, as in the tests: ``tests/_object_store.py``),
one after the other in one run, so the ratio is what to read on a loaded machine.

    .venv/bin/python bench/bench_ingest_http.py [--quick] [--seconds 20] [--clients 50]
        [--stores local s3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import loadavg  # noqa: E402

SCHEMA = "id BIGINT, device INT, kind STRING, ts TIMESTAMP, value DOUBLE, payload STRING"


def make_bodies(count: int, events: int) -> list[bytes]:
    bodies = []
    next_id = 0
    for _ in range(count):
        lines = []
        for _ in range(events):
            record = {
                "id": next_id,
                "device": next_id % 500,
                "kind": ("click", "view", "buy")[next_id % 3],
                "ts": "2025-06-01T12:34:56.789012Z",
                "value": next_id * 0.5,
                "payload": "x" * 100,
            }
            lines.append(json.dumps(record, separators=(",", ":")))
            next_id += 1
        bodies.append("\n".join(lines).encode())
    return bodies


def request_bytes(body: bytes, token: str) -> bytes:
    head = (
        "POST /v1/tables/events/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/x-ndjson\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def client(port: int, requests: list[bytes], events: int, until: float, out: dict) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    index = 0
    try:
        while time.perf_counter() < until:
            payload = requests[index % len(requests)]
            index += 1
            sent = time.perf_counter()
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                out["errors"] += 1
                continue
            out["latencies"].append(time.perf_counter() - sent)
            out["events"] += events
    finally:
        writer.close()


async def drive(port: int, clients: int, seconds: float, events: int, token: str) -> dict:
    bodies = make_bodies(64, events)
    requests = [request_bytes(b, token) for b in bodies]
    out: dict = {"latencies": [], "events": 0, "errors": 0}
    # Warm-up: a few requests so the first commit's table loading is not measured.
    await client(port, requests, events, time.perf_counter() + 1.0, {**out, "latencies": []})
    out = {"latencies": [], "events": 0, "errors": 0}
    start = time.perf_counter()
    until = start + seconds
    await asyncio.gather(*(client(port, requests, events, until, out) for _ in range(clients)))
    out["elapsed"] = time.perf_counter() - start
    out["bytes_per_event"] = len(bodies[0]) / events
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def count_rows(path: str, options: dict[str, str]) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(path, storage_options=options).to_pyarrow_dataset().count_rows())


@contextlib.contextmanager
def object_store(workdir: str):  # type: ignore[no-untyped-def]
    """A SeaweedFS S3 server for the run (the tests' fixture code), stopped afterwards."""
    sys.path.insert(0, str(HERE.parent))
    from tests import _object_store

    folder = Path(workdir, "seaweedfs")
    folder.mkdir()
    endpoint = f"http://127.0.0.1:{_object_store.free_port()}"
    with _object_store.start_seaweedfs(folder, endpoint) as store:
        yield store


def run(args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix="deltaflow-bench-http-")
    with contextlib.ExitStack() as stack:
        if args.store == "s3":
            store = stack.enter_context(object_store(workdir))
            return _run(args, workdir, store.uri("events"), store.env)
        return _run(args, workdir, os.path.join(workdir, "events"), {})


def _run(args: argparse.Namespace, workdir: str, table: str, store_env: dict[str, str]) -> dict:
    port = free_port()
    env = {**os.environ, **store_env, "BENCH_TOKENS": "bench-token"}
    command = [
        sys.executable, "-m", "deltaflow.cli", "serve",
        "--table", f"events={table}", "--schema", f"events={SCHEMA}",
        "--token-env", "events=BENCH_TOKENS", "--port", str(port),
        "--max-delay-ms", str(args.max_delay_ms), "--log-level", "warning",
    ]  # fmt: skip
    if args.no_fsync:
        command.append("--no-fsync")
    server = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.1)
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(
            drive(port, args.clients, args.seconds, args.events_per_request, "bench-token")
        )
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        rows = count_rows(table, store_env)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)
    latencies = sorted(result["latencies"])

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "store": args.store,
        "clients": args.clients,
        "events_per_request": args.events_per_request,
        "bytes_per_event": round(result["bytes_per_event"], 1),
        "fsync": not args.no_fsync,
        "max_delay_ms": args.max_delay_ms,
        "seconds": round(result["elapsed"], 2),
        "requests": len(latencies),
        "errors": result["errors"],
        "events_per_second": round(result["events"] / result["elapsed"]),
        "p50_ms": round(pct(0.50), 1),
        "p99_ms": round(pct(0.99), 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "mean_ms": round(statistics.mean(latencies) * 1000, 1),
        # Warm-up events are in the table too: rows >= acknowledged measured events.
        "table_rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 seconds")
    parser.add_argument("--reps", type=int, default=1, help="ignored (one run per variant)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--events-per-request", type=int, nargs="*", default=[100, 500, 2000])
    parser.add_argument("--max-delay-ms", type=float, default=10.0)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--stores", nargs="*", choices=("local", "s3"), default=["local"])
    args = parser.parse_args()
    if args.quick:
        args.seconds = 5.0
    results = []
    for events in args.events_per_request:
        for store in args.stores:
            one = argparse.Namespace(**{**vars(args), "events_per_request": events, "store": store})
            load = loadavg()
            result = {**run(one), "load_before": load}
            results.append(result)
            print(json.dumps(result), flush=True)
    out = HERE / "results" / "ingest_http.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
