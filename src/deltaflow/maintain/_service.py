"""One maintenance pass over the tables under some roots, and the loop that repeats it.

A pass finds the tables (:mod:`deltaflow.maintain._discovery`), and for each runs the
checks and actions of :mod:`deltaflow.maintain._actions` in order, logging one line per
table per action (table, action, outcome, why, result). A failing action fails its
table, never the pass: the other tables are still processed, and the pass's report lists
what failed. A stop request (SIGINT / SIGTERM in the CLI) is honoured between actions,
so no action is cut short.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deltaflow.maintain import _actions, _discovery
from deltaflow.maintain._actions import MaintainOptions, TableState
from deltaflow.maintain.errors import MaintenanceFailedError

log = logging.getLogger("deltaflow.maintain")


@dataclass(frozen=True)
class ActionReport:
    """One line of the log: ``outcome`` is ran, skipped, would run (dry run) or failed."""

    table: str
    action: str
    outcome: str
    why: str
    result: str = ""

    def line(self) -> str:
        text = f"{self.table} {self.action} {self.outcome}: {self.why}"
        return f"{text} -> {self.result}" if self.result else text


@dataclass
class PassReport:
    tables: list[str] = field(default_factory=list)
    actions: list[ActionReport] = field(default_factory=list)
    stopped: bool = False  # a stop request ended the pass early

    @property
    def failures(self) -> list[ActionReport]:
        return [a for a in self.actions if a.outcome == "failed"]

    def ran(self, action: str | None = None) -> list[ActionReport]:
        return [a for a in self.actions if a.outcome == "ran" and action in (None, a.action)]

    def raise_for_failures(self) -> None:
        """:class:`MaintenanceFailedError` naming the tables an action failed on."""
        failed = self.failures
        if not failed:
            return
        tables = tuple(dict.fromkeys(a.table for a in failed))
        details = tuple(f"{a.table} {a.action}: {a.result}" for a in failed)
        raise MaintenanceFailedError(
            f"deltaflow maintain: {len(tables)} of {len(self.tables)} tables failed"
            f" ({'; '.join(details)}). The other tables were maintained; the failed actions"
            " run again on the next pass.",
            tables=tables,
            details=details,
        )


def run_pass(
    roots: Sequence[str],
    options: MaintainOptions | None = None,
    *,
    stop: threading.Event | None = None,
    vacuum_checked: dict[str, float] | None = None,
    emit: Callable[[ActionReport], None] | None = None,
) -> PassReport:
    """Maintain every table under ``roots`` once. A bad root raises
    :class:`~deltaflow.maintain.errors.MaintainRootError` before any table is touched.
    ``vacuum_checked``: when each table's VACUUM was last checked (the loop's memory, so
    the listing a VACUUM dry run costs happens once per ``vacuum_check_seconds``)."""
    options = options or MaintainOptions()
    emit = emit or _log
    report = PassReport(_discovery.find_tables(roots))
    for table in report.tables:
        if stop is not None and stop.is_set():
            report.stopped = True
            break
        due = True
        if vacuum_checked is not None:
            last = vacuum_checked.get(table)
            due = last is None or time.monotonic() - last >= options.vacuum_check_seconds
        state = TableState(table, options, check_vacuum=due)
        for action in maintain_table(state, stop):
            report.actions.append(action)
            emit(action)
        if due and vacuum_checked is not None:
            vacuum_checked[table] = time.monotonic()
        if stop is not None and stop.is_set():
            report.stopped = True
    return report


def maintain_table(state: TableState, stop: threading.Event | None = None) -> list[ActionReport]:
    """The checks and actions for one table, in order; a stop request ends it between
    actions. Failures are reported, not raised."""
    try:
        state.snapshot  # noqa: B018 - loaded once here; every check reads it
    except Exception as exc:  # a broken table must not stop the pass
        return [ActionReport(state.uri, "LOAD", "failed", "the table cannot be read", _text(exc))]
    reports: list[ActionReport] = []
    for name, check, run in _actions.ACTIONS:
        if stop is not None and stop.is_set():
            break
        try:
            decision = check(state)
        except Exception as exc:  # a broken table must not stop the pass
            reports.append(ActionReport(state.uri, name, "failed", "the check failed", _text(exc)))
            continue
        if not decision.run:
            reports.append(ActionReport(state.uri, name, "skipped", decision.why))
            continue
        if state.options.dry_run:
            reports.append(ActionReport(state.uri, name, "would run", decision.why))
            continue
        started = time.perf_counter()
        try:
            result = run(state, decision)
        except _actions.Skip as skip:
            reports.append(ActionReport(state.uri, name, "skipped", f"{decision.why}; {skip}"))
            continue
        except Exception as exc:  # reported; the next action still runs
            state.changed()
            reports.append(ActionReport(state.uri, name, "failed", decision.why, _text(exc)))
            continue
        took = f" ({(time.perf_counter() - started) * 1000:.0f} ms)"
        reports.append(ActionReport(state.uri, name, "ran", decision.why, result + took))
    return reports


def run_service(
    roots: Sequence[str],
    options: MaintainOptions | None = None,
    *,
    interval: float,
    stop: threading.Event,
    emit: Callable[[ActionReport], None] | None = None,
) -> int:
    """Run passes every ``interval`` seconds until ``stop`` is set; returns the number of
    passes. A pass that fails on some table is logged, and the loop goes on. The roots are
    checked once before the first pass (a bad one raises ``MaintainRootError``)."""
    _discovery.check_roots(roots)
    vacuum_checked: dict[str, float] = {}
    passes = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            report = run_pass(roots, options, stop=stop, vacuum_checked=vacuum_checked, emit=emit)
            passes += 1
            if report.failures:
                log.warning("%s", _failure_summary(report))
        except Exception as exc:  # e.g. a root removed meanwhile: next pass
            log.warning("deltaflow maintain: the pass failed: %s", _text(exc))
        stop.wait(max(interval - (time.monotonic() - started), 0.0))
    return passes


def _failure_summary(report: PassReport) -> str:
    try:
        report.raise_for_failures()
    except MaintenanceFailedError as exc:
        return str(exc)
    return ""


def _log(action: ActionReport) -> None:
    level = logging.WARNING if action.outcome == "failed" else logging.INFO
    log.log(level, "%s", action.line())


def _text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
