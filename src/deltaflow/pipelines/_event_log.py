"""The event log: a Delta table at ``<storage>/system/events`` with Lakeflow's columns.

``id``, ``sequence`` (JSON: ``control_plane_seq_no``, increasing per pipeline),
``origin`` (pipeline, update, flow, dataset), ``timestamp``, ``message``, ``level``,
``error``, ``details`` (JSON, one key per ``event_type``: ``create_update``,
``update_progress``, ``flow_definition``, ``flow_progress``), ``event_type``,
``maturity_level``. Query it like Lakeflow's:
``details:flow_progress.data_quality.expectations`` with ``from_json`` / ``get_json_object``.

Events are buffered and appended by delta-rs (no Spark job); the update's driver
flushes them from its own loop (at most one commit per ``pipelines.eventLog.flushInterval``
while flows run, never on a flow's critical path) and at the update's end. A crash loses
at most the unflushed events, never the tables.

``control_plane_seq_no`` increases within an update and from one update to the next,
without reading the events already logged (:func:`_sequence_base`).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

ORIGIN = pa.struct(
    [
        ("pipeline_id", pa.string()),
        ("pipeline_name", pa.string()),
        ("update_id", pa.string()),
        ("flow_id", pa.string()),
        ("flow_name", pa.string()),
        ("dataset_name", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sequence", pa.string()),
        ("origin", ORIGIN),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("message", pa.string()),
        ("level", pa.string()),
        ("error", pa.string()),
        ("details", pa.string()),
        ("event_type", pa.string()),
        ("maturity_level", pa.string()),
    ]
)


@dataclass(frozen=True)
class Origin:
    pipeline_id: str
    pipeline_name: str
    update_id: str


class EventLog:
    """Appends one update's events to the pipeline's event-log table (thread-safe: flows
    run in parallel)."""

    def __init__(
        self,
        path: str,
        origin: Origin,
        listener: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._path = path
        self._listener = listener
        self._origin = origin
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._seq = _sequence_base(path)
        self._last_flush = time.monotonic()

    def emit(
        self,
        event_type: str,
        message: str,
        details: dict[str, Any],
        *,
        level: str = "INFO",
        flow: str | None = None,
        dataset: str | None = None,
        error: str | None = None,
    ) -> None:
        with self._lock:
            self._seq += 1
            event = {
                "id": str(uuid.uuid4()),
                "sequence": json.dumps({"control_plane_seq_no": self._seq}),
                "origin": {
                    "pipeline_id": self._origin.pipeline_id,
                    "pipeline_name": self._origin.pipeline_name,
                    "update_id": self._origin.update_id,
                    "flow_id": None if flow is None else f"{self._origin.pipeline_id}.{flow}",
                    "flow_name": flow,
                    "dataset_name": dataset,
                },
                "timestamp": dt.datetime.now(dt.UTC),
                "message": message,
                "level": level,
                "error": error,
                "details": json.dumps({event_type: details}, default=str),
                "event_type": event_type,
                "maturity_level": "STABLE",
            }
            self._pending.append(event)
        if self._listener is not None:
            self._listener(event)

    def flush(self) -> None:
        """Commit the pending events (one append), now."""
        from deltalake import write_deltalake

        from deltaflow.table import _uri

        with self._lock:
            self._last_flush = time.monotonic()
            if not self._pending:
                return
            batch = pa.Table.from_pylist(self._pending, schema=SCHEMA)
            write_deltalake(_uri.delta_rs_uri(_uri.normalize_uri(self._path)), batch, mode="append")
            self._pending.clear()

    def flush_every(self, seconds: float) -> None:
        """Commit the pending events if the last commit is ``seconds`` old: many events,
        few commits (each is a log entry every reader of the log replays)."""
        if time.monotonic() - self._last_flush >= seconds:
            self.flush()


def _sequence_base(path: str) -> int:
    """Where an update's numbering starts: ``(v + 1) << 32``, ``v`` the log's version now
    (-1 for no log: a first update numbers from 1). An earlier update that logged
    anything committed at a version in ``(its v, v]``, so its numbers, below ``(its v +
    2) << 32``, are below ours; an update's events are fewer than 2**32. Reading the
    version needs no data file, unlike a maximum over the events."""
    from deltalake import DeltaTable

    from deltaflow.table import _uri
    from deltaflow.table._snapshot import table_exists

    uri = _uri.normalize_uri(path)
    if not table_exists(uri):
        return 0
    version = DeltaTable(_uri.delta_rs_uri(uri)).version()
    return (version + 1) << 32


def read_events(path: str) -> list[dict[str, Any]]:
    """Every event, in sequence order (for tests and the CLI's summary)."""
    from deltalake import DeltaTable

    from deltaflow.table import _uri

    rows = DeltaTable(_uri.delta_rs_uri(_uri.normalize_uri(path))).to_pyarrow_table().to_pylist()
    for row in rows:
        row["details"] = json.loads(row["details"])
    return sorted(rows, key=lambda r: json.loads(r["sequence"])["control_plane_seq_no"])
