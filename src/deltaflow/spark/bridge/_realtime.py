"""The bridge's side of the real-time mode sink (``jvm/.../RealTimeCommits.scala``).

A real-time epoch commits many times: each task's rows, every commit interval, as one
Delta commit with the app transaction ``<app id>/rtm-p<partition>`` at version
``epoch << 32 | rows``: the rows of that partition the table holds for the epoch. A
replayed epoch asks here how many rows that is, and drops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from deltalake import DeltaTable

from deltaflow import _step_times
from deltaflow.errors import InvalidOptionError
from deltaflow.table import _log_upkeep, _reader_leases, _rowlog, _uri
from deltaflow.table._log_head import Heads, LogHead
from deltaflow.table._snapshot import open_latest, table_exists
from deltaflow.table.errors import ConcurrentWriteError

# The commit interval: the minimum spacing (ms) between a real-time query's commits, not a
# clock rows wait for (a roll is committed as soon as it has rows and the spacing allows).
# Its bounds: shorter than 5 ms would only queue commits behind each other (a local Delta
# commit takes ~15 ms); longer than 10 s is micro-batch's job.
COMMIT_INTERVAL_DEFAULT_MS = 50
COMMIT_INTERVAL_MIN_MS = 5
COMMIT_INTERVAL_MAX_MS = 10_000
COMMIT_INTERVAL_OPTION = "realTimeCommitIntervalMs"
# With a row log (``docs/notes/rowlog.md``) rows are durable, and readable by real-time
# readers, from the log within a millisecond or two; the Delta commits only serve every
# other reader, so they come once a second: fewer, larger files and a shorter _delta_log.
COMMIT_INTERVAL_ROW_LOG_DEFAULT_MS = 1000
ROW_LOG_OPTION = "realTimeRowLog"
ROW_LOG_RETENTION_OPTION = "realTimeRowLogRetentionMs"
# Segments of finished epochs are kept this long for readers behind: a reader further
# behind reads the tagged Parquet files instead (slower, still each row once).
ROW_LOG_RETENTION_DEFAULT_MS = 3_600_000

# One INFO line per epoch and query with the brain's commit steps (the JVM writer logs
# its own steps per epoch the same way): where a real-time commit's milliseconds go.
timing_log = logging.getLogger("deltaflow.realtime.commits")
log = logging.getLogger("deltaflow.realtime")

# A local table whose log could hold more files than this at the sink's commit cap, for its
# delta.logRetentionDuration, is warned about once per process: every load of the table
# lists them all (~0.7 s at 100,000 files here, 7 s at a million; docs/realtime.md).
LONG_LOG_FILES = 200_000


def _option(options: Mapping[str, str], name: str) -> str | None:
    return next((v for k, v in options.items() if k.lower() == name.lower()), None)


def commit_interval_ms(options: dict[str, str]) -> int:
    """The sink's ``realTimeCommitIntervalMs`` option (the minimum spacing between its
    commits), checked (typed error when wrong); 1000 ms by default with a row log."""
    raw = _option(options, COMMIT_INTERVAL_OPTION)
    if raw is None:
        if row_log(options):
            return COMMIT_INTERVAL_ROW_LOG_DEFAULT_MS
        return COMMIT_INTERVAL_DEFAULT_MS
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if not COMMIT_INTERVAL_MIN_MS <= value <= COMMIT_INTERVAL_MAX_MS:
        raise InvalidOptionError(
            f"realTimeCommitIntervalMs is {raw!r}: give a whole number of milliseconds from"
            f" {COMMIT_INTERVAL_MIN_MS} to {COMMIT_INTERVAL_MAX_MS} (default"
            f" {COMMIT_INTERVAL_DEFAULT_MS}): the minimum spacing between the query's commits."
            " Shorter means fresher rows under a steady flow, and more, smaller commits and"
            " files.",
            option=COMMIT_INTERVAL_OPTION,
        )
    return value


def row_log(options: Mapping[str, str]) -> bool:
    """The sink's ``realTimeRowLog`` option: ``true`` or ``false`` (typed error otherwise)."""
    raw = _option(options, ROW_LOG_OPTION)
    if raw is None:
        return False
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(
            f"realTimeRowLog is {raw!r}: give 'true' (a real-time sink appends each burst of"
            " rows to a row log beside the table, for real-time readers, and commits to"
            " Delta every realTimeCommitIntervalMs) or 'false' (the default).",
            option=ROW_LOG_OPTION,
        )
    return value == "true"


def row_log_retention_ms(options: Mapping[str, str]) -> int:
    """The sink's ``realTimeRowLogRetentionMs``: how long segments of finished epochs stay."""
    raw = _option(options, ROW_LOG_RETENTION_OPTION)
    if raw is None:
        return ROW_LOG_RETENTION_DEFAULT_MS
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidOptionError(
            f"realTimeRowLogRetentionMs is {raw!r}: give a whole number of milliseconds, 0 or"
            f" more (default {ROW_LOG_RETENTION_DEFAULT_MS}, an hour): how long the row log"
            " keeps the segments of epochs the table has committed.",
            option=ROW_LOG_RETENTION_OPTION,
        )
    return value


def check_row_log(options: Mapping[str, str], uri: str) -> bool:
    """Whether the sink into ``uri`` keeps a row log; refused typed where it cannot: this
    slice appends to local files only (object stores have no append; a later slice)."""
    if not row_log(options):
        return False
    row_log_retention_ms(options)
    if not _uri.is_local(_uri.normalize_uri(uri)):
        raise InvalidOptionError(
            f"realTimeRowLog is on for {uri}, which is not on a local disk: the row log"
            " appends to files and syncs them, which object stores cannot do. Remove"
            " .option('realTimeRowLog', 'true'); the sink then commits every"
            " realTimeCommitIntervalMs (default 50 ms) to Delta alone.",
            option=ROW_LOG_OPTION,
        )
    return True


def transactions(args: dict[str, Any]) -> dict[str, Any]:
    """``sink.transactions``: ``{path, appIds}`` -> ``{versions: {appId: version | None}}``,
    the app transactions' versions in the table's log now (and the commit interval).

    With no ``appIds`` an epoch starts: the answer adds ``rowLog``, the writer's row log
    directory when the sink keeps one (``appId``: the sink's app id), and segments of
    epochs before ``epoch`` older than the retention are deleted."""
    uri = _uri.normalize_uri(str(args["path"]))
    options = {str(k): str(v) for k, v in (args.get("options") or {}).items()}
    interval = commit_interval_ms(options)
    app_ids = [str(a) for a in args.get("appIds") or []]
    if not app_ids:
        # An epoch starts (its writer factory asks for the interval alone): its first
        # partition's ask seeds the table's heads again, one delta-rs load per epoch.
        _HEADS.forget(uri)
        directory = None
        if check_row_log(options, uri) and args.get("appId") is not None:
            directory = _row_log_dir(uri, str(args["appId"]))
            if args.get("epoch") is not None:
                expire_row_log(directory, int(args["epoch"]), row_log_retention_ms(options))
        return {"versions": {}, "intervalMs": interval, "rowLog": directory}
    if _uses_head(uri) and (_HEADS.holds(uri, _owner(app_ids[0])) or table_exists(uri)):
        # Every partition's ``Start``: from the head, caught up by name (no load).
        with _HEADS.use(uri, _owner(app_ids[0])) as head:
            _LOG_SIZE.check(uri, interval, head.snapshot().configuration)
            return {"versions": {a: head.txn(a) for a in app_ids}, "intervalMs": interval}
    if not table_exists(uri):
        return {"versions": dict.fromkeys(app_ids), "intervalMs": interval}
    table = open_latest(uri)
    _LOG_SIZE.check(uri, interval, table.metadata().configuration)
    versions = {app_id: table.transaction_version(app_id) for app_id in app_ids}
    return {"versions": versions, "intervalMs": interval}


def _row_log_dir(uri: str, app_id: str) -> str:
    """The writer's directory of the row log: ``<table>/_deltaflow_rowlog/<writer>``."""
    return os.path.join(_uri.local_path(uri), _rowlog.DIRECTORY, _rowlog.encode_writer(app_id))


def expire_row_log(directory: str, epoch: int, retention_ms: int) -> list[str]:
    """Delete the writer's segments of epochs before ``epoch`` last written more than
    ``retention_ms`` ago; the deleted paths. Called as ``epoch`` starts, when every
    earlier epoch is committed in full (Spark starts an epoch after the last one's
    commit), so each deleted row is in the table, its tagged file the readers' stand-in.
    The current epoch's segments are never touched: its tasks may be writing them."""
    cutoff = time.time() - retention_ms / 1000
    deleted = []
    try:
        partitions = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in partitions:
        for segment in _rowlog.segments(os.path.join(directory, name)):
            if segment.epoch >= epoch:
                continue
            try:
                if os.stat(segment.path).st_mtime < cutoff:
                    os.remove(segment.path)
                    deleted.append(segment.path)
            except FileNotFoundError:
                pass  # a restarted driver's sink deleting the same segment
    if deleted:
        log.info(
            "real-time row log %s: deleted %d segments before epoch %d",
            directory,
            len(deleted),
            epoch,
        )
    return deleted


class _LogSize:
    """Warns, once per table and process, when a real-time sink's commits could keep a
    local ``_delta_log`` past :data:`LONG_LOG_FILES` files under the table's retention.
    Checked at a partition's ``Start`` of an existing table, from the metadata the start
    reads anyway (the sink's first epoch into a new table: its next epoch)."""

    def __init__(self) -> None:
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def check(
        self, uri: str, interval_ms: int, configuration: Mapping[str, str | None]
    ) -> int | None:
        """The files the log of ``uri`` (whose table has ``configuration``) could hold;
        None when not checked (done before, or not local). Warned about when too many."""
        if not _uri.is_local(uri):
            return None
        with self._lock:
            if uri in self._checked:
                return None
            self._checked.add(uri)
        raw = _log_upkeep.table_property(configuration, "delta.logRetentionDuration")
        retention = _reader_leases.interval_seconds(raw)
        if retention is None:
            retention = _log_upkeep.DEFAULT_LOG_RETENTION_SECONDS
        files = int(retention * 1000 / interval_ms)
        if files > LONG_LOG_FILES:
            log.warning(
                "real-time sink into %s: at up to %d commits a second (realTimeCommitIntervalMs"
                " %d) its _delta_log can grow to about %s files, kept for"
                " delta.logRetentionDuration (%s). On a local disk every reader (delta-rs,"
                " Polars, delta-spark, a cold scan) lists them all on each load: ~0.7 s at"
                " 100,000 files, ~7 s at a million. To keep loads fast, keep less log"
                " history (time travel, and a stopped downstream stream's restart, then"
                " reach back only that far): ALTER TABLE delta.`%s` SET TBLPROPERTIES"
                " ('delta.logRetentionDuration' = 'interval 2 hours'); or commit less often"
                " (realTimeCommitIntervalMs). See docs/realtime.md, 'A long-running"
                " query's log'.",
                uri,
                1000 // interval_ms,
                interval_ms,
                f"{files:,}",
                raw or "interval 30 days, the default",
                uri,
            )
        return files

    def forget(self) -> None:
        with self._lock:
            self._checked.clear()


_LOG_SIZE = _LogSize()


def commit_rolls(args: dict[str, Any]) -> dict[str, Any]:
    """``sink.commitRolls``: the rolls several partitions handed over within one commit
    interval, as one Delta commit carrying each partition's app transaction.

    ``args`` is ``write.plan``'s (``stream`` names the first roll's app transaction) plus
    ``rolls``: ``[{directory, appId, from, version}]``, each a staged directory its task
    wrote with the partition's rows ``from`` until ``version`` (``epoch << 32 | row``).
    Each roll must hold exactly those rows (its directory gone or short: refused), and
    the group is checked against the log atomically with the commit: every roll starting
    where its app transaction ends commits; every roll ending exactly there (a replay)
    commits nothing; anything else (a second writer of the same partitions, a finished
    epoch's zombie) fails the commit (``ConcurrentWriteError``) and the query replays.
    A refused group's files are deleted. -> ``{route, version, files, skipped}``; a table
    the connector's file write cannot take answers ``{route: "python"}``, nothing moved.
    """
    rolls = [
        Roll(str(r["directory"]), str(r["appId"]), int(r["from"]), int(r["version"]))
        for r in args["rolls"]
    ]
    if not rolls:
        return {"route": "jvm", "version": None, "files": 0, "skipped": True}
    started = time.perf_counter()
    with _step_times.collect() as steps:
        answer = _commit_rolls(args, rolls)
    steps["total"] = time.perf_counter() - started
    if answer.get("route") == "jvm":
        query = str((args.get("stream") or {}).get("streamQueryId") or rolls[0].app_id)
        _EPOCHS.record(query, rolls[0].end >> 32, steps)
    return answer


class Roll(NamedTuple):
    """One partition's rows handed over in an interval: ``start``..``end`` are
    ``epoch << 32 | row`` (the end is the app transaction's version)."""

    directory: str
    app_id: str
    start: int
    end: int


def _commit_rolls(args: dict[str, Any], rolls: list[Roll]) -> dict[str, Any]:
    from deltaflow.spark.bridge import _ops

    uri = _ops.table_path(args, "sink.commitRolls")
    owner = str((args.get("stream") or {}).get("queryId") or _owner(rolls[0].app_id))
    if not _uses_head(uri) or not (_HEADS.holds(uri, owner) or table_exists(uri)):
        with _step_times.step("plan"):
            planned = _ops.plan_write({**args, "staging": rolls[0].directory})
        if planned.get("route") != "jvm":
            return {"route": str(planned.get("route"))}
        pending = _ops.take_pending(str(planned["handle"]))
        assert pending is not None  # planned just now, on this thread
        return _collect_and_commit(
            args, rolls, pending.plan, pending.native, pending.job_id, table=pending.table
        )
    with contextlib.ExitStack() as held:
        with _step_times.step("head"):  # caught up by name (seeded: one load per epoch)
            head = held.enter_context(_HEADS.use(uri, owner))
        with _step_times.step("plan"):
            cached = _plan_for(args, rolls[0].directory, head)
        if isinstance(cached, str):
            return {"route": cached}
        plan, native = cached
        # The plan holds while metadata and protocol do; the commit reads at the head.
        plan = dataclasses.replace(plan, read_version=head.version)
        return _collect_and_commit(args, rolls, plan, native, uuid.uuid4().hex[:8], head=head)


def _collect_and_commit(
    args: dict[str, Any],
    rolls: list[Roll],
    plan: Any,
    native: Any,
    job_id: str,
    *,
    table: DeltaTable | None = None,
    head: LogHead | None = None,
) -> dict[str, Any]:
    from deltaflow.spark.stream._writer import commit_batch
    from deltaflow.spark.write._files import delete_files
    from deltaflow.spark.write._native import collect_staged, rows_in

    uri = plan.table_uri
    moved: list[Any] = []
    try:
        with _step_times.step("collect"):
            for roll in rolls:
                files = collect_staged(plan, native, roll.directory, job_id)
                if args.get("rowLog"):
                    files = [dataclasses.replace(f, tags=_row_log_tags(roll)) for f in files]
                moved.extend(files)
                _check_rows(uri, roll, files, rows_in(files))
    except BaseException:
        delete_files(uri, moved)
        raise
    first, more = rolls[0], rolls[1:]
    query_id = str((args.get("stream") or {}).get("streamQueryId") or first.app_id)
    with _step_times.step("commit"):
        result = commit_batch(
            plan,
            moved,
            query_id=query_id,
            app_id=first.app_id,
            batch_id=first.end,
            num_rows=rows_in(moved),
            table=table,
            head=head,
            more_transactions=tuple((r.app_id, r.end) for r in more),
            txn_from=tuple((r.app_id, r.start) for r in rolls),
        )
    return {
        "route": "jvm",
        "version": result.version,
        "files": len(moved),
        "skipped": result.skipped,
    }


def _row_log_tags(roll: Roll) -> dict[str, str]:
    """The tag of a roll's adds: the row log positions its rows hold. A roll of a
    partitioned table (or past ``maxRecordsPerFile``) has several files; each carries the
    whole roll's range, so a reader skips or reads them together."""
    app, partition = roll.app_id.rsplit("/rtm-p", 1)
    value = _rowlog.tag(
        _rowlog.encode_writer(app),
        int(partition),
        roll.start >> 32,
        roll.start & 0xFFFFFFFF,
        roll.end & 0xFFFFFFFF,
    )
    return {_rowlog.TAG: value}


# Real-time sinks' log heads (table/_log_head.py), per table and endpoint owner
# (``<app>/rtm``): on local tables, where deltaflow's log writer makes the sink's commits
# (elsewhere delta-rs commits them, on a delta-rs table of its own). No commit lists
# ``_delta_log``; each epoch seeds its head with one load (``transactions``).
_HEADS = Heads()


def _uses_head(uri: str) -> bool:
    return _uri.is_local(uri)


def _owner(app_id: str) -> str:
    """A partition's app id ``<app>/rtm-p<n>`` -> its endpoint's ``<app>/rtm``."""
    return re.sub(r"-p\d+$", "", app_id)


class _Plan(NamedTuple):
    head: LogHead
    generation: int
    planned: tuple[Any, Any] | str  # (plan, native), or the route that is not the JVM's


# The newest plan of each head: made again only when the head's metadata or protocol
# moved (its generation) or the write's settings differ.
_plans: dict[tuple[str, str], _Plan] = {}
_plans_lock = threading.Lock()


def _plan_for(args: dict[str, Any], staging: str, head: LogHead) -> tuple[Any, Any] | str:
    from deltaflow.spark.bridge import _ops

    key = json.dumps(
        [args.get("mode"), args.get("schema"), args.get("options"), args.get("conf")],
        sort_keys=True,
        default=str,
    )
    slot = (head.uri, key)
    with _plans_lock:
        cached = _plans.get(slot)
    if cached is not None and cached.head is head and cached.generation == head.generation:
        return cached.planned
    answer = _ops.plan_write({**args, "staging": staging}, current=head.snapshot())
    planned: tuple[Any, Any] | str = str(answer.get("route"))
    if answer.get("route") == "jvm":
        pending = _ops.take_pending(str(answer["handle"]))
        assert pending is not None  # planned just now, on this thread
        planned = (pending.plan, pending.native)
    with _plans_lock:
        _plans[slot] = _Plan(head, head.generation, planned)
        while len(_plans) > 64:
            _plans.pop(next(iter(_plans)))
    return planned


def _check_rows(table_uri: str, roll: Roll, files: list[Any], rows: int) -> None:
    """A roll's files must hold exactly its rows: a directory deleted before its commit
    (an aborted epoch's cleanup racing the committer) would otherwise record rows in the
    app transaction that no file holds, and a replay would skip them for good."""
    expected = roll.end - roll.start
    if files and rows == expected:
        return
    raise ConcurrentWriteError(
        f"The real-time roll {roll.directory} of {roll.app_id} should hold"
        f" {expected} rows (e{roll.start >> 32}: {roll.start & 0xFFFFFFFF}-"
        f"{roll.end & 0xFFFFFFFF}) and its files hold {rows} ({len(files)} files): it was"
        " deleted or cut short before its commit (the epoch ended or was aborted). Nothing"
        " was committed; the stream replays these rows from the log.",
        table_uri=table_uri,
        kind="ConcurrentTransaction",
        read_version=None,
        attempts=1,
    )


# The steps of the timing line, in the order a commit takes them.
TIMED_STEPS = (
    "total",
    "head",
    "plan",
    "collect",
    "commit",
    "conflict scan",
    "write+fsync",
    "link",
    "dir fsync",
    "upkeep",
)


class _EpochTimes:
    """The brain's commit steps per query, logged as one line when the epoch changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs: dict[str, tuple[int, dict[str, list[float]]]] = {}
        self.lines: list[str] = []  # the last few lines, for tests

    def record(self, query: str, epoch: int, steps: dict[str, float]) -> None:
        with self._lock:
            current, samples = self._epochs.get(query, (epoch, {}))
            if current != epoch:
                self._emit(query, current, samples)
                samples = {}
            for name, seconds in steps.items():
                samples.setdefault(name, []).append(seconds)
            self._epochs[query] = (epoch, samples)

    def flush(self) -> None:
        with self._lock:
            for query, (epoch, samples) in self._epochs.items():
                self._emit(query, epoch, samples)
            self._epochs.clear()

    def _emit(self, query: str, epoch: int, samples: dict[str, list[float]]) -> None:
        if not samples:
            return
        line = f"real-time commits of query {query} epoch {epoch}: " + "; ".join(
            _summary(name, samples[name]) for name in TIMED_STEPS if name in samples
        )
        self.lines = [*self.lines[-15:], line]
        timing_log.info("%s", line)


def _summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)

    def ms(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    top = ordered[-1] * 1000
    return f"{name} {len(ordered)}x p50 {ms(0.5):.1f} p99 {ms(0.99):.1f} max {top:.1f} ms"


_EPOCHS = _EpochTimes()


def flush_timings() -> None:
    """Log the timing lines of the epochs still open (the brain's shutdown)."""
    _EPOCHS.flush()
