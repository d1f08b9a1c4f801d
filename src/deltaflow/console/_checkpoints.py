"""Streaming queries seen through their checkpoints (when they lie under the roots).

A Structured Streaming checkpoint holds ``metadata`` (the query id: the app id its Delta
sink commits with; a pipeline flow's commits are keyed by the flow's identity, kept beside
it in ``deltaflow-flow-id``), ``offsets/<batch>`` (written when a batch starts: its start
time and each source's end offset) and ``commits/<batch>`` (written when it finished). For Delta
sources the offset names the table (``reservoirId``, the table's metaData id) and the
version read up to, so the console can tell, per batch, how long it took, how long
the data it read had waited (end-to-end latency), and how far the query is behind.
Batch files are immutable once written: each is read once.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from deltaflow.pipelines._flow_identity import IDENTITY_FILE

# Batches read per checkpoint (Spark keeps 100 by default: spark.sql.streaming.minBatchesToRetain).
RECENT_BATCHES = 100


@dataclass(frozen=True)
class SourceRead:
    """What one batch read from one Delta source: versions up to ``last_version``."""

    table_id: str  # the source table's metaData id (reservoirId)
    last_version: int  # the newest version whose changes the batch read completely


@dataclass(frozen=True)
class Batch:
    batch_id: int
    started_ms: int  # batchTimestampMs
    committed_ms: int | None  # commits/<batch> written; None while it runs
    sources: tuple[SourceRead | None, ...]  # None: not a Delta source


class Checkpoint:
    """One checkpoint directory: its query id and the recent batches, read once each."""

    def __init__(self, path: str, checkpoint_id: str) -> None:
        self.path = path
        self.id = checkpoint_id
        self.query_id = _query_id(path)
        # The app id of the query's sink commits, which pairs the checkpoint with them.
        self.app_id = _flow_identity(path) or self.query_id
        self._batches: dict[int, Batch] = {}
        self._lock = threading.Lock()

    def last_error(self) -> dict[str, Any] | None:
        """The query's last failure as deltaflow's session recorded it beside the checkpoint
        (``_deltaflow/last_error.json``: id, runId, timestamp, errorClass, message)."""
        try:
            with open(os.path.join(self.path, "_deltaflow", "last_error.json")) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def batches(self) -> list[Batch]:
        """The recent batches, oldest first (a running batch last, without a commit)."""
        with self._lock:
            offsets = _batch_ids(os.path.join(self.path, "offsets"))[-RECENT_BATCHES:]
            committed = set(_batch_ids(os.path.join(self.path, "commits")))
            out = []
            for batch_id in offsets:
                batch = self._batches.get(batch_id)
                if batch is None or (batch.committed_ms is None and batch_id in committed):
                    batch = self._read(batch_id, batch_id in committed)
                    if batch is None:
                        continue
                    self._batches[batch_id] = batch
                out.append(batch)
            for old in [b for b in self._batches if b < (offsets[0] if offsets else 0)]:
                del self._batches[old]
            return out

    def _read(self, batch_id: int, committed: bool) -> Batch | None:
        try:
            with open(os.path.join(self.path, "offsets", str(batch_id)), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return None
        committed_ms = None
        if committed:
            try:
                stat = os.stat(os.path.join(self.path, "commits", str(batch_id)))
                committed_ms = int(stat.st_mtime * 1000)
            except FileNotFoundError:
                committed_ms = None
        started = _json(lines[1]) if len(lines) > 1 else {}
        sources = tuple(_source(line) for line in lines[2:])
        return Batch(batch_id, int(started.get("batchTimestampMs") or 0), committed_ms, sources)


def _query_id(path: str) -> str | None:
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError):
        return None


def _flow_identity(path: str) -> str | None:
    try:
        with open(os.path.join(path, IDENTITY_FILE), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _batch_ids(folder: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(folder) if n.isdigit())
    except FileNotFoundError:
        return []


def _json(line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _source(line: str) -> SourceRead | None:
    offset = _json(line)
    if "reservoirId" not in offset or "reservoirVersion" not in offset:
        return None
    version = int(offset["reservoirVersion"])
    # index -1: the offset sits before any file of that version, which is not read yet.
    last = version if int(offset.get("index", -1)) >= 0 else version - 1
    return SourceRead(str(offset["reservoirId"]), last)


def is_checkpoint(path: str, dirs: list[str], files: list[str]) -> bool:
    return "metadata" in files and "offsets" in dirs
