"""Streaming queries: from the commits their Delta sinks write and their checkpoints.

A deltaflow (or delta-spark) streaming sink commits every micro-batch with an app
transaction: ``txn.appId`` is the query's id (kept in its checkpoint; for a pipeline's
flow, the flow's identity kept beside it), ``txn.version`` is the batch id. So the tables'
recent commits name every query that writes them, with the rows and commit time of each
batch. Where the query's checkpoint lies under a root too
(:mod:`deltaflow.console._checkpoints`), each batch also gets its processing time, the
end-to-end latency of the data it read from Delta sources, and the query its backlog.
"""

from __future__ import annotations

import itertools
from typing import Any

from deltaflow.console._checkpoints import Batch, Checkpoint
from deltaflow.console._table_state import TableState

# Commits per table searched for sink batches, and batches per query the page charts.
RECENT_BATCHES = 200


def streams(tables: list[TableState], checkpoints: list[Checkpoint]) -> list[dict[str, Any]]:
    """One entry per query, most recently active first."""
    found: dict[str, dict[str, Any]] = {}
    for state in tables:
        for commit in state.log.page(None, RECENT_BATCHES):
            for app_id, batch_id in commit.transactions:
                batches = _entry(found, app_id)["batches"]
                batches.setdefault(batch_id, {"batch_id": batch_id}).update(
                    table=state.id,
                    version=commit.version,
                    timestamp=commit.timestamp,
                    rows=commit.rows_added,
                )
                found[app_id]["sinks"].add(state.id)
    by_uuid = _tables_by_uuid(tables)
    for checkpoint in checkpoints:
        key = checkpoint.app_id or checkpoint.id
        entry = _entry(found, key)
        entry["checkpoint"] = checkpoint.id
        entry["last_error"] = checkpoint.last_error()
        _add_checkpoint(entry, checkpoint.batches(), by_uuid)
    out = [_summarise(entry) for entry in found.values()]
    return sorted(out, key=lambda s: -(s["last_commit"] or 0))


def readers(tables: list[TableState], checkpoints: list[Checkpoint]) -> dict[str, list[str]]:
    """Table id -> ids of the queries whose checkpoints read it."""
    by_uuid = _tables_by_uuid(tables)
    out: dict[str, list[str]] = {}
    for checkpoint in checkpoints:
        batches = checkpoint.batches()
        for source in batches[-1].sources if batches else ():
            state = by_uuid.get(source.table_id) if source is not None else None
            if state is not None:
                out.setdefault(state.id, []).append(checkpoint.app_id or checkpoint.id)
    return out


def _entry(found: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    return found.setdefault(
        key, {"app_id": key, "sinks": set(), "sources": {}, "batches": {}, "checkpoint": None}
    )


def _tables_by_uuid(tables: list[TableState]) -> dict[str, TableState]:
    out = {}
    for state in tables:
        try:
            out[state.facts().table_uuid] = state
        except Exception:  # an unreadable table is shown as such by the table list
            continue
    return out


def _add_checkpoint(
    entry: dict[str, Any], batches: list[Batch], by_uuid: dict[str, TableState]
) -> None:
    """Each batch's timing and source latency; the query's backlog per source table."""
    previous: dict[int, int] = {}  # source index -> last version the batch before read
    for batch in batches:
        row = entry["batches"].setdefault(batch.batch_id, {"batch_id": batch.batch_id})
        row["started_ms"] = batch.started_ms
        row["committed_ms"] = batch.committed_ms
        if batch.committed_ms is not None and batch.started_ms:
            row["processing_ms"] = batch.committed_ms - batch.started_ms
        done_ms = row.get("timestamp") or batch.committed_ms
        for index, source in enumerate(batch.sources):
            state = by_uuid.get(source.table_id) if source is not None else None
            if source is None or state is None:
                continue
            entry["sources"][state.id] = {"table": state.id, "read_version": source.last_version}
            first = previous.get(index, source.last_version - 1) + 1
            previous[index] = source.last_version
            if first > source.last_version or done_ms is None:
                continue  # no new source version in this batch
            oldest = state.log.commit(first)
            if oldest is not None:
                # What the oldest data the batch read had waited, up to the sink's commit.
                row["latency_ms"] = max(row.get("latency_ms", 0), done_ms - oldest.timestamp)
    for source in entry["sources"].values():
        state = next(s for s in by_uuid.values() if s.id == source["table"])
        source["latest_version"] = state.log.latest_version()
        source["versions_behind"] = max(0, source["latest_version"] - source["read_version"])


def _summarise(entry: dict[str, Any]) -> dict[str, Any]:
    batches = sorted(entry["batches"].values(), key=lambda b: b["batch_id"])[-RECENT_BATCHES:]
    for previous, batch in itertools.pairwise(batches):
        if batch.get("timestamp") and previous.get("timestamp"):
            batch["interval_ms"] = batch["timestamp"] - previous["timestamp"]
    stamped = [b for b in batches if b.get("timestamp")]
    rows = sum(b.get("rows") or 0 for b in stamped)
    span_s = (stamped[-1]["timestamp"] - stamped[0]["timestamp"]) / 1000 if stamped else 0
    last_commit = max(
        (b.get("timestamp") or b.get("committed_ms") or 0 for b in batches), default=0
    )
    return {
        "app_id": entry["app_id"],
        "checkpoint": entry["checkpoint"],
        "tables": sorted(entry["sinks"]),
        "sources": sorted(entry["sources"].values(), key=lambda s: s["table"]),
        "last_batch_id": batches[-1]["batch_id"] if batches else None,
        "last_commit": last_commit or None,
        "batches_seen": len(batches),
        "rows_seen": rows,
        "rows_per_second": round(rows / span_s, 3) if span_s > 0 else None,
        "interval_ms_p50": _quantile(
            [b["interval_ms"] for b in batches if "interval_ms" in b], 0.5
        ),
        "latency_ms_p50": _quantile([b["latency_ms"] for b in batches if "latency_ms" in b], 0.5),
        "latency_ms_p99": _quantile([b["latency_ms"] for b in batches if "latency_ms" in b], 0.99),
        "processing_ms_p50": _quantile(
            [b["processing_ms"] for b in batches if "processing_ms" in b], 0.5
        ),
        "versions_behind": max(
            (s["versions_behind"] for s in entry["sources"].values()), default=None
        ),
        "last_error": entry.get("last_error"),
        "batches": batches,
    }


def _quantile(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
