"""Declarative pipelines seen through their event logs (``<storage>/system/events``).

The event log is a Delta table of Lakeflow-shaped events (deltaflow.pipelines._event_log):
``flow_definition`` gives the dataflow graph (each flow's inputs and output dataset),
``update_progress`` each update's states, ``flow_progress`` each flow's status, rows and
expectation counts. A table is taken for an event log when its path ends in
``system/events`` and it has the event log's columns. Its events are read again only
when it gets a new version.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from deltalake import DeltaTable, QueryBuilder

from deltaflow.console._table_state import TableState
from deltaflow.table._arrow import read_stream

_COLUMNS = ("sequence", "origin", "timestamp", "message", "level", "error", "details", "event_type")
# Updates listed per pipeline (the newest); the graph and the flows are the newest one's.
RECENT_UPDATES = 20


class PipelineViews:
    """Pipeline summaries per event-log table, cached against its version."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def pipelines(self, tables: list[TableState]) -> list[dict[str, Any]]:
        out = []
        for state in tables:
            if not is_event_log(state):
                continue
            version = state.log.latest_version()
            with self._lock:
                cached = self._cache.get(state.id)
            if cached is None or cached[0] != version:
                cached = (version, summarise(state.id, _events(state.path, version)))
                with self._lock:
                    self._cache[state.id] = cached
            out.append(cached[1])
        return out


def is_event_log(state: TableState) -> bool:
    if not (state.id == "system/events" or state.id.endswith("/system/events")):
        return False
    names = {f["name"] for f in state.facts().schema.get("fields", [])}
    return {"origin", "details", "event_type", "sequence"} <= names


def _events(path: str, version: int) -> list[dict[str, Any]]:
    table = DeltaTable(path, version=version)
    query = f"SELECT {', '.join(_COLUMNS)} FROM events"
    rows = read_stream(QueryBuilder().register("events", table).execute(query)).to_pylist()
    for row in rows:
        try:
            row["details"] = json.loads(row["details"] or "{}")
            row["seq"] = json.loads(row["sequence"] or "{}").get("control_plane_seq_no", 0)
        except ValueError:
            row["details"], row["seq"] = {}, 0
    return sorted(rows, key=lambda r: r["seq"])


def summarise(table_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The pipeline of one event log: its updates, the newest update's graph and flows,
    and expectation pass / fail counts per dataset."""
    updates: dict[str, dict[str, Any]] = {}
    for event in events:
        origin = event.get("origin") or {}
        update_id = origin.get("update_id") or "?"
        update = updates.setdefault(
            update_id,
            {
                "update_id": update_id,
                "pipeline_id": origin.get("pipeline_id"),
                "pipeline_name": origin.get("pipeline_name"),
                "started": _ms(event["timestamp"]),
                "state": None,
                "states": [],
                "flows": {},
                "definitions": {},
                "errors": [],
            },
        )
        update["last_event"] = _ms(event["timestamp"])
        details = event["details"].get(event["event_type"]) or {}
        kind = event["event_type"]
        if kind == "update_progress":
            update["state"] = details.get("state")
            update["states"].append({"state": details.get("state"), "at": _ms(event["timestamp"])})
        elif kind == "flow_definition":
            update["definitions"][origin.get("flow_name")] = details
        elif kind == "flow_progress":
            _flow_progress(update, origin, details, event)
        if event.get("level") == "ERROR" and event.get("error"):
            update["errors"].append({"message": event["message"], "error": event["error"]})
    ordered = sorted(updates.values(), key=lambda u: u["started"] or 0)
    latest = ordered[-1] if ordered else None
    return {
        "id": table_id,
        "event_log": table_id,
        "pipeline_id": latest["pipeline_id"] if latest else None,
        "pipeline_name": latest["pipeline_name"] if latest else None,
        "updates": [_update_row(u) for u in reversed(ordered[-RECENT_UPDATES:])],
        "graph": _graph(latest) if latest else {"nodes": [], "edges": []},
        "flows": [_flow_row(f) for f in sorted(latest["flows"].values(), key=lambda f: f["name"])]
        if latest
        else [],
        "expectations": _expectations(latest) if latest else [],
    }


def _flow_progress(
    update: dict[str, Any], origin: dict[str, Any], details: dict[str, Any], event: dict[str, Any]
) -> None:
    name = origin.get("flow_name") or "?"
    flow = update["flows"].setdefault(
        name,
        {"name": name, "dataset": origin.get("dataset_name"), "rows": 0, "expectations": {}},
    )
    flow["status"] = details.get("status")
    flow["at"] = _ms(event["timestamp"])
    if details.get("trigger"):  # continuous updates: ProcessingTime or RealTime
        flow["trigger"] = details["trigger"]
    if event.get("error"):
        flow["error"] = event["error"]
    rows = (details.get("metrics") or {}).get("num_output_rows")
    if isinstance(rows, int):
        flow["rows"] += rows
    for rule in (details.get("data_quality") or {}).get("expectations") or []:
        key = (rule.get("dataset") or flow["dataset"], rule.get("name"))
        counts = flow["expectations"].setdefault(key, [0, 0])
        counts[0] += int(rule.get("passed_records") or 0)
        counts[1] += int(rule.get("failed_records") or 0)


def _flow_row(flow: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flow.items() if k != "expectations"}  # those are listed apart


def _update_row(update: dict[str, Any]) -> dict[str, Any]:
    return {
        "update_id": update["update_id"],
        "state": update["state"],
        "started": update["started"],
        "last_event": update.get("last_event"),
        "states": update["states"],
        "errors": update["errors"][-5:],
    }


def _graph(update: dict[str, Any]) -> dict[str, Any]:
    """Datasets as nodes (their layer: the longest path from a source), flows as edges."""
    edges = []
    nodes: dict[str, dict[str, Any]] = {}
    for flow_name, definition in update["definitions"].items():
        target = definition.get("output_dataset") or flow_name
        nodes.setdefault(target, {"name": target, "kind": definition.get("output_kind")})
        status = (update["flows"].get(flow_name) or {}).get("status")
        nodes[target]["status"] = status
        for source in definition.get("input_datasets") or []:
            nodes.setdefault(source, {"name": source, "kind": "source"})
            edges.append({"from": source, "to": target, "flow": flow_name})
    layer = {name: 0 for name in nodes}
    for _ in range(len(nodes)):  # relax: a DAG settles within len(nodes) rounds
        changed = False
        for edge in edges:
            if layer[edge["to"]] < layer[edge["from"]] + 1:
                layer[edge["to"]] = layer[edge["from"]] + 1
                changed = True
        if not changed:
            break
    for name, node in nodes.items():
        node["layer"] = layer[name]
    return {"nodes": sorted(nodes.values(), key=lambda n: (n["layer"], n["name"])), "edges": edges}


def _expectations(update: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for flow in update["flows"].values():
        for (dataset, name), (passed, failed) in flow["expectations"].items():
            total = passed + failed
            out.append(
                {
                    "dataset": dataset,
                    "name": name,
                    "flow": flow["name"],
                    "passed_records": passed,
                    "failed_records": failed,
                    "pass_rate": round(passed / total, 4) if total else None,
                }
            )
    return sorted(out, key=lambda e: (e["dataset"] or "", e["name"] or ""))


def _ms(value: Any) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None
