"""Streaming queries seen through the tables they write.

A deltaflow (or delta-spark) streaming sink commits every micro-batch with an app
transaction: ``txn.appId`` is stable for the query's checkpoint, ``txn.version`` is the
batch id. Grouping the tables' recent commits by appId gives each query's batches: when
they committed, how many rows, and so its rate and the gaps between batches.
"""

from __future__ import annotations

import itertools
from typing import Any

from deltaflow.console._table_state import TableState

# Batches per query the page charts; older ones are summarised only by the counts.
RECENT_BATCHES = 200


def streams(tables: list[TableState]) -> list[dict[str, Any]]:
    """One entry per appId found in the tables' last commits, most recent first."""
    found: dict[str, dict[str, Any]] = {}
    for state in tables:
        for commit in state.log.page(None, RECENT_BATCHES):
            for app_id, batch in commit.transactions:
                entry = found.setdefault(app_id, {"app_id": app_id, "tables": set(), "batches": []})
                entry["tables"].add(state.id)
                entry["batches"].append(
                    {
                        "table": state.id,
                        "version": commit.version,
                        "batch_id": batch,
                        "timestamp": commit.timestamp,
                        "rows": commit.rows_added,
                        "query_id": commit.parameters.get("queryId"),
                    }
                )
    out = [_summarise(entry) for entry in found.values()]
    return sorted(out, key=lambda s: -s["last_commit"])


def _summarise(entry: dict[str, Any]) -> dict[str, Any]:
    batches = sorted(entry["batches"], key=lambda b: (b["timestamp"], b["batch_id"]))
    batches = batches[-RECENT_BATCHES:]
    for previous, batch in itertools.pairwise(batches):
        batch["interval_ms"] = batch["timestamp"] - previous["timestamp"]
    rows = sum(b["rows"] or 0 for b in batches)
    span_s = (batches[-1]["timestamp"] - batches[0]["timestamp"]) / 1000 if batches else 0
    intervals = sorted(b["interval_ms"] for b in batches if "interval_ms" in b)
    return {
        "app_id": entry["app_id"],
        "query_id": batches[-1]["query_id"],
        "tables": sorted(entry["tables"]),
        "last_batch_id": max(b["batch_id"] for b in batches),
        "last_commit": batches[-1]["timestamp"],
        "batches_seen": len(batches),
        "rows_seen": rows,
        "rows_per_second": round(rows / span_s, 3) if span_s > 0 else None,
        "interval_ms_p50": _quantile(intervals, 0.5),
        "interval_ms_p99": _quantile(intervals, 0.99),
        "batches": batches,
    }


def _quantile(values: list[int], q: float) -> int | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]
