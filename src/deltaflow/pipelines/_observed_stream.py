"""A streaming flow whose rules are only ``expect`` / ``expect_or_drop``, written by the
Delta stream sink: the drop rules as a filter, the counts as the stream's observed
metrics (Spark's ``DataFrame.observe``: counted by each micro-batch's own job).

This saves the ``foreachBatch`` round trip of :class:`._flows._CheckedBatches` (a Python
call and a second write path per batch). What stays the same:

* Exactly once: the sink's app transaction id is the flow's identity (the id its
  ``foreachBatch`` writes use), the version the batch id; so a checkpoint may move from
  one route to the other (a rule changed to ``expect_or_fail`` and back) and a batch
  replayed after a crash is still written once.
* Counts per update: a replayed batch the sink skips (already in the log) still runs,
  into Spark's ``noop`` sink, and reports its metrics again; batches at or below the
  app transaction found when the flow started are left out, so nothing counts twice.

Counts are read from the query's recent progress reports, of which Spark keeps
``spark.sql.streaming.numRecentProgressUpdates`` per query: the stream starts with at least
:data:`PROGRESS_KEPT` (a backlog of that many micro-batches, a million files at the default
``maxFilesPerTrigger``, in one update); beyond that the counts cover the last batches.
Continuous updates keep ``foreachBatch`` (their counts are read while they run).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _expectations

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaflow.pipelines._declarations import Expectation


PROGRESS_KEPT = 1000
_RETENTION = "spark.sql.streaming.numRecentProgressUpdates"
# Flows start in parallel threads on one session: the retention is raised and restored
# around one start at a time (the query keeps the value it started with).
_starting = threading.Lock()


def start_keeping_progress(spark: SparkSession, start: Callable[[], Any]) -> Any:
    """``start()`` the stream with at least :data:`PROGRESS_KEPT` progress reports kept."""
    with _starting:
        before = spark.conf.get(_RETENTION, None)
        if before is not None and int(before) >= PROGRESS_KEPT:
            return start()
        spark.conf.set(_RETENTION, str(PROGRESS_KEPT))
        try:
            return start()
        finally:
            if before is None:
                spark.conf.unset(_RETENTION)
            else:
                spark.conf.set(_RETENTION, before)


def observable(rules: tuple[Expectation, ...], triggered: bool) -> bool:
    """Whether a flow with ``rules`` can take this route: no ``fail`` rule (those are
    checked before anything is written) and a triggered update. Either stream writer
    (the JVM sink, or the Python one for object stores and ``nativeWrite=false``) takes
    the flow's identity as its app id."""
    return bool(rules) and triggered and not _expectations.has_fail_rule(rules)


class ObservedStream:
    """The rows to stream (:attr:`kept`) and, once the stream ended, the rules' counts
    over the batches it wrote (:meth:`counts`)."""

    def __init__(self, df: DataFrame, rules: tuple[Expectation, ...], *, dataset: str) -> None:
        self._rules = rules
        self._dataset = dataset
        # Unique per query: Spark refuses two observations of one name in a plan.
        self.name = f"deltaflow_expectations_{uuid.uuid4().hex[:12]}"
        _, keep, aggregate = _expectations.counting(rules)
        observed = df.observe(self.name, *aggregate)
        self.kept = observed if keep is None else observed.filter(keep)

    def counts(
        self, query: Any, after: int
    ) -> tuple[int, tuple[_expectations.ExpectationCounts, ...]]:
        """Rows kept and each rule's counts over batches with ids above ``after`` (those
        at or below were already written: replays the sink skipped)."""
        totals: dict[str, int] = {}
        for progress in query.recentProgress:
            batch = int(_field(progress, "batchId"))
            metrics = (_field(progress, "observedMetrics") or {}).get(self.name)
            if batch <= after or metrics is None:
                continue
            for key, value in _metric_values(metrics).items():
                totals[key] = totals.get(key, 0) + int(value or 0)
        if not totals:
            zero = tuple(
                _expectations.ExpectationCounts(e.name, self._dataset, 0, 0) for e in self._rules
            )
            return 0, zero
        _, kept, counts = _expectations.counts_of(totals, self._rules, self._dataset)
        return kept, counts


def _metric_values(metrics: Any) -> dict[str, Any]:
    """An observation's values by name. Over Spark Connect a progress report carries each
    as ``Row(values=[...], schema={...})``, the names in the schema's fields."""
    row = metrics.asDict() if hasattr(metrics, "asDict") else dict(metrics)
    if set(row) == {"values", "schema"} and isinstance(row["schema"], Mapping):
        names = [field["name"] for field in row["schema"].get("fields", [])]
        return dict(zip(names, row["values"], strict=True))
    return dict(row)


def _field(progress: Any, name: str) -> Any:
    # A StreamingQueryProgress is a Mapping whose properties are the ones to read (over
    # Spark Connect its dict lacks numInputRows and observedMetrics); else a plain dict.
    if hasattr(progress, name):
        return getattr(progress, name)
    if isinstance(progress, Mapping):
        return progress.get(name)
    return None


def last_written_batch(checkpoint: str, table: str, identity: str) -> int:
    """The highest batch id of the flow already in the table (-1: none): batches up to
    it that the stream runs now are replays its sink skips.

    From the checkpoint when it has no batch pending (the last planned batch committed):
    every batch run now is new. A batch planned and not committed (a crash) may or may
    not have reached the table: its app transaction there says."""
    planned = _last_id(checkpoint, "offsets")
    committed = _last_id(checkpoint, "commits")
    if planned <= committed:
        return committed
    from deltalake import DeltaTable

    from deltaflow.table import _uri
    from deltaflow.table._snapshot import table_exists

    uri = _uri.normalize_uri(table)
    if not table_exists(uri):
        return committed
    version = DeltaTable(_uri.delta_rs_uri(uri)).transaction_version(identity)
    return committed if version is None else max(committed, int(version))


def _last_id(checkpoint: str, log: str) -> int:
    """The highest batch id in a checkpoint's ``offsets`` / ``commits`` log (-1: none)."""
    import pyarrow.fs as pafs

    from deltaflow.table import _uri

    fs, root = _uri.filesystem(_uri.normalize_uri(checkpoint))
    selector = pafs.FileSelector(f"{root.rstrip('/')}/{log}", allow_not_found=True)
    ids = [int(i.base_name) for i in fs.get_file_info(selector) if i.base_name.isdigit()]
    return max(ids, default=-1)
