"""The ASGI application of ``deltaflow serve`` (Starlette) and the function that runs it.

Routes::

    POST /v1/tables/{name}/events   append NDJSON / a JSON array; answered after the commit
    GET  /v1/tables/{name}          version, row count, last commit
    GET  /healthz                   200 while every table's committer runs
    GET  /metrics                   Prometheus text format

Every error is a JSON body ``{"error": {"code", "message", "retryable", ...}}``. Tokens
and bodies are never logged; access logging is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from deltaflow.ingest.http._commit import Acknowledgement, GroupCommitter
from deltaflow.ingest.http._config import ServeConfig, TableConfig
from deltaflow.ingest.http._metrics import Metrics
from deltaflow.ingest.http._parse import BodyError, RecordParser, check_supported
from deltaflow.ingest.http._table_writer import TableWriter, describe_table
from deltaflow.ingest.http.errors import IngestCommitError

log = logging.getLogger("deltaflow.serve")

# Bodies above this are parsed in a worker thread (Arrow's reader releases the GIL), so
# one big request does not stall every other connection; small ones are cheaper inline.
_PARSE_IN_THREAD_BYTES = 256 * 1024
# Printable ASCII without spaces: safe in logs, headers and the commit info.
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


@dataclass
class _Served:
    config: TableConfig
    parser: RecordParser
    committer: GroupCommitter
    max_event_bytes: int

    def current_parser(self) -> RecordParser:
        """The parser of the schema the writer serves now (it follows ADD COLUMNS)."""
        schema = self.committer.writer.arrow_schema
        if self.parser.schema is not schema:
            self.parser = RecordParser(
                schema,
                unknown_fields=self.config.unknown_fields,
                max_event_bytes=self.max_event_bytes,
            )
        return self.parser


class IngestService:
    """Tables opened, keys recovered, committers ready: everything but the socket."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.tables: dict[str, _Served] = {}
        for name, table in config.tables.items():
            writer = TableWriter(table, config)
            check_supported(writer.arrow_schema, table.uri)
            parser = RecordParser(
                writer.arrow_schema,
                unknown_fields=table.unknown_fields,
                max_event_bytes=config.max_event_bytes,
            )
            committer = GroupCommitter(writer, config, on_commit=self._committed(name))
            recovered = writer.recover_keys(config.idempotency_recover_commits)
            committer.remember(recovered)
            log.info(
                "serving table %s (%s) at version %s; %d idempotency keys recovered",
                name,
                table.uri,
                writer.table.version(),
                committer.remembered_keys,
            )
            self.tables[name] = _Served(table, parser, committer, config.max_event_bytes)
            self.metrics.gauge(
                "deltaflow_ingest_pending_bytes", committer.pending_bytes_now, table=name
            )
            self.metrics.gauge(
                "deltaflow_ingest_remembered_keys", committer.remembered_keys_now, table=name
            )
        self.app = Starlette(
            routes=[
                Route("/v1/tables/{name}/events", self.ingest, methods=["POST"]),
                Route("/v1/tables/{name}", self.table_info, methods=["GET"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.prometheus, methods=["GET"]),
            ],
            exception_handlers={HTTPException: self._http_error},  # type: ignore[dict-item]
            lifespan=self._lifespan,
        )

    def _committed(self, name: str) -> Any:
        def record(rows: int, requests: int, seconds: float) -> None:
            self.metrics.inc("deltaflow_ingest_commits_total", table=name)
            self.metrics.observe("deltaflow_ingest_commit_seconds", seconds, table=name)

        return record

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        for served in self.tables.values():
            served.committer.start()
        try:
            yield
        finally:
            # uvicorn has stopped accepting and finished open requests: commit the rest.
            for served in self.tables.values():
                await served.committer.close()

    # ---- routes ----------------------------------------------------------------------

    async def ingest(self, request: Request) -> Response:
        name = request.path_params["name"]
        served = self.tables.get(name)
        if served is None:
            return _error(404, "unknown_table", f"no table named {name!r} is served here.")
        response = await self._ingest(request, served)
        self.metrics.inc(
            "deltaflow_ingest_requests_total", table=name, status=str(response.status_code)
        )
        return response

    async def _ingest(self, request: Request, served: _Served) -> Response:
        name = served.config.name
        denied = _authenticate(request, served.config)
        if denied is not None:
            return denied
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return _error(
                415,
                "unsupported_encoding",
                f"Content-Encoding {encoding!r} is not supported: send the body uncompressed.",
            )
        key = request.headers.get("idempotency-key")
        if key is not None and not _IDEMPOTENCY_KEY.match(key):
            return _error(
                400,
                "invalid_idempotency_key",
                "Idempotency-Key must be 1-255 printable ASCII characters without spaces"
                " (a UUID is a good choice).",
            )
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return _too_large(limit)
        chunks = bytearray()
        async for chunk in request.stream():
            chunks += chunk
            if len(chunks) > limit:
                return _too_large(limit)
        body = bytes(chunks)
        started = time.monotonic()
        committer = served.committer
        if key is not None:
            known = committer.known(key)
            if known is not None:
                self.metrics.inc("deltaflow_ingest_duplicate_requests_total", table=name)
                return _ok(name, known)
        if committer.overloaded():
            return _error(
                503,
                "overloaded",
                f"table {name!r} has more uncommitted data than max_pending_bytes; retry"
                " after a second.",
                retryable=True,
                headers={"Retry-After": "1"},
            )
        content_type = request.headers.get("content-type", "")
        try:
            try:
                table = await self._parse(served, body, content_type)
            except BodyError as exc:
                # A field the table does not have may be a column another writer has just
                # added (ALTER TABLE ... ADD COLUMNS): look once, and parse again if so.
                if not _unknown_fields(exc) or not await committer.refresh_schema():
                    raise
                table = await self._parse(served, body, content_type)
        except BodyError as exc:
            self.metrics.inc(
                "deltaflow_ingest_rejected_records_total", len(exc.records), table=name
            )
            extra: dict[str, Any] = {"table": name}
            if exc.records:
                extra["records"] = [r.to_json() for r in exc.records]
                extra["truncated"] = exc.truncated
            return _error(exc.status, exc.code, exc.message, **extra)
        try:
            ack = await committer.submit(table, key)
        except IngestCommitError as exc:
            self.metrics.inc("deltaflow_ingest_commit_failures_total", table=name)
            return _error(503, "commit_failed", exc.message, retryable=True, table=name)
        if ack.duplicate:
            self.metrics.inc("deltaflow_ingest_duplicate_requests_total", table=name)
        else:
            self.metrics.inc("deltaflow_ingest_events_total", ack.rows, table=name)
            self.metrics.inc("deltaflow_ingest_bytes_total", len(body), table=name)
        self.metrics.observe("deltaflow_ingest_ack_seconds", time.monotonic() - started, table=name)
        return _ok(name, ack)

    async def _parse(self, served: _Served, body: bytes, content_type: str) -> pa.Table:
        parser = served.current_parser()
        if len(body) > _PARSE_IN_THREAD_BYTES:
            return await asyncio.to_thread(parser.parse, body, content_type)
        return parser.parse(body, content_type)

    async def table_info(self, request: Request) -> Response:
        name = request.path_params["name"]
        served = self.tables.get(name)
        if served is None:
            return _error(404, "unknown_table", f"no table named {name!r} is served here.")
        denied = _authenticate(request, served.config)
        if denied is not None:
            return denied
        info = await asyncio.to_thread(describe_table, served.config)
        return _json(200, info)

    async def healthz(self, request: Request) -> Response:
        broken = [n for n, s in self.tables.items() if not s.committer.running()]
        if broken:
            return _json(503, {"status": "unhealthy", "stopped_committers": broken})
        return _json(200, {"status": "ok", "tables": sorted(self.tables)})

    async def prometheus(self, request: Request) -> Response:
        return PlainTextResponse(
            self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        codes = {404: "not_found", 405: "method_not_allowed"}
        message = {
            404: f"no route {request.url.path!r}: see /v1/tables/{{name}}/events.",
            405: f"{request.method} is not allowed on {request.url.path!r}.",
        }.get(exc.status_code, str(exc.detail))
        return _error(exc.status_code, codes.get(exc.status_code, "http_error"), message)


def _unknown_fields(error: BodyError) -> bool:
    return any(r.reason.startswith("unknown field") for r in error.records)


def _authenticate(request: Request, table: TableConfig) -> Response | None:
    header = request.headers.get("authorization")
    if header is None:
        if table.allow_anonymous:
            return None
        return _error(
            401,
            "missing_token",
            f"table {table.name!r} needs a bearer token: send 'Authorization: Bearer <token>'.",
            headers={"WWW-Authenticate": 'Bearer realm="deltaflow"'},
        )
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not table.tokens.accepts(token.strip().encode("utf-8")):
        return _error(
            401,
            "invalid_token",
            f"the bearer token is not valid for table {table.name!r}.",
            headers={"WWW-Authenticate": 'Bearer realm="deltaflow", error="invalid_token"'},
        )
    return None


def _ok(name: str, ack: Acknowledgement) -> Response:
    return _json(
        200, {"table": name, "version": ack.version, "rows": ack.rows, "duplicate": ack.duplicate}
    )


def _too_large(limit: int) -> Response:
    return _error(
        413,
        "body_too_large",
        f"the body is larger than {limit} bytes (server option max_body_bytes): split it"
        " into several requests.",
    )


def _error(
    status: int,
    code: str,
    message: str,
    *,
    retryable: bool = False,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    body = {"error": {"code": code, "message": message, "retryable": retryable, **extra}}
    return _json(status, body, headers)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def serve(config: ServeConfig, *, ready_message: bool = True) -> None:
    """Run the service until SIGINT / SIGTERM (then commit what is pending and exit)."""
    import uvicorn

    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    service = IngestService(config)
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    host, port = sock.getsockname()[:2]
    uvicorn_config = uvicorn.Config(
        service.app,
        loop=_best("uvloop", "auto"),
        http=_best("httptools", "auto"),
        access_log=False,
        log_level=config.log_level.lower(),
        lifespan="on",
        timeout_graceful_shutdown=30,
        backlog=2048,
    )
    server = uvicorn.Server(uvicorn_config)
    if ready_message:
        print(f"deltaflow serve: listening on http://{host}:{port}", file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGINT / SIGTERM (pending events are committed and
    # acknowledged), restores the handlers it found and then raises the signal again.
    # Handlers that ignore it make that clean stop exit 0 rather than die by the signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stopped_cleanly)
    server.run(sockets=[sock])


def _stopped_cleanly(sig: int, frame: Any) -> None:
    """The signal uvicorn re-raises after its graceful shutdown: nothing left to do."""


def _best(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module
