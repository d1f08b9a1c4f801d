"""A real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol.

One browser process per test module; pages are driven with ``Page.navigate`` and read
with ``Runtime.evaluate``. The websocket client is the ``websockets`` package (dev extras).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from tests._waiting import wait_until, wait_while_running

# The machine's flags for a quiet, sandbox-less headless browser that fetches nothing.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1200,900",
)


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise AssertionError(
            "the console's browser tests need Debian's chromium: run `make browser` (as root:"
            " apt-get install -y chromium chromium-driver)."
        )
    return found


class Browser:
    """One Chromium process and one page of it."""

    def __init__(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="deltaflow-chromium-")
        self.process = subprocess.Popen(
            [chromium_binary(), *_FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self._profile) / "DevToolsActivePort"
        wait_while_running(port_file.exists, self.process, 60, "chromium's DevTools port")
        wait_while_running(
            lambda: len(port_file.read_text().splitlines()) >= 2, self.process, 10, "port file"
        )
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
            targets = json.loads(response.read())
        page = next(t for t in targets if t["type"] == "page")
        self._ws: ClientConnection = connect(page["webSocketDebuggerUrl"], max_size=None)
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", what=f"{url} to load")

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self, selector: str) -> str | None:
        value = self.evaluate(
            f"(() => {{ const n = document.querySelector({json.dumps(selector)});"
            " return n ? n.textContent : null; })()"
        )
        return None if value is None else str(value)

    def wait_for(self, expression: str, *, what: str, timeout: float = 30) -> Any:
        """Poll ``expression`` in the page until it is truthy; return its value."""
        seen: list[Any] = [None]

        def truthy() -> bool:
            seen[0] = self.evaluate(expression)
            return bool(seen[0])

        wait_until(truthy, timeout, what)
        return seen[0]

    def close(self) -> None:
        try:
            self._ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            shutil.rmtree(self._profile, ignore_errors=True)
