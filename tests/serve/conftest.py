"""A real `deltaflow serve` on 127.0.0.1 (uvicorn in a thread of the test process)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

TOKEN = "test-token-events"
OTHER_TOKEN = "test-token-other"
SCHEMA = "id BIGINT, kind STRING, ts TIMESTAMP, day DATE, value DOUBLE"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


class Client:
    def __init__(self, port: int) -> None:
        self.port = port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = TOKEN,
    ) -> Reply:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            sent = dict(headers or {})
            if token is not None:
                sent["Authorization"] = f"Bearer {token}"
            data = body.encode() if isinstance(body, str) else body
            connection.request(method, path, body=data, headers=sent)
            response = connection.getresponse()
            raw = response.read()
            kind = response.getheader("content-type", "")
            parsed = json.loads(raw) if "json" in kind else raw.decode()
            return Reply(response.status, parsed, {k.lower(): v for k, v in response.getheaders()})
        finally:
            connection.close()

    def post(self, table: str, body: bytes | str, key: str | None = None, **kw: Any) -> Reply:
        headers = dict(kw.pop("headers", {}) or {})
        if key is not None:
            headers["Idempotency-Key"] = key
        return self.request("POST", f"/v1/tables/{table}/events", body, headers, **kw)


class RunningServer:
    def __init__(self, config: Any) -> None:
        import uvicorn

        from deltaflow.ingest.http._app import IngestService

        self.service = IngestService(config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.service.app,
                host="127.0.0.1",
                port=0,
                log_level="warning",
                access_log=False,
                lifespan="on",
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.client = Client(port)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "server did not stop"


def make_config(tmp_path: Path, **tables: dict[str, Any]) -> Any:
    from deltaflow.ingest.http._config import load_config

    if not tables:
        tables = {"events": {}}
    raw: dict[str, dict[str, Any]] = {}
    for name, keys in tables.items():
        raw[name] = {
            "path": str(tmp_path / name),
            "schema": SCHEMA,
            "tokens_env": "DF_TEST_TOKENS",
            **keys,
        }
    return load_config(None, {"tables": raw, "group_commit_max_delay_ms": 5.0, "fsync": True})


@pytest.fixture
def serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., RunningServer]]:
    monkeypatch.setenv("DF_TEST_TOKENS", f"{TOKEN},{OTHER_TOKEN}")
    started: list[RunningServer] = []

    def start(config: Any = None, **overrides: Any) -> RunningServer:
        config = config if config is not None else make_config(tmp_path)
        if overrides:
            config = replace(config, **overrides)
        server = RunningServer(config)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.thread.is_alive():
            server.stop()


def read_table(path: str | Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
