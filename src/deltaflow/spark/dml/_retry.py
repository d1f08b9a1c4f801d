"""DML that lost a race to a compaction runs again, instead of failing.

A compaction (auto compaction after another writer's commit, OPTIMIZE, REORG) rewrites
files without changing rows (``dataChange=false``). A DELETE / UPDATE / MERGE that read
such a file before it was replaced cannot commit its removes: the rows now live in the
compacted file. delta-spark fails the DML then (ConcurrentDeleteReadException); deltaflow
re-runs it on the new version, a bounded number of times, when every commit it lost to
was such a rewrite (any data-changing winner still fails it, as delta-spark would). The
attempt that lost wrote files no commit references; VACUUM removes them.

While it runs, a DML holds a lease that keeps auto compaction off its table
(:mod:`deltaflow.table._dml_lease`), so only a compaction already under way when it started
can make it lose. Its session settings for auto compaction ride along to its commit.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from deltaflow.table import _auto_compact, _commit, _compaction_log, _dml_lease
from deltaflow.table.errors import ConcurrentWriteError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T")

# Each re-run follows a compaction that landed while the DML ran; auto compaction runs
# at most once per write, so a few re-runs cover a busy table.
MAX_RERUNS = 3


@dataclass(frozen=True)
class _Running:
    settings: _auto_compact.AutoCompactSettings
    table_uri: str
    lease: str | None


_running: contextvars.ContextVar[_Running | None] = contextvars.ContextVar(
    "deltaflow_dml_running", default=None
)
# The DML's commit runs the post-commit hook itself, after giving up its lease.
_NO_HOOK = _auto_compact.AutoCompactSettings(enabled=False)


def session_settings(spark: SparkSession) -> _auto_compact.AutoCompactSettings:
    """The session's auto compaction settings (Spark conf)."""
    conf = {key: spark.conf.get(key, None) for key in _auto_compact.SESSION_CONFS}
    return _auto_compact.AutoCompactSettings.from_conf(conf)


def run_dml(spark: SparkSession, operation: str, uri: str, run: Callable[[], T]) -> T:
    """``run()`` (one whole DML) under a lease that keeps auto compaction off the table;
    again when it lost only to compactions."""
    settings = session_settings(spark)
    for attempt in range(MAX_RERUNS + 1):
        with _dml_lease.holding(uri) as lease:
            token = _running.set(_Running(settings, uri, lease))
            try:
                return run()
            except ConcurrentWriteError as exc:
                kind = str(getattr(exc, "kind", ""))
                read_version = getattr(exc, "read_version", None)
                if attempt == MAX_RERUNS or not _compaction_log.lost_to_compaction(
                    uri, kind, read_version
                ):
                    raise
                log.warning(
                    "%s on %s lost to a compaction after version %s (%s); running it again"
                    " (attempt %d of %d)",
                    operation,
                    uri,
                    read_version,
                    kind,
                    attempt + 2,
                    MAX_RERUNS + 1,
                )
            finally:
                _running.reset(token)
    raise AssertionError("unreachable")  # the loop returns or raises


def commit(request: _commit.CommitRequest) -> _commit.CommitResult:
    """A DML's commit. Under :func:`run_dml`: the lease goes once the commit is in, then
    the post-commit hook runs with the session's auto compaction settings."""
    running = _running.get()
    if running is None:
        return _commit.commit(request)
    result = _commit.commit(replace(request, auto_compact=_NO_HOOK))
    _dml_lease.release(running.table_uri, running.lease)
    if not result.skipped:
        _commit.after_commit(replace(request, auto_compact=running.settings), result)
    return result


def committed_elsewhere(request: _commit.CommitRequest, result: _commit.CommitResult) -> None:
    """After a DML that another engine committed (delta-rs's MERGE, its own hooks off):
    what :func:`commit` does once the commit is in. ``request`` describes that commit."""
    running = _running.get()
    if running is not None:
        _dml_lease.release(running.table_uri, running.lease)
        request = replace(request, auto_compact=running.settings)
    _commit.after_commit(request, result)
