"""A real console on 127.0.0.1 (in a thread of the test process) over real Delta tables."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from deltaflow.console import ConsoleConfig, ConsoleServer


def make_tables(root: Path) -> None:
    """A small lakehouse: appends, a delete, a partitioned table, a change feed, a stream."""
    orders = str(root / "sales" / "orders")
    write_deltalake(
        orders,
        pa.table({"id": list(range(100)), "amount": [i * 1.5 for i in range(100)]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    write_deltalake(orders, pa.table({"id": [100, 101], "amount": [1.0, 2.0]}), mode="append")
    from deltalake import DeltaTable

    DeltaTable(orders).delete("id < 10")
    write_deltalake(
        str(root / "sales" / "by_day"),
        pa.table({"day": ["a", "b", "a"], "n": [1, 2, 3]}),
        partition_by=["day"],
    )
    write_event_log(str(root / "pipe" / "system" / "events"))
    events = str(root / "events")
    for batch in range(3):
        write_deltalake(
            events,
            pa.table({"n": list(range(batch * 5, batch * 5 + 5))}),
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id="query-1", version=batch)]
            ),
        )


def write_event_log(path: str) -> None:
    """One pipeline update, logged by the pipelines' own event-log writer: bronze -> silver
    -> gold, with an expectation on silver that fails 2 of 10 rows."""
    from deltaflow.pipelines._event_log import EventLog, Origin

    log = EventLog(path, Origin("pipe-1", "orders_pipeline", "update-1"))
    log.emit("create_update", "started", {"cause": "API_CALL"})
    log.emit("update_progress", "running", {"state": "RUNNING"})
    flows = {"bronze": [], "silver": ["bronze"], "gold": ["silver"]}
    for name, inputs in flows.items():
        definition = {"output_dataset": name, "input_datasets": inputs, "output_kind": "table"}
        log.emit("flow_definition", "defined", definition, flow=name, dataset=name)
    for name, rows in (("bronze", 10), ("silver", 8), ("gold", 3)):
        details: dict[str, Any] = {"status": "COMPLETED", "metrics": {"num_output_rows": rows}}
        if name == "silver":
            rule = {"name": "valid_id", "dataset": "silver", "passed_records": 8}
            details["data_quality"] = {
                "dropped_records": 2,
                "expectations": [{**rule, "failed_records": 2}],
            }
        log.emit("flow_progress", "done", details, flow=name, dataset=name)
    log.emit("update_progress", "completed", {"state": "COMPLETED"})
    log.flush()


class Console:
    def __init__(self, root: Path, token: str | None = None, ingest: tuple[str, ...] = ()) -> None:
        self.root = root
        environ = {"CONSOLE_TOKEN": token} if token else {}
        config = ConsoleConfig.build(
            [str(root)],
            port=0,
            token_env="CONSOLE_TOKEN" if token else None,
            ingest=ingest,
            environ=environ,
        )
        self.server = ConsoleServer(config).start()
        self.url = self.server.url.rstrip("/")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def ok(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, body)
        return body


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    make_tables(root)
    return root


@pytest.fixture(scope="module")
def console(lake: Path) -> Iterator[Console]:
    running = Console(lake)
    yield running
    running.server.close()


@pytest.fixture
def ingest_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real `deltaflow serve` (uvicorn in a thread) with one table, ``events``."""
    from tests.serve.conftest import TOKEN, RunningServer, make_config

    monkeypatch.setenv("DF_TEST_TOKENS", TOKEN)
    server = RunningServer(make_config(tmp_path / "served"))
    yield server
    server.stop()
