"""Continuous mode: streaming flows stay up, materialized views refresh on an interval.

Every streaming flow starts at once with a processing-time trigger of
``pipelines.trigger.interval`` (default 5 seconds): a stream reads its upstream tables
continuously, so no ordering is needed. Materialized views (and ``once`` backfills) are
recomputed in dependency order on the same interval. A stream that fails is restarted
from its checkpoint with a doubling backoff, up to ``pipelines.maxFlowRetryAttempts``
times in a row (an expectation failure is final). Each micro-batch a stream completes is
a ``flow_progress`` event. The update runs until ``stop`` is set (the CLI sets it on
SIGINT / SIGTERM): streams then stop after their current micro-batch, and the update
ends ``CANCELED`` (or ``FAILED`` when a flow failed for good).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltaflow.errors import typed_error
from deltaflow.pipelines import _realtime
from deltaflow.pipelines._flows import (
    FlowRun,
    Outcome,
    Running,
    Trigger,
    UpdateDriver,
)

if TYPE_CHECKING:
    from deltaflow.pipelines._runner import FlowReport


def _seconds(interval: str) -> float:
    """``"5 seconds"`` / ``"500 milliseconds"`` / ``"1 minute"`` as seconds."""
    number, _, unit = interval.strip().partition(" ")
    scale = {"millisecond": 0.001, "second": 1.0, "minute": 60.0, "hour": 3600.0}
    factor = next((v for k, v in scale.items() if unit.strip().lower().startswith(k)), 1.0)
    return float(number) * factor


@dataclass
class _Stream:
    name: str
    run: FlowRun
    running: Running | None = None
    failures: int = 0
    restart_at: float = 0.0
    last_batch: int = -1
    final_error: BaseException | None = None
    outcome: Outcome = field(default_factory=Outcome)


class Continuous(UpdateDriver):
    """One continuous update (see the module docstring)."""

    def _prepare(self) -> None:
        settings, resolution = self._settings, self._resolution
        self._interval = settings.setting("pipelines.trigger.interval", "5 seconds")
        trigger = Trigger(self._interval)
        self._streams: list[_Stream] = []
        self._batches: list[str] = []
        self._batch_errors: dict[str, BaseException] = {}
        self._triggers: dict[str, Trigger] = {}
        real_time = set(_realtime.real_time_flows(resolution))
        for name in self._runnable:
            flow = resolution.flows[name].flow
            flow_trigger = trigger
            if name in real_time:
                target = resolution.datasets.get(flow.target)
                epoch = _realtime.epoch(flow, target.dataset if target else None, settings)
                flow_trigger = Trigger(epoch, real_time=True)
            run = FlowRun(
                self._spark, resolution, resolution.flows[name], self._storage, flow_trigger
            )
            self._triggers[name] = flow_trigger
            if run.streaming:
                self._streams.append(_Stream(name, run))
            else:
                self._batches.append(name)

    def run(self, stop: threading.Event) -> dict[str, FlowReport]:
        every = _seconds(self._interval)
        next_refresh = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                for stream in self._streams:
                    self._tend(stream, now)
                if self._batches and now >= next_refresh:
                    self._refresh_batches(stop)
                    next_refresh = time.monotonic() + every
                self._log.flush()
                stop.wait(min(every, 1.0))
        finally:
            for stream in self._streams:
                if stream.running is not None:
                    if stream.running.query.isActive:
                        stream.running.query.stop()
                    # The batches since the last look count too.
                    stream.outcome = stream.running.outcome()
            self._log.flush()
        return self._reports()

    def _progress(self, name: str, status: str, **details: Any) -> None:
        trigger = self._triggers.get(name)
        name_of = None if trigger is None else trigger.name
        super()._progress(name, status, trigger=name_of, **details)

    def _tend(self, stream: _Stream, now: float) -> None:
        """Start the stream if due, record its new micro-batches, notice its failure."""
        if stream.final_error is not None:
            return
        if stream.running is None:
            if now < stream.restart_at:
                return
            try:
                stream.running = stream.run.start()
            except Exception as exc:
                self._failed(stream, exc, now)
                return
            self._progress(stream.name, "RUNNING", attempt=stream.failures + 1)
            return
        query = stream.running.query
        progress = query.lastProgress
        batch = -1 if progress is None else int(_get(progress, "batchId", -1))
        if batch > stream.last_batch:
            stream.last_batch = batch
            stream.outcome = stream.running.outcome()
            stream.failures = 0  # a batch went through: the stream is healthy again
            self._progress(stream.name, "RUNNING", outcome=stream.outcome, batch=batch)
        if not query.isActive:
            failure = query.exception()
            stream.running = None
            if failure is not None:
                self._failed(stream, failure, now)

    def _failed(self, stream: _Stream, failure: BaseException, now: float) -> None:
        error = typed_error(failure) or failure
        stream.failures += 1
        if self._policy.gives_up(error, stream.failures):
            stream.final_error = error
            self._progress(stream.name, "FAILED", error=error)
            return
        stream.restart_at = now + self._policy.delay(stream.failures)
        self._progress(stream.name, "RETRYING", error=error, attempt=stream.failures)

    def _refresh_batches(self, stop: threading.Event) -> None:
        for name in self._batches:
            if stop.is_set():
                return
            run = FlowRun(
                self._spark, self._resolution, self._resolution.flows[name], self._storage
            )
            try:
                outcome = run.run()
            except Exception as exc:
                error = typed_error(exc) or exc
                self._batch_errors[name] = error
                self._progress(name, "FAILED", error=error)
                continue
            self._batch_errors.pop(name, None)
            self._progress(name, "COMPLETED", outcome=outcome)

    def _reports(self) -> dict[str, FlowReport]:
        from deltaflow.pipelines._runner import FlowReport

        reports: dict[str, FlowReport] = {}
        for stream in self._streams:
            target = self._resolution.flows[stream.name].flow.target
            if stream.final_error is not None:
                reports[stream.name] = FlowReport(
                    stream.name, target, "FAILED", stream.failures, error=str(stream.final_error)
                )
            else:
                self._progress(stream.name, "STOPPED", outcome=stream.outcome)
                reports[stream.name] = FlowReport(
                    stream.name,
                    target,
                    "STOPPED",
                    stream.failures + 1,
                    rows_written=stream.outcome.rows,
                    expectations=stream.outcome.expectations,
                )
        for name in self._batches:
            target = self._resolution.flows[name].flow.target
            error = self._batch_errors.get(name)
            reports[name] = FlowReport(
                name,
                target,
                "FAILED" if error is not None else "STOPPED",
                error=None if error is None else str(error),
            )
        return reports


def _get(progress: Any, key: str, default: Any) -> Any:
    if isinstance(progress, dict):
        return progress.get(key, default)
    return getattr(progress, key, default)
