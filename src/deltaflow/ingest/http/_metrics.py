"""Prometheus text exposition (format 0.0.4) of the ingest service's counters.

Hand-rolled rather than a client library: a handful of counters and histograms,
updated from the event loop only, so no locking is needed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

# Seconds; acknowledgement latency is dominated by group commits of 5-100 ms.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[tuple[str, str], ...]

_HELP = {
    "deltaflow_ingest_requests_total": ("counter", "Ingest requests answered, by status code."),
    "deltaflow_ingest_events_total": ("counter", "Events committed (acknowledged)."),
    "deltaflow_ingest_bytes_total": ("counter", "Request body bytes of committed requests."),
    "deltaflow_ingest_duplicate_requests_total": (
        "counter",
        "Requests answered from an idempotency key without writing.",
    ),
    "deltaflow_ingest_rejected_records_total": ("counter", "Records reported as invalid."),
    "deltaflow_ingest_commits_total": ("counter", "Delta commits (one per group)."),
    "deltaflow_ingest_commit_failures_total": ("counter", "Groups whose commit failed."),
    "deltaflow_ingest_commit_seconds": ("histogram", "Time to write and commit one group."),
    "deltaflow_ingest_ack_seconds": (
        "histogram",
        "Time from a request's body being read to its acknowledgement.",
    ),
    "deltaflow_ingest_pending_bytes": ("gauge", "Accepted bytes not yet committed."),
    "deltaflow_ingest_remembered_keys": ("gauge", "Idempotency keys remembered."),
}


class _Histogram:
    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BUCKETS)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        position = bisect.bisect_left(LATENCY_BUCKETS, value)
        if position < len(self.buckets):
            self.buckets[position] += 1
        self.count += 1
        self.total += value


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[tuple[str, Labels], float] = {}
        self._histograms: dict[tuple[str, Labels], _Histogram] = {}
        self._gauges: dict[tuple[str, Labels], Callable[[], float]] = {}

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self._counters[key] = self._counters.get(key, 0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        histogram = self._histograms.get(key)
        if histogram is None:
            histogram = self._histograms[key] = _Histogram()
        histogram.observe(value)

    def gauge(self, name: str, read: Callable[[], float], **labels: str) -> None:
        self._gauges[(name, tuple(sorted(labels.items())))] = read

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, text) in _HELP.items():
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for (metric, labels), value in sorted(self._counters.items()):
                if metric == name:
                    lines.append(f"{name}{_labels(labels)} {_number(value)}")
            for (metric, labels), read in sorted(self._gauges.items()):
                if metric == name:
                    lines.append(f"{name}{_labels(labels)} {_number(read())}")
            for (metric, labels), histogram in sorted(self._histograms.items()):
                if metric != name:
                    continue
                cumulative = 0
                for bound, count in zip(LATENCY_BUCKETS, histogram.buckets, strict=True):
                    cumulative += count
                    le = (*labels, ("le", repr(bound)))
                    lines.append(f"{name}_bucket{_labels(le)} {cumulative}")
                lines.append(f"{name}_bucket{_labels((*labels, ('le', '+Inf')))} {histogram.count}")
                lines.append(f"{name}_sum{_labels(labels)} {_number(histogram.total)}")
                lines.append(f"{name}_count{_labels(labels)} {histogram.count}")
        return "\n".join(lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
