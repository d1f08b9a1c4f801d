"""The console in a real headless Chromium: pages render the tables' numbers and follow
new commits without a reload."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.console._browser import Browser
from tests.console.conftest import Console


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    running = Browser()
    yield running
    running.close()


def _cell(browser: Browser, table_id: str, column: str) -> str | None:
    return browser.text(f'#tables tr[data-id="{table_id}"] td.{column}')


def test_tables_page_shows_the_tables(console: Console, browser: Browser) -> None:
    browser.open(console.url + "/")
    browser.wait_for("document.querySelectorAll('#tables tbody tr').length === 4", what="rows")
    orders = DeltaTable(str(console.root / "sales" / "orders"))
    assert _cell(browser, "sales/orders", "version") == str(orders.version())
    assert _cell(browser, "sales/orders", "rows") == f"{orders.to_pyarrow_table().num_rows:,}"
    assert _cell(browser, "sales/orders", "operation") == "DELETE"
    assert _cell(browser, "events", "streams") == "query-1"


def test_a_long_log_is_flagged_on_both_pages(tmp_path: Path, browser: Browser) -> None:
    from deltaflow.console._table_state import MANY_LOG_FILES
    from tests.table.test_long_log import _age

    root = tmp_path / "lake"
    write_deltalake(str(root / "short"), pa.table({"k": [1]}))
    write_deltalake(str(root / "long"), pa.table({"k": [1]}))
    _age(str(root / "long"), MANY_LOG_FILES)
    count = f"{len(os.listdir(root / 'long' / '_delta_log')):,} log files"
    console = Console(root)
    try:
        browser.open(console.url + "/")
        browser.wait_for("document.querySelectorAll('#tables tbody tr').length === 2", what="rows")
        assert _cell(browser, "long", "health") == f"1 of 1 {count}"
        assert _cell(browser, "short", "health") == "1 of 1"
        browser.open(console.url + "/table?id=long")
        browser.wait_for("!!document.querySelector('#log-files .long-log')", what="the log badge")
        assert browser.text("#log-files") == count
    finally:
        console.server.close()


def test_table_page_renders_history_charts_and_preview(console: Console, browser: Browser) -> None:
    browser.open(console.url + "/table?id=sales/orders")
    browser.wait_for(
        "document.querySelectorAll('#history tbody tr').length === 3", what="history rows"
    )
    assert browser.text("#version") == "2"
    assert browser.text("#num-rows") == "92"
    ops = browser.evaluate(
        "[...document.querySelectorAll('#history tbody tr')].map(r => r.children[2].textContent)"
    )
    assert ops == ["DELETE", "WRITE", "WRITE"]
    # Real charts: one SVG bar per version, one per file-size bucket in use.
    heights = browser.evaluate(
        "[...document.querySelectorAll('#history-chart rect.bar')]"
        ".map(r => Number(r.getAttribute('data-value')))"
    )
    assert heights == [100, 2, 10]
    assert browser.evaluate("document.querySelectorAll('#files-chart rect.bar').length") >= 1
    browser.wait_for(
        "document.querySelectorAll('#preview tbody tr').length === 20", what="preview rows"
    )
    browser.evaluate(
        "document.getElementById('preview-version').value = '0';"
        "document.getElementById('preview-limit').value = '500';"
        "document.getElementById('preview-load').click(); true"
    )
    browser.wait_for(
        "document.querySelector('#preview').getAttribute('data-version') === '0'"
        " && document.querySelectorAll('#preview tbody tr').length === 100",
        what="the version-0 preview",
    )
    browser.wait_for(
        "document.querySelectorAll('#changes tbody tr').length > 0", what="change feed rows"
    )
    # A click on a history row previews the table as of that version.
    browser.evaluate("document.querySelector('#history tr[data-version=\"1\"]').click(); true")
    browser.wait_for(
        "document.querySelector('#preview').getAttribute('data-version') === '1'",
        what="the version-1 preview",
    )


def test_pages_follow_new_commits_without_reload(
    console: Console, browser: Browser, lake: Path
) -> None:
    path = str(lake / "sales" / "orders")
    browser.open(console.url + "/table?id=sales/orders")
    browser.wait_for("document.querySelectorAll('#history tbody tr').length >= 3", what="history")
    before = int(browser.text("#version") or -1)
    browser.evaluate("window.__not_reloaded = true")
    write_deltalake(path, pa.table({"id": [500, 501, 502], "amount": [0.0] * 3}), mode="append")
    new_version = DeltaTable(path).version()
    assert new_version == before + 1
    browser.wait_for(
        f"document.getElementById('version').textContent === '{new_version}'",
        what="the version card to move",
        timeout=60,
    )
    top = browser.evaluate("document.querySelector('#history tbody tr').dataset.version")
    assert top == str(new_version)
    assert browser.evaluate("window.__not_reloaded === true")
    browser.open(console.url + "/")
    browser.evaluate("window.__not_reloaded = true")
    write_deltalake(path, pa.table({"id": [600], "amount": [0.0]}), mode="append")
    browser.wait_for(
        f"document.querySelector('#tables tr[data-id=\"sales/orders\"] td.version')"
        f".textContent === '{new_version + 1}'",
        what="the tables page to show the new version",
        timeout=60,
    )
    assert browser.evaluate("window.__not_reloaded === true")


def test_streams_page_charts_batches(console: Console, browser: Browser) -> None:
    browser.open(console.url + "/streams")
    browser.wait_for("!!document.querySelector('section[data-app-id=\"query-1\"]')", what="stream")
    assert browser.text('section[data-app-id="query-1"] .last-batch') == "2"
    bars = browser.evaluate(
        "document.querySelectorAll('section[data-app-id=\"query-1\"] rect.bar').length"
    )
    assert bars == 9  # 3 batches in each of the three charts


def test_pipelines_page_draws_the_graph(console: Console, browser: Browser) -> None:
    browser.open(console.url + "/pipelines")
    browser.wait_for(
        "document.querySelectorAll('.graph g[data-dataset]').length === 3", what="graph"
    )
    assert browser.evaluate("document.querySelectorAll('.graph path').length") == 2
    assert browser.text('tr[data-expectation="silver.valid_id"] td.failed') == "2"
    assert browser.text('tr[data-flow="silver"] td.rows') == "8"
    assert browser.text(".update-state") == "COMPLETED"


def test_ingest_page_shows_a_running_serve(
    lake: Path, browser: Browser, ingest_service: Any
) -> None:
    watching = Console(lake, ingest=(f"http://127.0.0.1:{ingest_service.client.port}",))
    try:
        browser.open(watching.url + "/ingest")
        browser.evaluate("window.__not_reloaded = true")
        rows = "\n".join(f'{{"id": {i}}}' for i in range(12))
        assert ingest_service.client.post("events", rows).status == 200
        total = "document.querySelector('[data-table=\"events\"] .events-total')"
        browser.wait_for(f"!!{total} && {total}.textContent === '12'", what="12 events")
        assert browser.evaluate("document.querySelectorAll('.chart.events svg').length") == 1
        assert browser.evaluate("window.__not_reloaded === true")
    finally:
        watching.server.close()


def test_token_login_in_the_browser(lake: Path, browser: Browser) -> None:
    guarded = Console(lake, token="browser-token")
    try:
        browser.open(guarded.url + "/")
        assert "unauthorised" in (browser.text("body") or "")
        browser.open(guarded.url + "/?token=browser-token")  # sets the cookie, drops the token
        assert browser.evaluate("location.search") == ""
        browser.wait_for(
            "document.querySelectorAll('#tables tbody tr').length === 4", what="the table list"
        )
    finally:
        guarded.server.close()
