"""Log upkeep after a commit: checkpoints and expired log cleanup, as delta-spark does.

Every commit route (delta-rs transactions in :mod:`deltaflow.table._commit`, deltaflow's
own log writer in :mod:`deltaflow.table._log_commit`, auto compaction) calls
:func:`after_commit` with the version it just committed:

* **Checkpoint** when the version is a multiple of ``delta.checkpointInterval`` (default
  :data:`DEFAULT_CHECKPOINT_INTERVAL`, delta-spark's 10). delta-rs's own post-commit hook
  checkpoints when ``version + 1`` is a multiple (versions 9, 19, ...) and defaults to 100,
  so our delta-rs commits turn that hook off (:data:`DELTA_RS_HOOKS_OFF`) and every route
  gets the same checkpoints a delta-spark writer would write (10, 20, ...).
* **Expired log cleanup** right after a checkpoint this commit wrote, unless
  ``delta.enableExpiredLogCleanup`` is false: delta-rs deletes the JSON commits and
  checkpoints older than ``delta.logRetentionDuration`` (default ``interval 30 days``),
  never past the newest checkpoint before that cutoff, so every remaining version can
  still be read. Time travel to a removed version is a ``VersionNotFoundError``. Cleanup
  waits while a running stream's reader lease needs a commit it would delete.

Neither ever fails the writer: the commit is in, and a missing checkpoint only slows
readers down (the next multiple writes one). A failure is logged as a warning.

In a long-lived process (the brain: :func:`run_in_background`) both run on a background
thread after the commit returned, coalesced per table, never two at once; elsewhere on
the committing thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.transaction import PostCommitHookProperties

from deltaflow.table import _log, _reader_leases, _uri
from deltaflow.table._pace import Pace

log = logging.getLogger(__name__)

# delta-spark's default. delta-rs defaults to 100; 10 keeps a streaming table (one commit
# per micro-batch) cheap to open, at one checkpoint write per ten commits.
DEFAULT_CHECKPOINT_INTERVAL = 10

# delta.logRetentionDuration's default (delta-spark's and delta-rs's): 30 days.
DEFAULT_LOG_RETENTION_SECONDS = 30 * 86400.0

# Our delta-rs commits leave checkpoints and cleanup to :func:`after_commit`.
DELTA_RS_HOOKS_OFF = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def checkpoint_interval(configuration: Mapping[str, str | None]) -> int:
    """``delta.checkpointInterval`` of a table configuration (a bad value: the default)."""
    value = table_property(configuration, "delta.checkpointInterval")
    if value:
        try:
            return max(int(value), 1)
        except ValueError:
            pass
    return DEFAULT_CHECKPOINT_INTERVAL


_configured_interval = checkpoint_interval  # after_commit's argument shadows the name


def expired_log_cleanup_enabled(configuration: Mapping[str, str | None]) -> bool:
    """``delta.enableExpiredLogCleanup`` (default true, as in delta-spark)."""
    value = table_property(configuration, "delta.enableExpiredLogCleanup")
    return value is None or value.strip().lower() != "false"


def after_commit(
    table_uri: str,
    version: int | None,
    *,
    configuration: Mapping[str, str | None] | None = None,
    checkpoint_interval: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> bool:
    """Checkpoint ``version`` of ``table_uri`` if it is due, then clean up expired log
    files. ``configuration``: the table's properties when the caller has them;
    ``checkpoint_interval``: its interval when the caller knows only that (the properties
    are then read from the log only when a checkpoint is due); neither: read from the log.
    True when a checkpoint was written here; never raises."""
    if version is None or version <= 0:
        return False
    known_not_due = checkpoint_interval is not None and version % max(checkpoint_interval, 1)
    if configuration is None and known_not_due:
        return False
    if configuration is not None and version % _configured_interval(configuration):
        return False
    if _WORKER.enabled:
        _WORKER.submit(table_uri, version, configuration, storage_options)
        return False
    return run(table_uri, version, configuration, storage_options)


def run(
    table_uri: str,
    version: int,
    configuration: Mapping[str, str | None] | None = None,
    storage_options: dict[str, str] | None = None,
) -> bool:
    """The upkeep of ``version`` now, on this thread; True when it wrote a checkpoint;
    never raises."""
    try:
        return _upkeep(table_uri, version, configuration, storage_options)
    except Exception as exc:  # the commit is in: upkeep never fails the writer
        log.warning(
            "log upkeep after version %d of %s failed (the commit stands): %s",
            version,
            table_uri,
            exc,
        )
        return False


def _upkeep(
    table_uri: str,
    version: int,
    configuration: Mapping[str, str | None] | None,
    storage_options: dict[str, str] | None,
) -> bool:
    table: DeltaTable | None = None
    if configuration is None:
        table = _load(table_uri, version, storage_options)
        configuration = table.metadata().configuration
    if version % checkpoint_interval(configuration):
        return False
    if _already_checkpointed(table_uri, version):
        return False  # another route (or writer) already did this version's upkeep
    table = table or _load(table_uri, version, storage_options)
    table.create_checkpoint()
    log.info("wrote a checkpoint at version %d of %s", version, table_uri)
    if expired_log_cleanup_enabled(configuration):
        if _reader_needs_expired_log(table_uri, configuration):
            log.info("expired log cleanup of %s waits: a running stream still reads it", table_uri)
        else:
            table.cleanup_metadata()
    return True


def _reader_needs_expired_log(table_uri: str, configuration: Mapping[str, str | None]) -> bool:
    """Whether a running stream's lease (:mod:`deltaflow.table._reader_leases`) needs a
    commit older than ``delta.logRetentionDuration``, which cleanup would delete. Cleanup
    then waits for a later checkpoint: the stream moves on, or its lease lapses."""
    timeout = _reader_leases.timeout_seconds(configuration)
    live, _ = _reader_leases.live_leases(table_uri, timeout)
    if not live:
        return False
    retention = _reader_leases.interval_seconds(
        table_property(configuration, "delta.logRetentionDuration")
    )
    cutoff = time.time() - (DEFAULT_LOG_RETENTION_SECONDS if retention is None else retention)
    oldest = min(lease.version for lease in live)
    fs, root = _uri.filesystem(table_uri)
    info = fs.get_file_info(f"{root}/_delta_log/{oldest:020d}.json")
    if info.type == pafs.FileType.NotFound:
        return False  # already gone (or not written yet): nothing left to keep
    return info.mtime is not None and info.mtime.timestamp() < cutoff


def _already_checkpointed(table_uri: str, version: int) -> bool:
    try:
        newest = _log.last_checkpoint(table_uri)
    except Exception:  # e.g. a store pyarrow cannot open without options: just checkpoint
        return False
    return newest is not None and newest >= version


def _load(table_uri: str, version: int, storage_options: dict[str, str] | None) -> DeltaTable:
    return DeltaTable(
        _uri.delta_rs_uri(table_uri), version=version, storage_options=storage_options
    )


def table_property(configuration: Mapping[str, str | None], name: str) -> str | None:
    """A table property's value by its name in any case, or None."""
    wanted = name.lower()  # delta-spark matches table property keys case-insensitively
    for key, value in configuration.items():
        if key.lower() == wanted:
            return value
    return None


# ---- upkeep off the commit path --------------------------------------------------------


@dataclass(frozen=True)
class _Due:
    version: int
    configuration: Mapping[str, str | None] | None
    storage_options: dict[str, str] | None


class _UpkeepWorker:
    """Upkeep on a background thread, for long-lived processes (the brain).

    Off by default: a one-shot process (the CLI, a script's write) checkpoints on the
    committing thread, as delta-spark does. :func:`run_in_background` turns it on; then a
    due checkpoint is queued and the commit returns at once. Per table one upkeep waits
    at most: a newer due version replaces a waiting one (coalescing: a reader needs the
    newest checkpoint, not every one), and one thread runs them in turn, so two
    checkpoints of a table never overlap. :func:`flush` (the brain's shutdown, and an
    ``atexit`` hook) runs what still waits, so an exiting process keeps its checkpoints.

    **Paced by its cost** (:mod:`deltaflow.table._pace`): a table's next upkeep starts no
    sooner than nine times its last one's duration after it ended. On a
    local disk its load, checkpoint and cleanup each walk the whole ``_delta_log``; with a
    long-running real-time sink's log that takes seconds, and checkpoints then come
    further apart (the newest due version each time) instead of holding a core.
    """

    def __init__(self) -> None:
        self.enabled = False
        self._changed = threading.Condition()
        self._pending: dict[str, _Due] = {}
        self._pace = Pace()
        self._hurry = 0  # callers of flush(): what waits runs now, paced or not
        self._warned: dict[str, float] = {}  # per table: the last slow-upkeep warning
        self._running: str | None = None
        self._thread: threading.Thread | None = None
        self._hooked = False
        self.done: list[tuple[str, int, bool]] = []  # the last few (uri, version, wrote)

    def submit(
        self,
        table_uri: str,
        version: int,
        configuration: Mapping[str, str | None] | None,
        storage_options: dict[str, str] | None,
    ) -> None:
        with self._changed:
            waiting = self._pending.get(table_uri)
            if waiting is None or waiting.version < version:
                self._pending[table_uri] = _Due(version, configuration, storage_options)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="deltaflow-log-upkeep", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def _loop(self) -> None:
        while True:
            with self._changed:
                uri = self._pace.next_ready(
                    self._changed, self._pending, lambda: self._hurry > 0, 30.0
                )
                if uri is None:
                    self._thread = None
                    return
                due = self._pending.pop(uri)
                self._running = uri
            wrote = False
            started = time.monotonic()
            try:
                wrote = run(uri, due.version, due.configuration, due.storage_options)
            finally:
                ended = time.monotonic()
                if ended - started >= SLOW_UPKEEP_SECONDS:
                    self._warn_slow(uri, ended - started, due.configuration)
                with self._changed:
                    self._running = None
                    self._pace.ran(uri, started, ended)
                    self.done = [*self.done[-31:], (uri, due.version, wrote)]
                    self._changed.notify_all()

    def _warn_slow(
        self, uri: str, seconds: float, configuration: Mapping[str, str | None] | None
    ) -> None:
        """Say once an hour per table that its upkeep is slow because its local log holds
        very many files (what every load walks), and what to set."""
        now = time.monotonic()
        if not _uri.is_local(uri) or (
            now - self._warned.get(uri, -WARN_EVERY_SECONDS) < WARN_EVERY_SECONDS
        ):
            return
        try:
            files = len(os.listdir(os.path.join(_uri.local_path(uri), "_delta_log")))
        except OSError:
            return
        if files < MANY_LOG_FILES:
            return  # slow for another reason (a large table's checkpoint)
        self._warned[uri] = now
        retention = table_property(configuration or {}, "delta.logRetentionDuration")
        log.warning(
            "log upkeep of %s took %.1f s (checkpoint and expired log cleanup): its"
            " _delta_log holds %d files, and every load of the table (delta-rs, Polars,"
            " delta-spark, deltaflow's scans) walks them all on a local disk. A writer that"
            " commits several times a second (a real-time sink) adds about a million a day,"
            " kept for delta.logRetentionDuration (%s). deltaflow now checkpoints this"
            " table less often. To keep loads fast, keep less log history (time travel"
            " reaches only that far back): ALTER TABLE delta.`%s` SET TBLPROPERTIES"
            " ('delta.logRetentionDuration' = 'interval 2 hours'), or raise the sink's"
            " realTimeCommitIntervalMs.",
            uri,
            seconds,
            files,
            retention or "interval 30 days, the default",
            uri,
        )

    def flush(self, timeout: float) -> bool:
        """Wait until no upkeep waits or runs; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._hurry += 1
            self._changed.notify_all()
        try:
            return self._run_out(deadline)
        finally:
            with self._changed:
                self._hurry -= 1

    def _run_out(self, deadline: float) -> bool:
        with self._changed:
            while self._pending or self._running is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self._thread is None or not self._thread.is_alive():
                    break  # no thread to run them (interpreter exit): run them here
                self._changed.wait(left)
            leftovers = list(self._pending.items())
            self._pending.clear()
        for uri, due in leftovers:
            run(uri, due.version, due.configuration, due.storage_options)
        return True


# An upkeep this slow is a log with very many files: warned about (once an hour per table).
SLOW_UPKEEP_SECONDS = 1.0
# ... and explained by the log's size from this many files in ``_delta_log``.
MANY_LOG_FILES = 20_000
WARN_EVERY_SECONDS = 3600.0

_WORKER = _UpkeepWorker()
# How long a process's exit waits for the upkeep still queued (a checkpoint: seconds).
EXIT_FLUSH_SECONDS = 120.0


def run_in_background(enabled: bool = True) -> None:
    """Run this process's log upkeep on a background thread (the brain), or not."""
    _WORKER.enabled = enabled
    if enabled and not _WORKER._hooked:
        _WORKER._hooked = True
        atexit.register(flush, EXIT_FLUSH_SECONDS)


def flush(timeout: float = EXIT_FLUSH_SECONDS) -> bool:
    """Run every queued upkeep to its end; False when ``timeout`` passed first."""
    done = _WORKER.flush(timeout)
    if not done:
        log.warning("log upkeep still running after %.0f s", timeout)
    return done
