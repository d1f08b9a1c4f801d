"""``deltaflow serve``'s metrics, scraped from its Prometheus ``/metrics`` endpoint.

Counters only say "so far"; rates and latency percentiles need two samples. A background
thread scrapes every ``--ingest`` URL every :data:`SCRAPE_SECONDS` and keeps the recent
samples, so the page can show events/s, rejects/s and acknowledgement latency over time.
Only the URLs given on the command line are ever fetched.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import urllib.request
from collections import deque
from typing import Any

SCRAPE_SECONDS = 2.0
_KEEP = 300  # samples per service: 10 minutes at one every 2 s
# Latency percentiles over the last this many samples (about 20 s).
_WINDOW = 10
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Sample:
    """Prometheus text format: ``name{labels} value`` lines, comments skipped."""
    out: Sample = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match is None:
            continue
        name, _, labels, value = match.groups()
        pairs = tuple(sorted(_LABEL.findall(labels or "")))
        try:
            out[(name, pairs)] = float(value)
        except ValueError:
            continue
    return out


class IngestWatcher:
    """Scrapes each service's ``/metrics`` in a background thread."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls = urls
        self._samples: dict[str, deque[tuple[float, Sample]]] = {
            u: deque(maxlen=_KEEP) for u in urls
        }
        self._errors: dict[str, str | None] = dict.fromkeys(urls)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.urls and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-ingest", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            for url in self.urls:
                self.scrape(url)
            if self._stop.wait(SCRAPE_SECONDS):
                return

    def scrape(self, url: str) -> None:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=2) as response:
                sample = parse_metrics(response.read().decode("utf-8"))
        except (OSError, ValueError) as exc:
            with self._lock:
                self._errors[url] = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self._samples[url].append((time.time(), sample))
            self._errors[url] = None

    def services(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_service(url, list(self._samples[url]), self._errors[url]) for url in self.urls]


def _service(url: str, samples: list[tuple[float, Sample]], error: str | None) -> dict[str, Any]:
    tables = sorted(
        {dict(labels).get("table", "") for _, sample in samples[-1:] for _, labels in sample} - {""}
    )
    series = []
    for (t0, before), (t1, after) in itertools.pairwise(samples):
        span = t1 - t0
        if span <= 0:
            continue
        point: dict[str, Any] = {"t": int(t1 * 1000)}
        for table in tables:
            point[table] = {
                "events_per_second": round(_delta(before, after, _EVENTS, table) / span, 2),
                "rejects_per_second": round(_delta(before, after, _REJECTS, table) / span, 2),
                "ack_ms_p99": _quantile(before, after, table, 0.99),
            }
        series.append(point)
    latest = samples[-1][1] if samples else {}
    window = samples[-_WINDOW - 1] if len(samples) > _WINDOW else (samples[0] if samples else None)
    base = window[1] if window is not None else {}
    return {
        "url": url,
        "up": error is None and bool(samples),
        "error": error,
        "scraped_at": int(samples[-1][0] * 1000) if samples else None,
        "tables": [
            {
                "table": table,
                "events_total": _total(latest, _EVENTS, table),
                "rejected_total": _total(latest, _REJECTS, table),
                "commits_total": _total(latest, "deltaflow_ingest_commits_total", table),
                "requests_by_status": _by_status(latest, table),
                "pending_bytes": _total(latest, "deltaflow_ingest_pending_bytes", table),
                "events_per_second": series[-1][table]["events_per_second"] if series else None,
                "ack_ms_p50": _quantile(base, latest, table, 0.5),
                "ack_ms_p99": _quantile(base, latest, table, 0.99),
            }
            for table in tables
        ],
        "series": series[-150:],
    }


_EVENTS = "deltaflow_ingest_events_total"
_REJECTS = "deltaflow_ingest_rejected_records_total"
_ACK = "deltaflow_ingest_ack_seconds"


def _total(sample: Sample, name: str, table: str) -> float:
    return sum(v for (n, labels), v in sample.items() if n == name and ("table", table) in labels)


def _delta(before: Sample, after: Sample, name: str, table: str) -> float:
    return max(0.0, _total(after, name, table) - _total(before, name, table))


def _by_status(sample: Sample, table: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, labels), value in sample.items():
        if name == "deltaflow_ingest_requests_total" and ("table", table) in labels:
            out[dict(labels).get("status", "?")] = value
    return out


def _quantile(before: Sample, after: Sample, table: str, q: float) -> float | None:
    """The ``q`` quantile (ms) of the acknowledgements between two samples, interpolated
    within the histogram bucket it falls in, as Prometheus's histogram_quantile does."""
    buckets: list[tuple[float, float]] = []
    for (name, labels), value in after.items():
        label = dict(labels)
        if name != f"{_ACK}_bucket" or label.get("table") != table:
            continue
        bound = float("inf") if label.get("le") == "+Inf" else float(label.get("le", "inf"))
        buckets.append((bound, value - before.get((name, labels), 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return round(lower * 1000, 2)
            share = (rank - below) / (count - below) if count > below else 1.0
            return round((lower + (bound - lower) * share) * 1000, 2)
        lower, below = bound, count
    return None
