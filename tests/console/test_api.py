"""The console's JSON API against real Delta tables, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.cli import main
from deltaflow.console import ConsoleConfig
from deltaflow.console.errors import ConsoleConfigError
from tests.console.conftest import Console


def test_tables_list_matches_the_tables(console: Console) -> None:
    body = console.ok("/api/tables")
    by_id = {t["id"]: t for t in body["tables"]}
    assert set(by_id) == {"events", "pipe/system/events", "sales/by_day", "sales/orders"}
    for table_id, row in by_id.items():
        table = DeltaTable(str(console.root / table_id))
        files = pa.table(table.get_add_actions(flatten=True))
        assert row["version"] == table.version()
        assert row["num_files"] == files.num_rows
        assert row["size_bytes"] == sum(files.column("size_bytes").to_pylist())
        assert row["num_rows"] == table.to_pyarrow_table().num_rows
        assert row["small_files"] == row["num_files"]  # all tiny
    assert by_id["sales/orders"]["last_commit"]["operation"] == "DELETE"
    assert by_id["events"]["streams"] == ["query-1"]


def test_table_detail(console: Console) -> None:
    detail = console.ok("/api/table?id=sales/by_day")
    assert detail["partition_columns"] == ["day"]
    assert [f["name"] for f in detail["schema"]["fields"]] == ["day", "n"]
    assert detail["change_data_feed"] is False
    orders = console.ok("/api/table?id=sales/orders")
    assert orders["properties"]["delta.enableChangeDataFeed"] == "true"
    assert orders["change_data_feed"] is True


def test_history_rows_and_files_per_version(console: Console) -> None:
    history = console.ok("/api/table/history?id=sales/orders")
    assert history["latest"] == 2
    commits = history["commits"]
    assert [c["version"] for c in commits] == [2, 1, 0]
    assert [c["operation"] for c in commits] == ["DELETE", "WRITE", "WRITE"]
    assert [c["rows_added"] for c in commits[1:]] == [2, 100]
    assert commits[0]["rows_removed"] == 10
    assert commits[0]["files_removed"] >= 1 and commits[0]["files_added"] >= 1
    page = console.ok("/api/table/history?id=sales/orders&before=2&limit=1")
    assert [c["version"] for c in page["commits"]] == [1]
    since = console.ok("/api/table/history?id=sales/orders&since=0")
    assert [c["version"] for c in since["commits"]] == [2, 1]


def test_history_reads_new_commits_incrementally(console: Console, lake: Path) -> None:
    path = str(lake / "grows")
    write_deltalake(path, pa.table({"x": [1]}))
    assert console.ok("/api/table/history?id=grows")["latest"] == 0
    write_deltalake(path, pa.table({"x": [2, 3]}), mode="append")
    since = console.ok("/api/table/history?id=grows&since=0")
    assert [(c["version"], c["rows_added"]) for c in since["commits"]] == [(1, 2)]
    row = next(t for t in console.ok("/api/tables")["tables"] if t["id"] == "grows")
    assert (row["version"], row["num_rows"]) == (1, 3)


def test_file_histogram_counts_every_file(console: Console) -> None:
    files = console.ok("/api/table/files?id=sales/by_day")
    assert files["num_files"] == 2
    assert sum(b["files"] for b in files["histogram"]) == 2


def test_preview_at_a_version(console: Console) -> None:
    first = console.ok("/api/table/preview?id=sales/orders&version=0&limit=500")
    assert (first["version"], first["num_rows"]) == (0, 100)
    assert [c["name"] for c in first["columns"]] == ["id", "amount"]
    latest = console.ok("/api/table/preview?id=sales/orders&limit=500")
    assert (latest["version"], latest["num_rows"]) == (2, 92)
    assert min(r[0] for r in latest["rows"]) == 10
    status, body = console.get("/api/table/preview?id=sales/orders&version=99")
    assert status == 404 and body["error"]["code"] == "version_not_found"


def test_change_feed_preview(console: Console) -> None:
    changes = console.ok("/api/table/changes?id=sales/orders&start=1&limit=500")
    kinds = [r[2] for r in changes["rows"]]
    assert kinds.count("delete") == 10 and kinds.count("insert") == 2
    assert changes["rows"][0][3] == 2  # newest version first
    status, body = console.get("/api/table/changes?id=sales/orders&start=7")
    assert status == 400 and body["error"]["code"] == "bad_version"


def test_streams_from_app_transactions(console: Console) -> None:
    streams = console.ok("/api/streams")["streams"]
    assert [s["app_id"] for s in streams] == ["query-1"]
    stream = streams[0]
    assert stream["tables"] == ["events"]
    assert stream["last_batch_id"] == 2
    assert [b["rows"] for b in stream["batches"]] == [5, 5, 5]


def test_pipelines_from_the_event_log(console: Console) -> None:
    [pipeline] = console.ok("/api/pipelines")["pipelines"]
    assert pipeline["event_log"] == "pipe/system/events"
    assert pipeline["pipeline_name"] == "orders_pipeline"
    [update] = pipeline["updates"]
    assert update["state"] == "COMPLETED"
    assert [s["state"] for s in update["states"]] == ["RUNNING", "COMPLETED"]
    graph = pipeline["graph"]
    assert [(n["name"], n["layer"]) for n in graph["nodes"]] == [
        ("bronze", 0),
        ("silver", 1),
        ("gold", 2),
    ]
    assert {(e["from"], e["to"]) for e in graph["edges"]} == {
        ("bronze", "silver"),
        ("silver", "gold"),
    }
    assert {f["name"]: f["rows"] for f in pipeline["flows"]} == {
        "bronze": 10,
        "silver": 8,
        "gold": 3,
    }
    [rule] = pipeline["expectations"]
    assert (rule["dataset"], rule["name"], rule["passed_records"], rule["failed_records"]) == (
        "silver",
        "valid_id",
        8,
        2,
    )
    assert rule["pass_rate"] == 0.8


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/table?id=../outside", 400),
        ("/api/table?id=sales/../../outside", 400),
        ("/api/table?id=%2e%2e/outside", 400),
        ("/api/table?id=/etc", 400),
        ("/api/table?id=", 400),
        ("/api/table?id=escape", 404),  # a symlink out of the root
        ("/api/table?id=sales/nothing", 404),
        ("/api/table/preview?id=sales/orders&version=x", 400),
        ("/static/..%2f..%2fconftest.py", 404),
        ("/nowhere", 404),
    ],
)
def test_requests_are_confined_to_the_roots(
    console: Console, lake: Path, tmp_path: Path, path: str, status: int
) -> None:
    outside = tmp_path / "outside_table"
    write_deltalake(str(outside), pa.table({"secret": [1]}))
    if not (lake / "escape").exists():
        os.symlink(outside, lake / "escape")
    got, body = console.get(path)
    assert got == status, body
    assert body["error"]["code"]
    assert "escape" not in {t["id"] for t in console.ok("/api/tables")["tables"]}


def test_browsing_changes_no_file(console: Console, lake: Path) -> None:
    before = _tree(lake)
    for path in (
        "/api/tables",
        "/api/table?id=sales/orders",
        "/api/table/history?id=sales/orders",
        "/api/table/files?id=sales/orders",
        "/api/table/preview?id=sales/orders&version=1",
        "/api/table/changes?id=sales/orders&start=0",
        "/api/streams",
        "/api/pipelines",
        "/",
        "/table?id=sales/orders",
    ):
        urllib.request.urlopen(console.url + path, timeout=30).read()
    request = urllib.request.Request(console.url + "/api/tables", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 405
    assert _tree(lake) == before


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (symlinks not followed) with a hash of its bytes."""
    out = {}
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(current, d))]:
            path = os.path.join(current, name)
            data = os.readlink(path).encode() if os.path.islink(path) else Path(path).read_bytes()
            out[os.path.relpath(path, root)] = hashlib.sha256(data).hexdigest()
    return out


def test_token_guards_every_route(lake: Path) -> None:
    guarded = Console(lake, token="s3cret-token")
    try:
        assert guarded.get("/api/tables")[0] == 401
        assert guarded.get("/api/tables", {"Authorization": "Bearer wrong"})[0] == 401
        assert guarded.get("/api/tables", {"Authorization": "Bearer s3cret-token"})[0] == 200
        assert guarded.get("/api/tables", {"Cookie": "deltaflow_console_token=nope"})[0] == 401

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as login:
            opener.open(guarded.url + "/table?id=events&token=s3cret-token", timeout=30)
        assert login.value.code == 303
        assert login.value.headers["Location"] == "/table?id=events"
        cookie = login.value.headers["Set-Cookie"].split(";")[0]
        assert "HttpOnly" in login.value.headers["Set-Cookie"]
        assert "s3cret-token" not in cookie  # a digest of the token, not the token
        assert guarded.get("/api/tables", {"Cookie": cookie})[0] == 200
    finally:
        guarded.server.close()


def test_exposing_the_console_needs_a_token(lake: Path) -> None:
    with pytest.raises(ConsoleConfigError) as exposed:
        ConsoleConfig.build([str(lake)], host="0.0.0.0")
    assert exposed.value.option == "--host"  # type: ignore[attr-defined]
    with pytest.raises(ConsoleConfigError) as empty:
        ConsoleConfig.build([str(lake)], host="0.0.0.0", token_env="UNSET_VAR", environ={})
    assert empty.value.option == "--token-env"  # type: ignore[attr-defined]
    config = ConsoleConfig.build(
        [str(lake)], host="0.0.0.0", token_env="T", environ={"T": "long-token"}
    )
    assert config.token == "long-token" and "long-token" not in repr(config)
    assert ConsoleConfig.build([str(lake)], host="::1").token is None


def test_cli_refuses_bad_roots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["console", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["console", "--host", "0.0.0.0", str(tmp_path)]) == 2
    assert "--token-env" in capsys.readouterr().err


def test_snapshot_facts_follow_commits_incrementally(tmp_path: Path) -> None:
    from deltaflow.console._table_state import TableState

    path = str(tmp_path / "moving")
    write_deltalake(path, pa.table({"k": list(range(50))}))
    state = TableState("moving", path, "root")
    state.facts()
    steps = [
        lambda: write_deltalake(path, pa.table({"k": [1, 2]}), mode="append"),
        lambda: DeltaTable(path).delete("k < 10"),
        lambda: DeltaTable(path).optimize.compact(),
        lambda: DeltaTable(path).alter.set_table_properties({"delta.targetFileSize": "4096"}),
        lambda: write_deltalake(path, pa.table({"k": [7]}), mode="overwrite"),
    ]
    for step in steps:
        step()
        moved, fresh = state.facts(), TableState("moving", path, "root").facts()
        assert moved == fresh
    assert (moved.num_rows, moved.small_file_bytes) == (1, 1024)


def test_cli_serves_until_interrupted(lake: Path) -> None:
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "deltaflow.cli", "console", "--port", "0", str(lake)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # "deltaflow console: http://127.0.0.1:PORT/ (...)"
        url = line.split()[2]
        assert url.startswith("http://127.0.0.1:"), line
        with urllib.request.urlopen(url + "api/tables", timeout=30) as response:
            assert response.status == 200
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_ingest_metrics_from_a_running_serve(lake: Path, ingest_service: Any) -> None:
    from tests._waiting import wait_until

    port = ingest_service.client.port
    watching = Console(lake, ingest=(f"http://127.0.0.1:{port}",))
    try:
        good = "\n".join(f'{{"id": {i}, "kind": "k"}}' for i in range(30))
        assert ingest_service.client.post("events", good).status == 200
        assert ingest_service.client.post("events", '{"id": "not a number"}').status == 400

        def counted() -> bool:
            [service] = watching.ok("/api/ingest")["services"]
            tables = {t["table"]: t for t in service["tables"]}
            row = tables.get("events")
            return bool(row and row["events_total"] == 30 and row["rejected_total"] == 1)

        wait_until(counted, 30, "the console to scrape the service's counters")
        [service] = watching.ok("/api/ingest")["services"]
        assert service["up"] and service["error"] is None
        [row] = service["tables"]
        assert row["requests_by_status"] == {"200": 1, "400": 1}
        assert row["ack_ms_p99"] is not None and row["ack_ms_p99"] > 0
    finally:
        watching.server.close()


def test_ingest_service_down_is_reported(lake: Path) -> None:
    watching = Console(lake, ingest=("http://127.0.0.1:9",))
    try:
        from tests._waiting import wait_until

        wait_until(
            lambda: watching.ok("/api/ingest")["services"][0]["error"] is not None, 30, "an error"
        )
        assert watching.ok("/api/ingest")["services"][0]["up"] is False
    finally:
        watching.server.close()
    with pytest.raises(ConsoleConfigError) as bad:
        ConsoleConfig.build([str(lake)], ingest=["127.0.0.1:8080"])
    assert bad.value.option == "--ingest"  # type: ignore[attr-defined]


def test_other_host_names_are_refused_without_a_token(console: Console) -> None:
    """DNS rebinding: a page on evil.example resolved to 127.0.0.1 sends its own Host."""
    status, body = console.get("/api/tables", {"Host": "evil.example:8765"})
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    port = console.url.rsplit(":", 1)[1]
    assert console.get("/api/tables", {"Host": f"localhost:{port}"})[0] == 200


def test_an_unreadable_table_is_listed_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "broken" / "_delta_log").mkdir(parents=True)
    write_deltalake(str(tmp_path / "fine"), pa.table({"x": [1]}))
    listing = Console(tmp_path)
    try:
        rows = {t["id"]: t for t in listing.ok("/api/tables")["tables"]}
        assert rows["fine"]["num_rows"] == 1
        assert "error" in rows["broken"] and "version" not in rows["broken"]
    finally:
        listing.server.close()


def test_several_roots_prefix_ids_with_the_root_name(tmp_path: Path) -> None:
    from deltaflow.console._catalog import Catalog

    for parent in ("a", "b"):
        write_deltalake(str(tmp_path / parent / "lake" / "t"), pa.table({"x": [1]}))
    write_deltalake(str(tmp_path / "solo"), pa.table({"x": [1]}))
    catalog = Catalog((str(tmp_path / "a" / "lake"), str(tmp_path / "b" / "lake")))
    assert [t.id for t in catalog.tables()] == ["lake-2/t", "lake/t"]
    assert catalog.table("lake-2/t").path == str((tmp_path / "b" / "lake" / "t").resolve())
    alone = Catalog((str((tmp_path / "solo").resolve()),))
    assert [t.id for t in alone.tables()] == ["solo"]  # a root that is itself a table


def test_a_table_whose_log_holds_very_many_files_is_flagged(tmp_path: Path) -> None:
    """A real-time sink's days of commits: every load lists ``_delta_log`` whole, so the
    table list flags it, with the count; a short log is not flagged."""
    from deltaflow.console._table_state import MANY_LOG_FILES
    from tests.console.conftest import Console
    from tests.table.test_long_log import _age

    root = tmp_path / "lake"
    write_deltalake(str(root / "short"), pa.table({"k": [1]}))
    write_deltalake(str(root / "long"), pa.table({"k": [1]}))
    _age(str(root / "long"), MANY_LOG_FILES)
    console = Console(root)
    try:
        by_id = {t["id"]: t for t in console.ok("/api/tables")["tables"]}
        assert by_id["long"]["log_files"] >= MANY_LOG_FILES
        assert (by_id["long"]["health"], by_id["long"]["warnings"]) == ("long-log", ["long-log"])
        assert by_id["short"]["log_files"] == len(os.listdir(root / "short" / "_delta_log"))
        assert (by_id["short"]["health"], by_id["short"]["warnings"]) == ("ok", [])
        assert console.ok("/api/table?id=long")["warnings"] == ["long-log"]
    finally:
        console.server.close()
