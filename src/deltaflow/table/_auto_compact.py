"""Auto compaction: the small files of the partitions a commit wrote, compacted after it.

delta-spark's ``AutoCompact`` post-commit hook, for every commit that goes through
:func:`deltaflow.table._commit.commit` (Spark batch and stream writes on either data path,
DML, CTAS, HTTP ingest). After a commit that added data, each partition it wrote to is
counted: files under ``minFileSize`` (half of ``maxFileSize`` unless set). Partitions with
at least ``minNumFiles`` of them (at most ``maxNumModifiedPartitions``, most small files
first) are compacted by delta-rs's bin-packing OPTIMIZE toward ``maxFileSize``, in one
follow-up commit: operation ``OPTIMIZE`` with ``auto: true``, every action
``dataChange=false`` (streams reading the table skip it).

**It never fails the writer.** The writer's commit is in before this runs; a compaction
that loses a conflict (a concurrent DELETE removed one of its files) or fails for any
other reason gives up, logs why, and the write returns as usual. The partitions stay
eligible, so the next write tries again. Concurrent blind appends never conflict with
it. A running DML holds a lease that keeps auto compaction off the table until it
commits (:mod:`deltaflow.table._dml_lease`); one that still lost to a compaction started
before it is re-run by the DML layer (``spark/dml/_retry.py``), so it is not failed either.

**Streams compact by default** (deltaflow's default, not delta-spark's): a table that a
stream writes (a micro-batch or real-time Delta sink, ``deltaflow serve``'s ingest) is
compacted when neither the session (``spark.databricks.delta.autoCompact.enabled``) nor the
table (``delta.autoOptimize.autoCompact`` / ``delta.autoOptimize``) says anything, in the
background, from 10 small files in a partition (``minNumFiles`` when set); ``'false'`` in
either turns it off. Batch writers keep delta-spark's default
(off).

Where it runs: synchronously, inside the commit call, as delta-spark does (the write
returns once the compaction is done or has given up); or, with deltaflow's
``spark.deltaflow.autoCompact.background=true`` (always for ``deltaflow serve``, and for a
stream on by the default alone), on one background thread per process that coalesces
requests per table, so the writer does not wait at all. That thread counts the small
files its process's commits add, and loads a table to count them again only when the
threshold may have been reached (``_BackgroundWorker._check``).

Settings live in :mod:`deltaflow.table._compact_settings` and are re-exported here.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from deltaflow.errors import DeltaflowError
from deltaflow.table import _compaction_lease, _dml_lease, _log_upkeep, _partitions, _uri
from deltaflow.table._compact_settings import (  # re-exported: the hook's settings
    DEFAULT_MAX_FILE_SIZE,
    DEFAULT_MIN_NUM_FILES,
    DEFAULT_SETTINGS,
    SESSION_CONFS,
    STREAM_MIN_NUM_FILES,
    TABLE_PROPERTY,
    AutoCompactSettings,
    asked_for,
    enabled_for,
)
from deltaflow.table._pace import Pace

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_MIN_NUM_FILES",
    "DEFAULT_SETTINGS",
    "SESSION_CONFS",
    "STREAM_MIN_NUM_FILES",
    "TABLE_PROPERTY",
    "AutoCompactSettings",
    "CompactionJob",
    "CompactionOutcome",
    "after_commit",
    "eligible_partitions",
    "enabled_for",
    "run",
    "small_files_per_partition",
    "wait_for_background",
]

# ---- the hook ------------------------------------------------------------------------

PartitionKey = tuple[str | None, ...]


@dataclass(frozen=True)
class CompactionJob:
    """One table's compaction request: the partitions that commits wrote to."""

    table_uri: str
    partition_columns: tuple[str, ...]
    partitions: frozenset[PartitionKey]
    settings: AutoCompactSettings
    storage_options: Mapping[str, str] | None = None
    triggered_by: int | None = None  # the version whose commit asked for it
    # More commitInfo for the OPTIMIZE commit (``deltaflow maintain`` marks its own runs);
    # its ``operationParameters`` are merged into the ones below.
    commit_info: Mapping[str, Any] | None = None
    # How many small files the commits that asked added, per partition; None: not known
    # (the background worker then counts them in the table).
    small_added: Mapping[PartitionKey, int] | None = None


@dataclass(frozen=True)
class CompactionOutcome:
    """What one run did: the OPTIMIZE version (None when nothing was compacted)."""

    version: int | None
    files_removed: int = 0
    files_added: int = 0
    partitions: int = 0
    skipped: str | None = None  # why nothing was compacted
    errors: tuple[str, ...] = field(default_factory=tuple)
    # The small files each of the job's partitions held after the run, when it counted
    # them (a compacted partition: the files the compaction wrote, small or not).
    small_files: Mapping[PartitionKey, int] | None = None


def after_commit(
    *,
    table_uri: str,
    partition_columns: Sequence[str],
    added_partitions: Iterable[Mapping[str, str | None]],
    version: int | None,
    settings: AutoCompactSettings,
    configuration: Mapping[str, str | None] | None,
    load_table: Callable[[], Any] | None = None,
    storage_options: Mapping[str, str] | None = None,
    added_sizes: Sequence[int] | None = None,
) -> CompactionOutcome | None:
    """Run (or schedule) auto compaction after the commit of ``version``; never raises.

    ``added_partitions``: the partition values of the files the commit added with
    ``dataChange=true`` (a commit that added none triggers nothing, as in delta-spark);
    ``added_sizes``: their sizes in bytes, in the same order, when known (they let the
    background worker skip a check that cannot reach the threshold).
    ``configuration``: the table's properties, or None to read them from ``load_table()``
    (a delta-rs table at or after the commit, e.g. the one the commit used), which also
    counts the small files before any lease is taken or log loaded again. Returns the
    outcome of a synchronous run, None when scheduled or not triggered.
    """
    try:
        if settings.enabled is False or version is None:
            return None
        columns = tuple(partition_columns)
        keys = [tuple(p.get(c) for c in columns) for p in added_partitions]
        touched = frozenset(keys)
        if not touched:
            return None
        table = None
        background = settings.background
        if settings.enabled is None:
            if configuration is None and load_table is not None:
                table = load_table()
                configuration = dict(table.metadata().configuration)
            if not enabled_for(settings, configuration or {}):
                return None
            if settings.stream and not asked_for(configuration or {}):
                # On by the stream default alone: in the background, so the stream never
                # waits, and from fewer files (a stream's are tiny, cheap to rewrite).
                background = True
                if settings.min_num_files == DEFAULT_MIN_NUM_FILES:
                    settings = replace(settings, min_num_files=STREAM_MIN_NUM_FILES)
        job = CompactionJob(
            table_uri,
            columns,
            touched,
            settings,
            storage_options,
            version,
            small_added=_small_added(keys, added_sizes, settings),
        )
        if background:
            _WORKER.submit(job)
            return None
        if table is None and load_table is not None:
            table = load_table()
        if table is not None and not eligible_partitions(table, job):
            return _skipped(job, "no partition it wrote holds enough small files")
        return run(job)
    except Exception:  # the writer's commit is in: nothing here may fail it
        log.warning("auto compaction of %s was not started", table_uri, exc_info=True)
        return None


def _small_added(
    keys: Sequence[PartitionKey], sizes: Sequence[int] | None, settings: AutoCompactSettings
) -> dict[PartitionKey, int] | None:
    """Per partition, how many of a commit's added files are small; None when the sizes
    are not known."""
    if sizes is None or len(sizes) != len(keys):
        return None
    counts = dict.fromkeys(keys, 0)
    for key, size in zip(keys, sizes, strict=True):
        if size < settings.small_file_size:
            counts[key] += 1
    return counts


def run(job: CompactionJob) -> CompactionOutcome:
    """Compact the job's eligible partitions in one ``dataChange=false`` commit, holding
    the table's compaction lease (:mod:`deltaflow.table._compaction_lease`); never raises."""
    if not _compaction_lease.supported(job.table_uri):
        if job.table_uri not in _warned:
            _warned.add(job.table_uri)
            log.warning(
                "auto compaction of %s is off: on a store without put-if-absent deltaflow"
                " cannot keep two compactions apart (delta-rs would let both commit and"
                " duplicate rows). Run OPTIMIZE from one writer instead.",
                job.table_uri,
            )
        return _skipped(job, "store without put-if-absent")
    try:
        lease = _compaction_lease.try_acquire(job.table_uri)
    except (OSError, DeltaflowError) as exc:
        return _skipped(job, f"no compaction lease: {exc}")
    if lease is None:
        return _skipped(job, "another compaction or commit holds the table's lease")
    try:
        return _compact(job)
    finally:
        _compaction_lease.release(job.table_uri, lease)


_warned: set[str] = set()


def _compact(job: CompactionJob) -> CompactionOutcome:
    from deltalake import CommitProperties

    from deltaflow.table._protocol import Protocol
    from deltaflow.table._snapshot import open_latest

    started = time.perf_counter()
    try:
        table = open_latest(
            job.table_uri, dict(job.storage_options) if job.storage_options else None
        )
        if Protocol.of(table.protocol()).delta_rs_unwritable:
            # Identity columns / clustering: delta-rs cannot commit an OPTIMIZE there;
            # a clustered table is laid out by OPTIMIZE's clustering instead.
            return _skipped(job, "the table uses features delta-rs cannot compact")
        if _dml_lease.live_leases(job.table_uri):
            return _skipped(job, "a DML is running on the table")
        counts = {key: 0 for key in job.partitions} | small_files_per_partition(table, job)
        eligible = _eligible(counts, job)
        if not eligible:
            return replace(
                _skipped(job, "no partition it wrote holds enough small files"),
                small_files=counts,
            )
        # delta-spark's Optimize parameters; delta-rs adds its own (predicate, targetSize).
        extra = dict(job.commit_info or {})
        parameters = {
            "auto": True,
            "zOrderBy": "[]",
            "clusterBy": "[]",
            **dict(extra.pop("operationParameters", None) or {}),
        }
        metrics = table.optimize.compact(
            partition_filters=partition_filters(job.partition_columns, eligible),
            target_size=job.settings.max_file_size,
            commit_properties=CommitProperties(
                custom_metadata={**extra, "operationParameters": parameters},
                max_commit_retries=_COMPACTION_COMMIT_RETRIES,
            ),
            post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
        )
    except Exception as exc:  # a lost conflict, or anything else: give up, quietly
        if _LOG_GAP in str(exc) and not job.partition_columns and _uri.is_local(job.table_uri):
            return _compact_on_log_writer(job, started)
        log.warning(
            "auto compaction of %s (after version %s) gave up: %s",
            job.table_uri,
            job.triggered_by,
            exc,
        )
        return CompactionOutcome(None, skipped="failed", errors=(str(exc),))
    removed = int(metrics.get("numFilesRemoved", 0))
    version = int(table.version()) if removed else None
    if version is not None:  # the compaction's own commit gets the same log upkeep
        _log_upkeep.after_commit(
            job.table_uri,
            version,
            configuration=table.metadata().configuration,
            storage_options=dict(job.storage_options) if job.storage_options else None,
        )
    log.info(
        "auto compaction of %s (after version %s): %d partitions, %d files -> %d, version %s,"
        " %.0f ms",
        job.table_uri,
        job.triggered_by,
        len(eligible),
        removed,
        int(metrics.get("numFilesAdded", 0)),
        version,
        (time.perf_counter() - started) * 1000,
    )
    added = int(metrics.get("numFilesAdded", 0))
    # The compacted partitions' new files, spread evenly (sizes unknown: counted small,
    # which at worst brings the next check forward).
    after = counts | {key: -(-added // len(eligible)) for key in eligible}
    return CompactionOutcome(version, removed, added, len(eligible), small_files=after)


# delta-rs's refusal of a log listing that missed a commit landing during it.
_LOG_GAP = "Expected contiguous commit files"


def _compact_on_log_writer(job: CompactionJob, started: float) -> CompactionOutcome:
    """The small files of an unpartitioned local table rewritten and committed by
    deltaflow's log writer (``_cluster_optimize``'s compaction without clustering
    columns), which reads the commits it raced by name. For the table delta-rs's OPTIMIZE
    cannot commit to: a log so large that its listing misses commits landing meanwhile (a
    long-running real-time sink's; ``deltaflow.table._pace``), where delta-rs's conflict
    check after a lost race fails every time."""
    from deltaflow.table import _cluster_optimize
    from deltaflow.table._snapshot import load_snapshot

    storage = dict(job.storage_options) if job.storage_options else None
    try:
        snapshot = load_snapshot(job.table_uri, storage_options=storage)
        extra = dict(job.commit_info or {})
        parameters = {"auto": True, **dict(extra.pop("operationParameters", None) or {})}
        result = _cluster_optimize.cluster(
            snapshot,
            commit_info={**extra, "operationParameters": parameters},
            small=(job.settings.small_file_size, job.settings.max_file_size),
        )
    except Exception as exc:  # as the delta-rs route: give up, the next write asks again
        log.warning(
            "auto compaction of %s (after version %s, on the log writer) gave up: %s",
            job.table_uri,
            job.triggered_by,
            exc,
        )
        return CompactionOutcome(None, skipped="failed", errors=(str(exc),))
    if result.version is None:
        return _skipped(job, "no partition it wrote holds enough small files")
    log.info(
        "auto compaction of %s (after version %s, on the log writer): %d files -> %d,"
        " version %s, %.0f ms",
        job.table_uri,
        job.triggered_by,
        len(result.files_removed),
        len(result.files_added),
        result.version,
        (time.perf_counter() - started) * 1000,
    )
    return CompactionOutcome(
        result.version,
        len(result.files_removed),
        len(result.files_added),
        1,
        small_files={(): len(result.files_added)},
    )


# A compaction that keeps losing the race to a busy table gives up early: the next
# write asks again, and each retry re-reads the winners' commits.
_COMPACTION_COMMIT_RETRIES = 3


def _skipped(job: CompactionJob, why: str) -> CompactionOutcome:
    log.debug("auto compaction of %s skipped: %s", job.table_uri, why)
    return CompactionOutcome(None, skipped=why)


def eligible_partitions(table: Any, job: CompactionJob) -> list[PartitionKey]:
    """The job's partitions with at least minNumFiles small files, most first, at most
    maxNumModifiedPartitions of them."""
    return _eligible(small_files_per_partition(table, job), job)


def _eligible(counts: Mapping[PartitionKey, int], job: CompactionJob) -> list[PartitionKey]:
    return sorted(
        (key for key, n in counts.items() if n >= max(job.settings.min_num_files, 2)),
        key=lambda key: -counts[key],
    )[: job.settings.max_partitions]


def small_files_per_partition(table: Any, job: CompactionJob) -> dict[PartitionKey, int]:
    """How many live files under the small-file size each of the job's partitions holds."""
    actions = table.get_add_actions(flatten=True)
    sizes = actions.column("size_bytes").to_pylist()
    small = job.settings.small_file_size
    if not job.partition_columns:
        return {(): sum(1 for s in sizes if s < small)}
    types = _partition_types(table, job.partition_columns)
    wanted = {_normal(key, types): key for key in job.partitions}
    columns = [
        actions.column(f"partition.{c}").to_pylist()
        if f"partition.{c}" in actions.column_names
        else [None] * len(sizes)
        for c in job.partition_columns
    ]
    counts: dict[PartitionKey, int] = {}
    for row, size in enumerate(sizes):
        if size >= small:
            continue
        typed = tuple(_partitions.serialize_partition_value(col[row]) for col in columns)
        key = wanted.get(typed)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


def _partition_types(table: Any, columns: Sequence[str]) -> list[str]:
    import json

    fields = {f["name"]: f["type"] for f in json.loads(table.schema().to_json())["fields"]}
    return [str(fields[c]) if isinstance(fields.get(c), str) else "string" for c in columns]


def _normal(key: PartitionKey, types: Sequence[str]) -> PartitionKey:
    """A serialized key in the form the typed values of ``get_add_actions`` serialize to."""
    out: list[str | None] = []
    for raw, type_name in zip(key, types, strict=True):
        try:
            typed = _partitions.parse_partition_value(raw, type_name)
        except ValueError:
            typed = raw
        out.append(_partitions.serialize_partition_value(typed))
    return tuple(out)


def partition_filters(
    columns: Sequence[str], partitions: Sequence[PartitionKey]
) -> list[tuple[str, str, Any]] | None:
    """delta-rs filters selecting ``partitions``: ``column in (values)`` per column.

    delta-rs takes one conjunction, so with several partition columns this selects the
    cross product of the values: a superset, whose extra partitions are compacted only
    when they hold two or more small files. A column with a null value is not filtered.
    """
    filters: list[tuple[str, str, Any]] = []
    for index, column in enumerate(columns):
        values = {key[index] for key in partitions}
        if None in values or "" in values:
            continue
        filters.append((column, "in", sorted(v for v in values if v is not None)))
    return filters or None


# ---- background runs -----------------------------------------------------------------


class _BackgroundWorker:
    """One daemon thread per process; one pending job per table, merged while it waits,
    paced per table by its cost (:mod:`deltaflow.table._pace`).

    At interpreter exit (:meth:`close`, an ``atexit`` hook) the jobs still waiting are
    dropped (the next commit asks again) and a running one is waited for: a daemon thread
    left inside delta-rs while the interpreter finalizes can crash the process (seen:
    ``deltaflow serve`` killed by SIGSEGV as it stopped)."""

    # An idle thread exits after this long; the next request starts a new one.
    IDLE_SECONDS = 30.0
    # How long exit waits for a running compaction (a partition's small files: seconds).
    EXIT_WAIT_SECONDS = 120.0
    # How long a table's small-file count stands in for a check (see _check).
    COUNT_SECONDS = 60.0

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: dict[str, CompactionJob] = {}
        self._running = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._hooked = False
        self.outcomes: list[CompactionOutcome] = []  # the last few, for tests and bench
        # A table's next run waits nine times its last one's duration (_pace).
        self._pace = Pace()
        self._hurry = 0  # callers of wait_idle: what waits runs now
        # Per table: when its small files were counted, and the count per partition since
        # updated by this process's commits (the worker thread's alone).
        self._counts: dict[str, tuple[float, dict[PartitionKey, int]]] = {}

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._pending.clear()
        if not self.wait_idle(self.EXIT_WAIT_SECONDS):
            log.warning(
                "exiting while an auto compaction still runs (over %.0f s)", self.EXIT_WAIT_SECONDS
            )

    def submit(self, job: CompactionJob) -> None:
        with self._changed:
            if self._closed:
                return
            if not self._hooked:
                self._hooked = True
                atexit.register(self.close)
            waiting = self._pending.get(job.table_uri)
            if waiting is not None:
                job = replace(
                    job,
                    partitions=waiting.partitions | job.partitions,
                    triggered_by=job.triggered_by,
                    small_added=_summed(waiting.small_added, job.small_added),
                )
            self._pending[job.table_uri] = job
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="deltaflow-auto-compact", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def _loop(self) -> None:
        while True:
            with self._changed:
                # While a table waits out its pace, its requests merge.
                uri = self._pace.next_ready(
                    self._changed, self._pending, lambda: self._hurry > 0, self.IDLE_SECONDS
                )
                if uri is None:
                    self._thread = None
                    return
                job = self._pending.pop(uri)
                self._running += 1
            started = time.monotonic()
            outcome = CompactionOutcome(None, skipped="failed")
            try:
                outcome = self._check(job)
            finally:
                with self._changed:
                    self._running -= 1
                    self._pace.ran(uri, started, time.monotonic())
                    self.outcomes = [*self.outcomes[-15:], outcome]
                    self._changed.notify_all()

    def _check(self, job: CompactionJob) -> CompactionOutcome:
        """Run the job unless the small files this process counted rule it out.

        Checking means loading the whole table with delta-rs to count its small files; a
        real-time sink commits up to 20 times a second, and loads after each commit took
        27% of the brain's wall time (docs/notes/rtm-commit.md) though a compaction came
        only every ~10 commits. So the last count, plus the small files this process's own
        commits added since, decides: under the threshold in every partition the job
        names, no load. Files other writers add are missed until the count is redone (on
        the next job past the threshold, or once ``COUNT_SECONDS`` old); their own
        writers' hooks see them."""
        known = self._counts.get(job.table_uri)
        if known is not None and job.small_added is not None:
            counted_at, counts = known
            if (
                time.monotonic() - counted_at < self.COUNT_SECONDS
                and job.partitions <= counts.keys()
            ):
                counts = _summed(counts, job.small_added) or {}
                self._counts[job.table_uri] = (counted_at, counts)
                if not _eligible(counts, job):
                    return _skipped(
                        job, "too few small files (counted from this process's commits)"
                    )
        outcome = run(job)
        if outcome.small_files is None:
            self._counts.pop(job.table_uri, None)
        else:
            self._counts[job.table_uri] = (time.monotonic(), dict(outcome.small_files))
        return outcome

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no job waits or runs (the waiting ones run now, paced or not);
        False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._hurry += 1
            self._changed.notify_all()
            try:
                while self._pending or self._running:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._changed.wait(left)
            finally:
                self._hurry -= 1
        return True


def _summed(
    a: Mapping[PartitionKey, int] | None, b: Mapping[PartitionKey, int] | None
) -> dict[PartitionKey, int] | None:
    """Two per-partition counts added up; None when either is not known."""
    if a is None or b is None:
        return None
    return {key: a.get(key, 0) + b.get(key, 0) for key in a.keys() | b.keys()}


_WORKER = _BackgroundWorker()


def wait_for_background(timeout: float = 60.0) -> bool:
    """Wait until this process's background compactions are done; False on timeout."""
    return _WORKER.wait_idle(timeout)
