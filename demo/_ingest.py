"""Stage 1 of the demo: trackers send live events two ways into one bronze Delta table.

- Most events are POSTed as NDJSON to ``deltaflow serve`` (started here as a subprocess on a
  free 127.0.0.1 port, with a TOML config and a bearer token), each request with an
  ``Idempotency-Key``. Some requests are sent twice with the same key, as a client that
  lost the acknowledgement would: the service must answer ``duplicate: true`` and write
  nothing.
- The rest (trackers that sync through a phone app) arrive as NDJSON files dropped into a
  landing folder by write-aside + atomic rename; ``spark.readStream.format("cloudFiles")``
  appends them to the same bronze table. That path is at-least-once at the source: the app
  re-uploads a few events, and now and then a line is cut short (it lands in
  ``_rescued_data``).

A small share of events carry a GPS glitch (0, 0 or a latitude beyond 90). Bronze keeps
everything as it arrived; silver (``_pipeline.py``) cleans it. The :class:`LiveFeed` keeps
what it sent, so every later number can be checked against it.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from demo._checks import DemoRunError

from deltaflow.testing import DeviceEventGenerator

TABLE_NAME = "device_events"
TOKEN_ENV = "DELTAFLOW_DEMO_INGEST_TOKEN"
# The bronze schema: the generator's columns (nullable, since a cut-short line in a landing
# file has none of them) plus _rescued_data, which both paths fill: the service with
# unknown top-level fields, cloudFiles with lines that do not parse or fit.
BRONZE_DDL = (
    "event_id STRING, device_id STRING, user_id STRING, state STRING, event_type STRING, "
    "latitude DOUBLE, longitude DOUBLE, heart_rate INT, steps INT, battery_pct INT, "
    "event_time TIMESTAMP, event_date DATE"
)
BRONZE_DDL_RESCUED = BRONZE_DDL + ", _rescued_data STRING"
SERVER_START_TIMEOUT_S = 60.0
SERVER_STOP_TIMEOUT_S = 30.0
# Landing-file share and fault rates. Small enough that the numbers stay readable, large
# enough that even the test's short run has some of each.
FILE_SHARE = 0.2
GPS_GLITCH_RATE = 0.002
REUPLOAD_RATE = 0.01
CORRUPT_FILE_EVERY = 7
RETRY_REQUEST_EVERY = 10


def _land(landing: Path | str, name: str, data: bytes) -> None:
    """One landing file, appearing whole: on disk written aside (hidden: cloudFiles
    ignores it) and renamed; on an object store one PUT, which publishes it whole."""
    if isinstance(landing, str):
        from deltaflow.table import _uri

        fs, folder = _uri.filesystem(landing)
        with fs.open_output_stream(f"{folder}/{name}") as out:
            out.write(data)
        return
    aside = landing / f".{name}.tmp"
    with open(aside, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(aside, landing / name)


class IngestError(DemoRunError):
    """The ingest service did not start, or refused events it should have taken."""


@dataclass
class IngestServer:
    """A running ``deltaflow serve`` subprocess."""

    process: subprocess.Popen[bytes]
    port: int
    token: str
    log_path: Path

    def client(self) -> IngestClient:
        return IngestClient(self.port, self.token)

    def stop(self) -> int:
        """SIGTERM (the service commits what is queued, then exits); returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=SERVER_STOP_TIMEOUT_S)
                raise IngestError(
                    f"deltaflow serve did not stop within {SERVER_STOP_TIMEOUT_S:.0f}s of "
                    f"SIGTERM and was killed; see {self.log_path}"
                ) from None
        return int(self.process.returncode)


def write_serve_config(config_dir: Path, table_uri: str, max_delay_ms: float) -> Path:
    config_dir.mkdir(parents=True, exist_ok=True)
    # A local table as a plain path (as a user would write it); s3:// as it is.
    parsed = urllib.parse.urlparse(table_uri)
    table_path = urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else table_uri
    path = config_dir / "serve.toml"
    path.write_text(
        "[server]\n"
        'host = "127.0.0.1"\n'
        "port = 0  # any free port; the service prints the one it got\n"
        f"group_commit_max_delay_ms = {max_delay_ms}\n"
        'log_level = "warning"\n'
        "\n"
        f"[tables.{TABLE_NAME}]\n"
        f'path = "{table_path}"\n'
        f'schema = "{BRONZE_DDL}"\n'
        'partition_by = ["event_date"]\n'
        'unknown_fields = "rescue"\n'
        f'tokens_env = "{TOKEN_ENV}"\n'
    )
    return path


@contextlib.contextmanager
def running_server(config_path: Path, log_path: Path) -> Iterator[IngestServer]:
    """Start ``deltaflow serve --config ...``, wait for ``/healthz``, stop it on exit."""
    token = secrets.token_urlsafe(24)
    env = {**os.environ, TOKEN_ENV: token}
    log = open(log_path, "ab")  # noqa: SIM115 - closed below, after the process is gone
    process = subprocess.Popen(
        [sys.executable, "-m", "deltaflow.cli", "serve", "--config", str(config_path)],
        stdout=log,
        stderr=subprocess.PIPE,
        env=env,
    )
    port_found: queue.Queue[int] = queue.Queue()
    copier = threading.Thread(
        target=_copy_stderr, args=(process, log, port_found), daemon=True, name="serve-stderr"
    )
    copier.start()
    server: IngestServer | None = None
    try:
        try:
            port = port_found.get(timeout=SERVER_START_TIMEOUT_S)
        except queue.Empty:
            raise IngestError(
                f"deltaflow serve did not report its port within {SERVER_START_TIMEOUT_S:.0f}s"
                f" (exit code {process.poll()}); see {log_path}"
            ) from None
        server = IngestServer(process, port, token, log_path)
        _wait_healthy(server)
        yield server
    finally:
        if server is not None:
            server.stop()
        elif process.poll() is None:
            process.kill()
            process.wait(timeout=SERVER_STOP_TIMEOUT_S)
        copier.join(timeout=SERVER_STOP_TIMEOUT_S)
        log.close()


def _copy_stderr(process: subprocess.Popen[bytes], log: Any, port_found: queue.Queue[int]) -> None:
    assert process.stderr is not None
    marker = b"listening on http://"
    for line in process.stderr:
        log.write(line)
        log.flush()
        if marker in line:
            port_found.put(int(line.rsplit(b":", 1)[1].strip()))


def _wait_healthy(server: IngestServer) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if server.process.poll() is not None:
            raise IngestError(
                f"deltaflow serve exited with code {server.process.returncode} during start-up;"
                f" see {server.log_path}"
            )
        with contextlib.suppress(OSError):
            status, _ = server.client().get("/healthz")
            if status == 200:
                return
        if time.monotonic() > deadline:
            raise IngestError(f"/healthz did not answer 200 within {SERVER_START_TIMEOUT_S:.0f}s")
        time.sleep(0.05)  # poll interval of the bounded wait above


class IngestClient:
    """A keep-alive HTTP client for one thread."""

    def __init__(self, port: int, token: str) -> None:
        self._port = port
        self._token = token
        self._connection: http.client.HTTPConnection | None = None

    def get(self, path: str) -> tuple[int, bytes]:
        return self._request("GET", path, None, {})

    def post_events(self, body: bytes, key: str) -> tuple[int, dict[str, Any]]:
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Idempotency-Key": key,
            "Content-Type": "application/x-ndjson",
        }
        status, raw = self._request("POST", f"/v1/tables/{TABLE_NAME}/events", body, headers)
        return status, orjson.loads(raw)

    def _request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            if self._connection is None:
                self._connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
            try:
                self._connection.request(method, path, body=body, headers=headers)
                response = self._connection.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # A keep-alive connection the server closed: reconnect once. Safe for POSTs
                # because they carry an idempotency key.
                self._connection.close()
                self._connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


@dataclass
class FeedStats:
    """What the feed sent and what the service acknowledged. Filled by the feeding thread."""

    http_events: int = 0  # events in acknowledged requests (first attempts)
    http_requests: int = 0
    retries: int = 0  # requests sent again with the same key
    retries_answered_duplicate: int = 0
    ack_latencies_ms: list[float] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)
    file_events: int = 0  # distinct events in landing files
    files: int = 0
    file_lines: int = 0  # lines written: events, re-uploads and cut-short lines
    reuploads: int = 0
    corrupt_lines: int = 0
    gps_glitches: int = 0
    seconds: float = 0.0
    # Every event sent (once), GPS glitches included, with the path it took.
    sent: list[pa.Table] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.http_events + self.file_events

    def sent_table(self) -> pa.Table:
        if not self.sent:
            return pa.table({})
        return pa.concat_tables(self.sent, promote_options="default")


class LiveFeed:
    """A thread that sends the generator's next events at ``rate`` events/s until stopped.

    Each cycle takes ``requests_per_cycle * events_per_request / (1 - FILE_SHARE)`` events,
    writes the landing-file share as one file, and POSTs the rest as concurrent requests,
    waiting for every acknowledgement before the next cycle (a client that waits for its
    acks, as the docs ask).
    """

    def __init__(
        self,
        generator: DeviceEventGenerator,
        server: IngestServer,
        landing_dir: Path | str,
        rate: float,
        events_per_request: int,
        requests_per_cycle: int = 4,
        seed: int = 0,
    ) -> None:
        self.generator = generator
        self.server = server
        self.landing_dir = landing_dir
        self.rate = rate
        self.events_per_request = events_per_request
        self.requests_per_cycle = requests_per_cycle
        self.stats = FeedStats()
        self.error: BaseException | None = None
        self._rng = np.random.default_rng([seed, 4242])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="live-feed")
        self._clients = threading.local()
        self._all_clients: list[IngestClient] = []
        self._lock = threading.Lock()
        self._request_no = 0
        # Event time of the first and of the newest event sent (the generator's times never
        # decrease): how far the streams' watermarks can have moved.
        self.first_event_time: datetime | None = None
        self.newest_event_time: datetime | None = None

    def start(self) -> None:
        if isinstance(self.landing_dir, Path):
            self.landing_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> FeedStats:
        """Stop after the current cycle (all its requests acknowledged, its file renamed)."""
        self._stop.set()
        self._thread.join(timeout=120)
        if self._thread.is_alive():
            raise IngestError("the live feed did not stop within 120s")
        if self.error is not None:
            raise IngestError(f"the live feed failed: {self.error!r}") from self.error
        return self.stats

    @property
    def failed(self) -> bool:
        return self.error is not None

    def _run(self) -> None:
        started = time.perf_counter()
        http_per_cycle = self.requests_per_cycle * self.events_per_request
        cycle = round(http_per_cycle / (1 - FILE_SHARE))
        try:
            with ThreadPoolExecutor(self.requests_per_cycle, "ingest-client") as pool:
                while not self._stop.is_set():
                    events = self._with_gps_glitches(self.generator.batch(cycle))
                    to_file = self._rng.random(events.num_rows) < FILE_SHARE
                    file_part = events.filter(pa.array(to_file))
                    http_part = events.filter(pa.array(~to_file))
                    self._write_landing_file(file_part)
                    bodies = [
                        http_part.slice(offset, self.events_per_request)
                        for offset in range(0, http_part.num_rows, self.events_per_request)
                    ]
                    for _ in pool.map(self._post, bodies):
                        pass
                    self.stats.sent.append(_tag(http_part, "http"))
                    self.stats.sent.append(_tag(file_part, "file"))
                    times = events.column("event_time")
                    if self.first_event_time is None:
                        self.first_event_time = times[0].as_py()
                    self.newest_event_time = times[-1].as_py()
                    # Pace to the target rate: sleep only when ahead of schedule.
                    ahead = self.stats.events / self.rate - (time.perf_counter() - started)
                    if ahead > 0:
                        self._stop.wait(ahead)
        except BaseException as exc:
            self.error = exc
        finally:
            self.stats.seconds = time.perf_counter() - started
            for client in self._all_clients:
                client.close()

    def _client(self) -> IngestClient:
        client = getattr(self._clients, "client", None)
        if client is None:
            client = self.server.client()
            self._clients.client = client
            with self._lock:
                self._all_clients.append(client)
        return client

    def _post(self, events: pa.Table) -> None:
        with self._lock:
            self._request_no += 1
            number = self._request_no
        key = f"demo-{self.generator.seed}-{number:08d}"
        body = ndjson(events)
        sent = time.perf_counter()
        status, reply = self._client().post_events(body, key)
        latency_ms = (time.perf_counter() - sent) * 1000
        if status != 200 or reply.get("duplicate") or reply.get("rows") != events.num_rows:
            raise IngestError(f"request {key}: HTTP {status} {reply}")
        again = None
        if number % RETRY_REQUEST_EVERY == 0:
            # A client that lost the ack resends the same request with the same key.
            status, again = self._client().post_events(body, key)
            if status != 200 or again.get("version") != reply["version"]:
                raise IngestError(f"retry of {key}: HTTP {status} {again}, first {reply}")
        with self._lock:
            self.stats.http_requests += 1
            self.stats.http_events += events.num_rows
            self.stats.ack_latencies_ms.append(latency_ms)
            self.stats.versions.add(int(reply["version"]))
            if again is not None:
                self.stats.retries += 1
                self.stats.retries_answered_duplicate += bool(again.get("duplicate"))

    def _with_gps_glitches(self, events: pa.Table) -> pa.Table:
        glitch = self._rng.random(events.num_rows) < GPS_GLITCH_RATE
        if not glitch.any():
            return events
        null_island = glitch & (self._rng.random(events.num_rows) < 0.5)
        beyond = glitch & ~null_island
        lat = events["latitude"].to_numpy().copy()
        lon = events["longitude"].to_numpy().copy()
        lat[null_island], lon[null_island] = 0.0, 0.0
        lat[beyond] = lat[beyond] + 100.0  # past the pole
        self.stats.gps_glitches += int(glitch.sum())
        events = events.set_column(
            events.schema.get_field_index("latitude"), "latitude", pa.array(lat)
        )
        return events.set_column(
            events.schema.get_field_index("longitude"), "longitude", pa.array(lon)
        )

    def _write_landing_file(self, events: pa.Table) -> None:
        if events.num_rows == 0:
            return
        self.stats.files += 1
        number = self.stats.files
        lines = ndjson(events).splitlines(keepends=True)
        reupload = np.flatnonzero(self._rng.random(len(lines)) < REUPLOAD_RATE)
        lines.extend(lines[i] for i in reupload)  # the app sent these again
        if number % CORRUPT_FILE_EVERY == 0:
            lines.append(lines[0][: len(lines[0]) // 2] + b"\n")  # cut short mid-upload
            self.stats.corrupt_lines += 1
        name = f"events-{number:06d}.json"
        _land(self.landing_dir, name, b"".join(lines))
        self.stats.file_events += events.num_rows
        self.stats.file_lines += len(lines)
        self.stats.reuploads += len(reupload)


def ndjson(events: pa.Table) -> bytes:
    """Events as NDJSON: ISO 8601 UTC times, YYYY-MM-DD dates (what the service expects)."""
    option = orjson.OPT_APPEND_NEWLINE
    return b"".join(orjson.dumps(row, option=option) for row in events.to_pylist())


def _tag(events: pa.Table, path: str) -> pa.Table:
    return events.append_column("path", pa.array([path] * events.num_rows, pa.string()))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


def count_by(table: pa.Table, column: str, value: str) -> int:
    return int(pc.sum(pc.equal(table[column], value).cast(pa.int64())).as_py() or 0)
