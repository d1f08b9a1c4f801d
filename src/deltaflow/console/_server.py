"""The console's HTTP server: static pages and a read-only JSON API (stdlib only).

Routes (every API answer is JSON; errors are ``{"error": {"code", "message"}}``)::

    GET /  /table?id=ID  /streams  /pipelines  /ingest   the pages (static HTML + JS)
    GET /api/tables                        every table under the roots, one row each
    GET /api/table?id=ID                   schema, partitioning, clustering, properties
    GET /api/table/history?id=ID[&before=V][&since=V][&limit=N]
    GET /api/table/files?id=ID             the file-size histogram
    GET /api/table/preview?id=ID[&version=V][&limit=N]
    GET /api/table/changes?id=ID[&start=V][&limit=N]
    GET /api/streams                       streaming queries, from sinks' commits and checkpoints
    GET /api/pipelines                     pipelines, from their event logs
    GET /api/ingest                        `deltaflow serve` metrics (the --ingest URLs)
    GET /healthz

Nothing here writes to a table: every handler reads the log or a snapshot.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import logging
import sys
import threading
import time
from collections.abc import Callable
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import orjson

from deltaflow.console import _preview, _streams
from deltaflow.console._catalog import Catalog
from deltaflow.console._config import ConsoleConfig
from deltaflow.console._ingest import IngestWatcher
from deltaflow.console._pipelines import PipelineViews
from deltaflow.console.errors import ConsoleRequestError

log = logging.getLogger("deltaflow.console")

_COOKIE = "deltaflow_console_token"
_PAGES = {
    "/": "index.html",
    "/table": "table.html",
    "/streams": "streams.html",
    "/pipelines": "pipelines.html",
    "/ingest": "ingest.html",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_HISTORY_PAGE = 200
_LOCAL_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class _Api:
    """The JSON API over a :class:`Catalog`; each method answers one route."""

    def __init__(self, catalog: Catalog, ingest: IngestWatcher) -> None:
        self.catalog = catalog
        self.ingest_watcher = ingest
        self._pipelines = PipelineViews()

    def tables(self, query: dict[str, str]) -> Any:
        rows = []
        tables = self.catalog.tables()
        readers = _streams.readers(tables, self.catalog.checkpoints())
        for state in tables:
            try:
                rows.append({**state.summary(), "readers": readers.get(state.id, [])})
            except Exception as exc:  # one unreadable table must not hide the others
                rows.append({"id": state.id, "root": state.root, "error": str(exc)})
        return {"roots": [r.name for r in self.catalog.roots], "tables": rows}

    def table(self, query: dict[str, str]) -> Any:
        return self.catalog.table(query.get("id")).detail()

    def history(self, query: dict[str, str]) -> Any:
        state = self.catalog.table(query.get("id"))
        limit = max(1, min(_int(query, "limit", _HISTORY_PAGE), 5000))
        if "since" in query:
            commits = state.log.since(_int(query, "since", -1), limit)
        else:
            before = _int(query, "before", -1) if "before" in query else None
            commits = state.log.page(before, limit)
        return {
            "id": state.id,
            "latest": state.log.latest_version(),
            "commits": [c.to_json() for c in commits],
        }

    def files(self, query: dict[str, str]) -> Any:
        state = self.catalog.table(query.get("id"))
        facts = state.facts()
        return {
            "id": state.id,
            "version": facts.version,
            "num_files": facts.num_files,
            "size_bytes": facts.size_bytes,
            "small_files": facts.small_files,
            "small_file_bytes": facts.small_file_bytes,
            "histogram": facts.histogram,
        }

    def preview(self, query: dict[str, str]) -> Any:
        state = self.catalog.table(query.get("id"))
        version = _int(query, "version", -1) if query.get("version") else None
        return _preview.preview(state.path, version, _int(query, "limit", 20))

    def changes(self, query: dict[str, str]) -> Any:
        state = self.catalog.table(query.get("id"))
        # By default the last ten versions: enough to see what a stream is doing.
        start = _int(query, "start", max(0, state.log.latest_version() - 9))
        return _preview.changes(state.path, start, _int(query, "limit", 50))

    def streams(self, query: dict[str, str]) -> Any:
        return {"streams": _streams.streams(self.catalog.tables(), self.catalog.checkpoints())}

    def pipelines(self, query: dict[str, str]) -> Any:
        return {"pipelines": self._pipelines.pipelines(self.catalog.tables())}

    def ingest(self, query: dict[str, str]) -> Any:
        return {"services": self.ingest_watcher.services()}

    def routes(self) -> dict[str, Callable[[dict[str, str]], Any]]:
        return {
            "/api/tables": self.tables,
            "/api/table": self.table,
            "/api/table/history": self.history,
            "/api/table/files": self.files,
            "/api/table/preview": self.preview,
            "/api/table/changes": self.changes,
            "/api/streams": self.streams,
            "/api/pipelines": self.pipelines,
            "/api/ingest": self.ingest,
            "/healthz": lambda q: {"status": "ok"},
        }


def _int(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConsoleRequestError(
            f"{name}={raw!r} is not a whole number.", status=400, code="bad_parameter"
        ) from None


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HttpServer
    server_version = "deltaflow-console"
    sys_version = ""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if self.server.token is None and not self._local_host():
            return
        if self.server.token is not None and not self._authorised(url.path, query):
            return
        route = self.server.routes.get(url.path)
        if route is not None:
            self._api(route, query)
        elif url.path in _PAGES:
            self._static(_PAGES[url.path])
        elif url.path.startswith("/static/"):
            self._static(url.path.removeprefix("/static/"))
        else:
            self._error(404, "not_found", f"no page or API at {url.path!r}: start at /.")

    def do_POST(self) -> None:
        self._error(405, "read_only", "the console is read only: only GET is served.")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _local_host(self) -> bool:
        """Without a token, answer only requests addressed to this machine by name: a web
        page elsewhere could otherwise point its own domain at 127.0.0.1 (DNS rebinding)
        and read the console through the visitor's browser."""
        host = (self.headers.get("Host") or "").strip().lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.strip("[]") in _LOCAL_NAMES or name.strip("[]") == self.server.bound_host:
            return True
        self._error(
            403,
            "host_not_allowed",
            f"Host {host!r} is not this console's address: open it as http://127.0.0.1:<port>/"
            " (a console reached by another name needs --token-env).",
        )
        return False

    def _authorised(self, path: str, query: dict[str, str]) -> bool:
        token = self.server.token
        assert token is not None
        offered = query.pop("token", None)
        if offered is not None and _same(offered, token):
            # A login link: keep the token in a cookie and drop it from the address bar.
            rest = urlencode(query)
            self.send_response(303)
            self.send_header("Location", path + ("?" + rest if rest else ""))
            self.send_header(
                "Set-Cookie",
                f"{_COOKIE}={_cookie_value(token)}; HttpOnly; SameSite=Strict; Path=/",
            )
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        header = self.headers.get("Authorization", "")
        scheme, _, bearer = header.partition(" ")
        if scheme.lower() == "bearer" and _same(bearer.strip(), token):
            return True
        cookie = SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie", ""))
        except Exception:  # a malformed cookie header is just no cookie
            cookie = SimpleCookie()
        morsel = cookie.get(_COOKIE)
        if morsel is not None and _same(morsel.value, _cookie_value(token)):
            return True
        self._error(
            401,
            "unauthorised",
            "this console needs its token: open /?token=<token> once, or send"
            " 'Authorization: Bearer <token>'.",
        )
        return False

    def _api(self, route: Callable[[dict[str, str]], Any], query: dict[str, str]) -> None:
        started = time.perf_counter()
        try:
            body = orjson.dumps(route(query), default=str)
        except ConsoleRequestError as exc:
            self._error(exc.status, exc.code, exc.message)  # type: ignore[attr-defined]
            return
        except Exception as exc:
            log.exception("console API %s failed", self.path)
            self._error(500, "internal", f"{type(exc).__name__}: {exc}")
            return
        self._send(200, body, "application/json")
        log.debug("%s in %.1f ms", self.path, (time.perf_counter() - started) * 1000)

    def _static(self, name: str) -> None:
        data = self.server.static.get(name)
        if data is None:
            self._error(404, "not_found", f"no static file {name!r}.")
            return
        kind = _TYPES.get(name[name.rfind(".") :], "application/octet-stream")
        self._send(200, data, f"{kind}; charset=utf-8")

    def _error(self, status: int, code: str, message: str) -> None:
        body = orjson.dumps({"error": {"code": code, "message": message}})
        self._send(status, body, "application/json")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: URLs may carry a login token."""


def _cookie_value(token: str) -> str:
    """What the login cookie holds: a digest of the token, not the token (any characters
    fit a cookie this way, and a leaked cookie does not give away the token)."""
    return hashlib.sha256(b"deltaflow-console:" + token.encode("utf-8")).hexdigest()


def _same(offered: str, token: str) -> bool:
    return hmac.compare_digest(offered.encode("utf-8"), token.encode("utf-8"))


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that closed its connection (a page left mid-poll) is not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    token: str | None
    bound_host: str
    routes: dict[str, Callable[[dict[str, str]], Any]]
    static: dict[str, bytes]


def _static_files() -> dict[str, bytes]:
    folder = resources.files("deltaflow.console") / "static"
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}


class ConsoleServer:
    """The console bound to its address; :meth:`serve_forever` or :meth:`start` runs it."""

    def __init__(self, config: ConsoleConfig, *, warm: bool = True) -> None:
        self.config = config
        self._warm = warm
        self.catalog = Catalog(config.roots)
        family = http.server.ThreadingHTTPServer.address_family
        if ":" in config.host:
            import socket

            family = socket.AF_INET6
        server_class = type("_Bound", (_HttpServer,), {"address_family": family})
        self._http: _HttpServer = server_class((config.host, config.port), _Handler)
        self._http.token = config.token
        self._http.bound_host = config.host.strip("[]").lower()
        self.ingest = IngestWatcher(config.ingest)
        self._http.routes = _Api(self.catalog, self.ingest).routes()
        self._http.static = _static_files()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def serve_forever(self) -> None:
        if self._warm:
            # Open every table and read its newest commits before anyone asks: the first
            # table list then answers from the caches (100 tables take ~0.7 s to open).
            threading.Thread(target=self.warm_up, name="console-warm-up", daemon=True).start()
        self.ingest.start()
        self._http.serve_forever(poll_interval=0.5)

    def warm_up(self) -> None:
        for state in self.catalog.tables():
            try:
                state.summary()
            except Exception:  # the table list shows the error when it is asked for
                log.debug("warming %s failed", state.id, exc_info=True)

    def start(self) -> ConsoleServer:
        """Serve from a background thread (tests, notebooks); :meth:`close` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="console", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.ingest.stop()
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


def serve_console(config: ConsoleConfig) -> None:
    """Run the console until interrupted (Ctrl-C)."""
    server = ConsoleServer(config)
    print(f"deltaflow console: {server.url} (read only; Ctrl-C stops it)", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.ingest.stop()
        server._http.server_close()
