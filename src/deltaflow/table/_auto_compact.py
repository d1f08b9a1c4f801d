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
requests per table, so the writer does not wait at all.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from deltaflow.errors import DeltaflowError, InvalidOptionError
from deltaflow.table import _compaction_lease, _dml_lease, _log_upkeep, _partitions, _uri

log = logging.getLogger(__name__)

# delta-spark's table properties and session settings (DeltaConfigs, DeltaSQLConf).
TABLE_PROPERTY = "delta.autoOptimize.autoCompact"
LEGACY_TABLE_PROPERTY = "delta.autoOptimize"
ENABLED_CONF = "spark.databricks.delta.autoCompact.enabled"
MIN_NUM_FILES_CONF = "spark.databricks.delta.autoCompact.minNumFiles"
MAX_FILE_SIZE_CONF = "spark.databricks.delta.autoCompact.maxFileSize"
MIN_FILE_SIZE_CONF = "spark.databricks.delta.autoCompact.minFileSize"
MAX_PARTITIONS_CONF = "spark.databricks.delta.autoCompact.maxNumModifiedPartitions"
# deltaflow's own: run the compaction on a background thread instead of inside the commit.
BACKGROUND_CONF = "spark.deltaflow.autoCompact.background"
SESSION_CONFS = (
    ENABLED_CONF,
    MIN_NUM_FILES_CONF,
    MAX_FILE_SIZE_CONF,
    MIN_FILE_SIZE_CONF,
    MAX_PARTITIONS_CONF,
    BACKGROUND_CONF,
)

DEFAULT_MIN_NUM_FILES = 50
# deltaflow's threshold when a stream's table is compacted by the stream default alone
# (minNumFiles not set): a micro-batch's files are tiny, so rewriting ten of them costs
# little, and a stream that stops leaves at most nine small files per partition behind.
STREAM_MIN_NUM_FILES = 10
DEFAULT_MAX_FILE_SIZE = 128 * 1024 * 1024
DEFAULT_MAX_PARTITIONS = 128
# Property values that turn it on: delta-spark's "true"; Databricks' "auto" (it tunes the
# target size; deltaflow uses maxFileSize) and "legacy" (an alias of "true").
_ON_VALUES = ("true", "auto", "legacy")


@dataclass(frozen=True)
class AutoCompactSettings:
    """The writer's session settings; the table's property decides when ``enabled`` is None."""

    enabled: bool | None = None
    min_num_files: int = DEFAULT_MIN_NUM_FILES
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    min_file_size: int | None = None  # None: half of max_file_size, as delta-spark
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    background: bool = False
    # The writer is a stream (a micro-batch or real-time sink, HTTP ingest): its many small
    # commits make small files, so compaction is on unless the session or the table says
    # otherwise, and runs in the background so the stream never waits for it.
    stream: bool = False

    @property
    def small_file_size(self) -> int:
        return self.min_file_size if self.min_file_size is not None else self.max_file_size // 2

    @classmethod
    def from_conf(cls, conf: Mapping[str, str | None]) -> AutoCompactSettings:
        """Settings from Spark conf keys (any case); bad values raise InvalidOptionError."""
        wanted = {k.lower(): k for k in SESSION_CONFS}
        given = {wanted[k.lower()]: v.strip() for k, v in conf.items() if k.lower() in wanted and v}
        settings = cls()
        if ENABLED_CONF in given:
            settings = replace(settings, enabled=_enabled(given[ENABLED_CONF], ENABLED_CONF))
        if BACKGROUND_CONF in given:
            settings = replace(settings, background=_flag(given[BACKGROUND_CONF], BACKGROUND_CONF))
        if MIN_NUM_FILES_CONF in given:
            value = _count(given[MIN_NUM_FILES_CONF], MIN_NUM_FILES_CONF)
            settings = replace(settings, min_num_files=value)
        if MAX_FILE_SIZE_CONF in given:
            value = _count(given[MAX_FILE_SIZE_CONF], MAX_FILE_SIZE_CONF)
            settings = replace(settings, max_file_size=value)
        if MIN_FILE_SIZE_CONF in given:
            value = _count(given[MIN_FILE_SIZE_CONF], MIN_FILE_SIZE_CONF)
            settings = replace(settings, min_file_size=value)
        if MAX_PARTITIONS_CONF in given:
            value = _count(given[MAX_PARTITIONS_CONF], MAX_PARTITIONS_CONF)
            settings = replace(settings, max_partitions=value)
        return settings

    def to_conf(self) -> dict[str, str]:
        """The settings that differ from the defaults, as Spark conf keys."""
        out: dict[str, str] = {}
        if self.enabled is not None:
            out[ENABLED_CONF] = str(self.enabled).lower()
        if self.background:
            out[BACKGROUND_CONF] = "true"
        for key, value, default in (
            (MIN_NUM_FILES_CONF, self.min_num_files, DEFAULT_MIN_NUM_FILES),
            (MAX_FILE_SIZE_CONF, self.max_file_size, DEFAULT_MAX_FILE_SIZE),
            (MIN_FILE_SIZE_CONF, self.min_file_size, None),
            (MAX_PARTITIONS_CONF, self.max_partitions, DEFAULT_MAX_PARTITIONS),
        ):
            if value != default:
                out[key] = str(value)
        return out


DEFAULT_SETTINGS = AutoCompactSettings()


def _enabled(raw: str, key: str) -> bool:
    value = raw.lower()
    if value in _ON_VALUES:
        return True
    if value == "false":
        return False
    raise InvalidOptionError(
        f"{key} must be one of true, false, auto, legacy; got {raw!r}.",
        option=key,
        valid=(*_ON_VALUES, "false"),
    )


def _flag(raw: str, key: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise InvalidOptionError(
            f"{key} must be 'true' or 'false', got {raw!r}.", option=key, valid=("true", "false")
        )
    return raw.lower() == "true"


def _count(raw: str, key: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and key in (MAX_FILE_SIZE_CONF, MAX_PARTITIONS_CONF)):
        raise InvalidOptionError(
            f"{key} must be a whole number above 0 (bytes for sizes), got {raw!r}.", option=key
        )
    return value


def enabled_for(settings: AutoCompactSettings, configuration: Mapping[str, str | None]) -> bool:
    """delta-spark's precedence: the session setting, then the legacy ``delta.autoOptimize``,
    then ``delta.autoOptimize.autoCompact``; when none is set, off for batch writers and
    on for streams (deltaflow's default: a stream's table stays healthy by itself)."""
    if settings.enabled is not None:
        return settings.enabled
    lowered = {k.lower(): (v or "").strip().lower() for k, v in configuration.items()}
    legacy = lowered.get(LEGACY_TABLE_PROPERTY.lower(), "")
    if legacy == "true":
        return True
    value = lowered.get(TABLE_PROPERTY.lower(), "")
    if value and value not in (*_ON_VALUES, "false"):
        log.warning("ignoring %s=%r: it takes true, false, auto, legacy", TABLE_PROPERTY, value)
        value = ""
    if not value and not legacy:
        return settings.stream
    return value in _ON_VALUES


def _asked_for(configuration: Mapping[str, str | None]) -> bool:
    """Whether the table's properties turn auto compaction on themselves."""
    return enabled_for(AutoCompactSettings(), configuration)


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


@dataclass(frozen=True)
class CompactionOutcome:
    """What one run did: the OPTIMIZE version (None when nothing was compacted)."""

    version: int | None
    files_removed: int = 0
    files_added: int = 0
    partitions: int = 0
    skipped: str | None = None  # why nothing was compacted
    errors: tuple[str, ...] = field(default_factory=tuple)


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
) -> CompactionOutcome | None:
    """Run (or schedule) auto compaction after the commit of ``version``; never raises.

    ``added_partitions``: the partition values of the files the commit added with
    ``dataChange=true`` (a commit that added none triggers nothing, as in delta-spark).
    ``configuration``: the table's properties, or None to read them from ``load_table()``
    (a delta-rs table at or after the commit, e.g. the one the commit used), which also
    counts the small files before any lease is taken or log loaded again. Returns the
    outcome of a synchronous run, None when scheduled or not triggered.
    """
    try:
        if settings.enabled is False or version is None:
            return None
        columns = tuple(partition_columns)
        touched = frozenset(tuple(p.get(c) for c in columns) for p in added_partitions)
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
            if settings.stream and not _asked_for(configuration or {}):
                # On by the stream default alone: in the background, so the stream never
                # waits, and from fewer files (a stream's are tiny, cheap to rewrite).
                background = True
                if settings.min_num_files == DEFAULT_MIN_NUM_FILES:
                    settings = replace(settings, min_num_files=STREAM_MIN_NUM_FILES)
        job = CompactionJob(table_uri, columns, touched, settings, storage_options, version)
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
    from deltalake import CommitProperties, DeltaTable

    from deltaflow.table._protocol import Protocol

    started = time.perf_counter()
    try:
        table = DeltaTable(
            _uri.delta_rs_uri(job.table_uri),
            storage_options=dict(job.storage_options) if job.storage_options else None,
        )
        if Protocol.of(table.protocol()).delta_rs_unwritable:
            # Identity columns / clustering: delta-rs cannot commit an OPTIMIZE there;
            # a clustered table is laid out by OPTIMIZE's clustering instead.
            return _skipped(job, "the table uses features delta-rs cannot compact")
        if _dml_lease.live_leases(job.table_uri):
            return _skipped(job, "a DML is running on the table")
        eligible = eligible_partitions(table, job)
        if not eligible:
            return _skipped(job, "no partition it wrote holds enough small files")
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
    return CompactionOutcome(version, removed, int(metrics.get("numFilesAdded", 0)), len(eligible))


# A compaction that keeps losing the race to a busy table gives up early: the next
# write asks again, and each retry re-reads the winners' commits.
_COMPACTION_COMMIT_RETRIES = 3


def _skipped(job: CompactionJob, why: str) -> CompactionOutcome:
    log.debug("auto compaction of %s skipped: %s", job.table_uri, why)
    return CompactionOutcome(None, skipped=why)


def eligible_partitions(table: Any, job: CompactionJob) -> list[PartitionKey]:
    """The job's partitions with at least minNumFiles small files, most first, at most
    maxNumModifiedPartitions of them."""
    counts = small_files_per_partition(table, job)
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
    """One daemon thread per process; one pending job per table, merged while it waits.

    At interpreter exit (:meth:`close`, an ``atexit`` hook) the jobs still waiting are
    dropped (the next commit asks again) and a running one is waited for: a daemon thread
    left inside delta-rs while the interpreter finalizes can crash the process (seen:
    ``deltaflow serve`` killed by SIGSEGV as it stopped)."""

    # An idle thread exits after this long; the next request starts a new one.
    IDLE_SECONDS = 30.0
    # How long exit waits for a running compaction (a partition's small files: seconds).
    EXIT_WAIT_SECONDS = 120.0

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: dict[str, CompactionJob] = {}
        self._running = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._hooked = False
        self.outcomes: list[CompactionOutcome] = []  # the last few, for tests and bench

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
                if not self._pending:
                    self._changed.wait(self.IDLE_SECONDS)
                if not self._pending:
                    self._thread = None
                    return
                uri = next(iter(self._pending))
                job = self._pending.pop(uri)
                self._running += 1
            try:
                outcome = run(job)
            finally:
                with self._changed:
                    self._running -= 1
                    self.outcomes = [*self.outcomes[-15:], outcome]
                    self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True


_WORKER = _BackgroundWorker()


def wait_for_background(timeout: float = 60.0) -> bool:
    """Wait until this process's background compactions are done; False on timeout."""
    return _WORKER.wait_idle(timeout)
