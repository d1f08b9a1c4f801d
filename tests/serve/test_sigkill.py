"""A SIGKILL of `deltaflow serve` under load loses no acknowledged event and duplicates none."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.serve.conftest import SCHEMA, read_table

TOKEN = "chaos-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(table: Path, port: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "deltaflow.cli",
        "serve",
        "--table",
        f"events={table}",
        "--schema",
        f"events={SCHEMA}",
        "--token-env",
        "events=CHAOS_TOKENS",
        "--port",
        str(port),
        "--max-delay-ms",
        "5",
        "--log-level",
        "warning",
    ]
    return subprocess.Popen(
        command,
        env={**os.environ, "CHAOS_TOKENS": TOKEN},
        start_new_session=True,
        stderr=subprocess.DEVNULL,
    )


def wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("server did not become healthy")


def post(port: int, body: bytes, key: str) -> int | None:
    """The status, or None when the connection failed (no answer: outcome unknown)."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request(
            "POST",
            "/v1/tables/events/events",
            body=body,
            headers={"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": key},
        )
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return None


@pytest.mark.chaos
def test_sigkill_under_load_loses_and_duplicates_nothing(tmp_path: Path):
    table = tmp_path / "events"
    port = free_port()
    server = start(table, port)
    acknowledged: set[int] = set()
    unanswered: list[tuple[str, bytes, list[int]]] = []
    lock = threading.Lock()
    killed = threading.Event()

    def worker(number: int) -> None:
        sent = 0
        while not killed.is_set() and sent < 2000:
            ids = [number * 1_000_000 + sent * 10 + i for i in range(10)]
            sent += 1
            body = "\n".join(json.dumps({"id": i, "kind": "chaos"}) for i in ids).encode()
            key = uuid.uuid4().hex
            status = post(port, body, key)
            with lock:
                if status == 200:
                    acknowledged.update(ids)
                else:
                    unanswered.append((key, body, ids))

    try:
        wait_healthy(port)
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acknowledged) < 3000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acknowledged) >= 3000, "no load reached the server"
        os.killpg(server.pid, signal.SIGKILL)
        killed.set()
        server.wait(timeout=30)
        for t in threads:
            t.join(timeout=60)
        server = start(table, port)
        wait_healthy(port)
        # Clients retry what got no answer, with the same keys.
        for key, body, ids in unanswered:
            assert post(port, body, key) == 200
            acknowledged.update(ids)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    ids = [r["id"] for r in read_table(table)]
    assert len(ids) == len(set(ids)), "an event was committed twice"
    assert set(ids) == acknowledged, "an acknowledged event is missing (or an unknown one appeared)"


def test_sigterm_commits_what_was_acknowledged_and_exits_0(tmp_path: Path):
    table = tmp_path / "events"
    port = free_port()
    server = start(table, port)
    try:
        wait_healthy(port)
        for n in range(5):
            body = "\n".join(json.dumps({"id": n * 10 + i, "kind": "term"}) for i in range(10))
            assert post(port, body.encode(), uuid.uuid4().hex) == 200
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    # uvicorn re-raises the signal after its graceful shutdown; serve exits 0 all the same,
    # so supervisors (systemd, the demo) can tell a clean stop from a crash.
    assert code == 0
    assert sorted(r["id"] for r in read_table(table)) == list(range(50))
