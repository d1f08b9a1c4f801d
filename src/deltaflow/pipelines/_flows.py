"""Running one flow: its query, its write, its metrics (one attempt).

Streaming flows start with a trigger (``availableNow`` in a triggered update, a
processing-time interval in continuous mode); batch flows (materialized views, ``once``
backfills) write once. See :mod:`._runner` for the update around them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.errors import DeltaflowError, typed_error
from deltaflow.pipelines import (
    _cdc,
    _cdc_snapshot,
    _checkpoint_files,
    _expectations,
    _flow_session,
    _incremental,
    _observed_stream,
    _realtime,
)
from deltaflow.pipelines._analysis import Resolution, ResolvedFlow
from deltaflow.pipelines._declarations import AutoCdcFlow, AutoCdcSnapshotFlow, Flow
from deltaflow.pipelines._event_log import EventLog
from deltaflow.pipelines._flow_identity import flow_identity, stream_identity
from deltaflow.pipelines._reads import reading_with
from deltaflow.pipelines._storage import Storage
from deltaflow.pipelines.errors import ExpectationViolationError, GraphValidationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaflow.pipelines._runner import PipelineSettings


def flow_expectations(resolution: Resolution, resolved: ResolvedFlow) -> tuple[Any, ...]:
    flow = resolved.flow
    target = resolution.datasets.get(flow.target)
    own = flow.expectations if isinstance(flow, Flow) else ()
    return (target.dataset.expectations if target is not None else ()) + own


@dataclass
class Outcome:
    rows: int | None = None
    expectations: tuple[_expectations.ExpectationCounts, ...] = ()
    planning: _incremental.Plan | None = None  # a materialized view's refresh


@dataclass(frozen=True)
class Trigger:
    """When a streaming flow's micro-batches run: all available data then stop
    (``availableNow``, a triggered update), every ``interval`` until stopped, or, with
    ``real_time``, Spark's real-time mode with epochs of ``interval`` (:mod:`._realtime`)."""

    interval: str | None = None  # None: availableNow
    real_time: bool = False

    def apply(self, writer: Any) -> Any:
        if self.interval is None:
            return writer.trigger(availableNow=True)
        if self.real_time:
            return _real_time_trigger(writer, self.interval)
        return writer.trigger(processingTime=self.interval)

    @property
    def name(self) -> str:
        """The trigger as the event log names it (Lakeflow's ``pipelines.trigger``)."""
        if self.interval is None:
            return "AvailableNow"
        return "RealTime" if self.real_time else "ProcessingTime"


def _real_time_trigger(writer: Any, epoch: str) -> Any:
    """``writer.trigger(realTime=epoch)``; pyspark 4.1 and 4.2 have that trigger only on
    the JVM (``Trigger.RealTime``)."""
    import inspect

    if "realTime" in inspect.signature(writer.trigger).parameters:
        return writer.trigger(realTime=epoch)
    streaming = writer._spark._jvm.org.apache.spark.sql.streaming
    writer._jwrite = writer._jwrite.trigger(streaming.Trigger.RealTime(epoch))
    return writer


AVAILABLE_NOW = Trigger()


@dataclass
class Running:
    """A started streaming flow: its query and how to read its outcome so far."""

    query: Any
    outcome: Callable[[], Outcome]


# A once flow ran (in its checkpoint; a full refresh deletes it).
ONCE_MARKER = "once-completed"


class FlowRun:
    """One attempt at one flow."""

    def __init__(
        self,
        spark: SparkSession,
        resolution: Resolution,
        resolved: ResolvedFlow,
        storage: Storage,
        trigger: Trigger = AVAILABLE_NOW,
        *,
        first_attempt: bool = False,
    ) -> None:
        self._trigger = trigger
        self._first_attempt = first_attempt
        self._spark = spark
        self._resolution = resolution
        self._resolved = resolved
        self._storage = storage
        self._rules = flow_expectations(resolution, resolved)
        target = resolution.datasets.get(resolved.flow.target)
        confs = _flow_session.flow_confs(resolved.flow, target.dataset if target else None)
        if trigger.real_time:
            confs.update(_realtime.session_confs(resolution, resolved.flow))
        # The session the flow's queries run in: the update's, or its own clone when the
        # flow has spark_conf (see _flow_session).
        self._flow_spark = _flow_session.session_for(spark, confs)

    @property
    def streaming(self) -> bool:
        """A stream (started, then awaited or left running) rather than one batch write."""
        flow = self._resolved.flow
        if isinstance(flow, AutoCdcFlow):
            return True
        target = self._resolution.datasets.get(flow.target)
        return target is None or (target.kind == "streaming_table" and self._resolved.streaming)

    def run(self) -> Outcome:
        """The flow to completion: a stream until it is idle (``availableNow``; with an
        interval trigger it runs until stopped), a batch write once."""
        if self.streaming:
            running = self.start()
            await_stream(running.query, self._resolved.flow.name)
            return running.outcome()
        flow = self._resolved.flow
        if isinstance(flow, AutoCdcSnapshotFlow):
            applier = _cdc_snapshot.SnapshotApplier(
                self._spark,
                flow,
                self._storage.table_path(self._resolution.datasets[flow.target].dataset),
                self._storage.checkpoint(flow.name),
            )
            applier.run()  # snapshots applied; their row counts are in the MERGE commits
            return Outcome()
        assert isinstance(flow, Flow)
        df = self._query(flow)
        target = self._resolution.datasets[flow.target]
        if target.kind == "materialized_view":
            return self._refresh(flow, df)
        return self._once(flow, df)

    def start(self) -> Running:
        """Start the flow's stream with this run's trigger; the caller waits or stops."""
        flow = self._resolved.flow
        if isinstance(flow, AutoCdcFlow):
            return self._auto_cdc(flow)
        assert isinstance(flow, Flow)
        query = self._analysed_stream(flow)
        if query is None:
            query = self._query(flow)
        return self._stream(flow, query, flow.target not in self._resolution.datasets)

    def _analysed_stream(self, flow: Flow) -> DataFrame | None:
        """The stream the update's resolution analysed, for a first attempt whose inputs
        no flow of this update writes: its function need not run again (a stream's
        sources find their offsets when it starts, so nothing of the analysis is stale).
        None otherwise: an upstream flow may have changed its input's columns meanwhile,
        and a retry runs the function again, as a new attempt should."""
        df = self._resolved.df
        if not self._first_attempt or df is None or not df.isStreaming:
            return None
        if self._resolution.upstream(flow.name):
            return None
        return _flow_session.rebind(df, self._flow_spark)

    def _query(self, flow: Flow) -> DataFrame:
        # The rules analysed against this query when the update resolved the graph.
        reader = _TableReader(self._spark)
        with reading_with(reader):
            df = flow.func()
        return _flow_session.rebind(df, self._flow_spark)

    def _path(self, flow: Flow) -> str:
        return self._storage.table_path(self._resolution.datasets[flow.target].dataset)

    def _stream(self, flow: Flow, df: DataFrame, to_sink: bool) -> Running:
        from deltaflow.spark.stream._writer import FLOW_IDENTITY_OPTION

        checkpoint = self._storage.checkpoint(flow.name)
        writer = self._trigger.apply(
            df.writeStream.queryName(f"{flow.name}").option("checkpointLocation", checkpoint)
        )
        if self._trigger.real_time:
            spark, storage = self._flow_spark, self._storage
            started = _realtime.start(spark, writer, self._resolution, flow, storage)
            return Running(started, lambda: Outcome(rows=_input_rows(started)))
        if to_sink:
            return self._to_sink(flow, writer.outputMode(flow.output_mode))
        # Every route into the table writes under the flow's identity (:mod:`._flow_identity`).
        path = self._path(flow)
        identity = stream_identity(checkpoint, path)
        # Batches up to this one are in the table already: replays, written and counted once.
        written = _observed_stream.last_written_batch(checkpoint, path, identity)
        if self._rules and _observed_stream.observable(self._rules, self._trigger.interval is None):
            return self._observed(flow, df, checkpoint, identity, written)
        if self._rules:
            batches = _CheckedBatches(self, flow, identity, written)
            return Running(writer.foreachBatch(batches).start(), batches.outcome)
        plain = (
            writer.format("delta")
            .option("mergeSchema", "true")
            .option(FLOW_IDENTITY_OPTION, identity)
            .start(path)
        )
        return Running(plain, lambda: Outcome(rows=_input_rows(plain, after=written)))

    def _to_sink(self, flow: Flow, writer: Any) -> Running:
        sink = self._resolution.graph.sink(flow.target)
        assert sink is not None
        options = dict(sink.options)
        table = next((options.pop(k) for k in list(options) if k.lower() == "tablename"), None)
        writer = writer.format(sink.format).options(**options)
        # A Delta sink named by table (Lakeflow's `tableName`) is written through the catalog.
        if table is None:
            query = writer.start()
        else:
            with _flow_session.active(self._flow_spark):
                query = writer.toTable(table)
        return Running(query, lambda: Outcome(rows=_input_rows(query)))

    def _observed(
        self, flow: Flow, df: DataFrame, checkpoint: str, identity: str, written: int
    ) -> Running:
        """Rules without ``fail``: the Delta sink writes, the rules counted as the stream's
        observed metrics (:mod:`._observed_stream`)."""
        from deltaflow.spark.stream._writer import FLOW_IDENTITY_OPTION

        path = self._path(flow)
        stream = _observed_stream.ObservedStream(df, self._rules, dataset=flow.target)
        writer = self._trigger.apply(
            stream.kept.writeStream.queryName(flow.name)
            .option("checkpointLocation", checkpoint)
            .format("delta")
            .option("mergeSchema", "true")
            .option(FLOW_IDENTITY_OPTION, identity)
        )
        query = _observed_stream.start_keeping_progress(
            self._flow_spark, lambda: writer.start(path)
        )

        def outcome() -> Outcome:
            kept, counts = stream.counts(query, written)
            return Outcome(rows=kept, expectations=counts)

        return Running(query, outcome)

    def _auto_cdc(self, flow: AutoCdcFlow) -> Running:
        source = self._flow_spark.readStream.table(flow.source)
        dataset = self._resolution.datasets[flow.target].dataset
        batches = _cdc.CdcBatches(
            self._flow_spark,
            flow,
            self._storage.table_path(dataset),
            self._storage.cdc_state(flow.name),
        )
        writer = source.writeStream.queryName(flow.name).option(
            "checkpointLocation", self._storage.checkpoint(flow.name)
        )
        query = self._trigger.apply(writer).foreachBatch(batches).start()
        return Running(query, lambda: Outcome(rows=batches.rows))

    def _refresh(self, flow: Flow, df: DataFrame) -> Outcome:
        """A materialized view: incrementally from its source's change feed when it can
        be, recomputed otherwise (:mod:`._incremental`)."""
        refresh = _incremental.ViewRefresh(
            self._spark,
            flow.name,
            df,
            self._path(flow),
            self._storage.checkpoint(flow.name),
            has_expectations=bool(self._rules),
        )
        plan = refresh.plan()
        if plan.technique == _incremental.NO_OP:
            outcome = Outcome(rows=0)
        elif plan.incremental:
            outcome = Outcome(rows=refresh.apply())
        else:
            rows = refresh.recompute_on_driver() if plan.recompute_on_driver else None
            if rows is not None:
                outcome = Outcome(rows=rows)
            else:
                recompute = refresh.recompute_query()
                outcome = self._write_batch(flow, recompute, mode="overwrite", app=None)
            refresh.recomputed()
        outcome.planning = plan
        return outcome

    def _once(self, flow: Flow, df: DataFrame) -> Outcome:
        """A ``once`` flow: appended a single time; the marker in its checkpoint (gone
        after a full refresh) says it ran, the app transaction makes a crash between
        the append and the marker harmless."""
        checkpoint = self._storage.checkpoint(flow.name)
        if _checkpoint_files.exists(checkpoint, ONCE_MARKER):
            return Outcome(rows=0)
        outcome = self._write_batch(flow, df, mode="append", app=(flow_identity(checkpoint), 0))
        _checkpoint_files.write_text(checkpoint, ONCE_MARKER, "1\n")
        return outcome

    def _write_batch(
        self, flow: Flow, df: DataFrame, *, mode: str, app: tuple[str, int] | None
    ) -> Outcome:
        """Expectations applied to ``df``, then one write: ``overwrite`` (a materialized
        view, schema replaced) or ``append`` (idempotent under ``app`` = (txnAppId,
        txnVersion)). Rows and rules are counted by the write's own job; a ``fail`` rule
        needs the rows counted first (``df`` persisted meanwhile: it is read twice)."""
        from pyspark import StorageLevel

        if not _expectations.has_fail_rule(self._rules):
            observed = _expectations.Observed(df, self._rules, dataset=flow.target)
            self._write(flow, observed.kept, mode, app)
            checked = observed.checked()
            return Outcome(rows=checked.kept_rows, expectations=checked.counts)
        df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            checked = _expectations.apply(df, self._rules, flow=flow.name, dataset=flow.target)
            self._write(flow, checked.kept, mode, app)
        finally:
            df.unpersist()
        return Outcome(rows=checked.kept_rows, expectations=checked.counts)

    def _write(self, flow: Flow, df: DataFrame, mode: str, app: tuple[str, int] | None) -> None:
        writer = df.write.format("delta").mode(mode)
        if mode == "overwrite":
            # overwriteSchema takes the partitioning from partitionBy (none: unpartitioned).
            dataset = self._resolution.datasets[flow.target].dataset
            writer = writer.option("overwriteSchema", "true").partitionBy(*dataset.partition_cols)
        else:
            writer = writer.option("mergeSchema", "true")
        if app is not None:
            writer = writer.option("txnAppId", app[0]).option("txnVersion", str(app[1]))
        writer.save(self._path(flow))


class _CheckedBatches:
    """foreachBatch of a streaming flow with expectations: each micro-batch counted,
    filtered and appended idempotently (``txnAppId`` / ``txnVersion``). Batches up to
    ``written`` (already in the table when the flow started: replays after a crash) are
    not counted again, whether or not their rules were checked before the write."""

    def __init__(self, run: FlowRun, flow: Flow, identity: str, written: int) -> None:
        self._run = run
        self._flow = flow
        self._identity = identity
        self._written = written
        self._lock = threading.Lock()
        self._rows = 0
        self._counts: dict[str, list[int]] = {}

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        outcome = self._run._write_batch(
            self._flow, batch, mode="append", app=(self._identity, batch_id)
        )
        if batch_id <= self._written:
            outcome = Outcome(
                rows=0,
                expectations=tuple(
                    _expectations.ExpectationCounts(c.name, c.dataset, 0, 0)
                    for c in outcome.expectations
                ),
            )
        with self._lock:
            self._rows += outcome.rows or 0
            for c in outcome.expectations:
                seen = self._counts.setdefault(c.name, [0, 0])
                seen[0] += c.passed_records
                seen[1] += c.failed_records

    def outcome(self) -> Outcome:
        counts = tuple(
            _expectations.ExpectationCounts(name, self._flow.target, passed, failed)
            for name, (passed, failed) in self._counts.items()
        )
        return Outcome(rows=self._rows, expectations=counts)


class _TableReader:
    """``dlt.read`` while running: the dataset's table (or view) by name."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def read(self, name: str, *, streaming: bool) -> DataFrame:
        reader = self._spark.readStream if streaming else self._spark.read
        return reader.table(name)


def await_stream(query: Any, flow: str) -> None:
    """Wait for an ``availableNow`` stream to finish; its failure as a typed error."""
    query.awaitTermination()
    failure = query.exception()
    if failure is not None:
        raise typed_error(failure) or DeltaflowError(
            f"flow {flow!r}: its stream failed: {failure}", flow=flow
        )


def _input_rows(query: Any, after: int = -1) -> int:
    """Rows the stream read over its recent progress reports (Spark keeps the last
    ``spark.sql.streaming.numRecentProgressUpdates``, 100 by default), in batches with ids
    above ``after`` (those at or below were written before: replays the sink skipped)."""
    total = 0
    for progress in query.recentProgress:
        # A StreamingQueryProgress is a dict whose properties are the ones to read (over
        # Spark Connect its dict has no numInputRows); an older pyspark's, a plain dict.
        batch, rows = (
            (getattr(progress, "batchId", None), getattr(progress, "numInputRows", 0))
            if hasattr(progress, "numInputRows")
            else (progress.get("batchId"), progress.get("numInputRows"))
        )
        if batch is None or int(batch) > after:
            total += int(rows or 0)
    return total


def event_log_flush_interval(settings: PipelineSettings) -> float:
    """Seconds between event-log commits while flows run
    (``pipelines.eventLog.flushInterval``, default 1): events reach the log that late at
    most, and a long update makes one commit a second, not one per event."""
    return float(settings.setting("pipelines.eventLog.flushInterval", "1"))


@dataclass(frozen=True)
class RetryPolicy:
    """How failed flows are retried: ``retries`` times after the first attempt, waiting
    ``backoff * 2**(n-1)`` seconds before retry n (none in development mode)."""

    retries: int
    backoff: float

    @classmethod
    def of(cls, settings: PipelineSettings) -> RetryPolicy:
        retries = int(settings.setting("pipelines.maxFlowRetryAttempts", "2"))
        backoff = float(settings.setting("pipelines.flowRetryBackoffSeconds", "1"))
        return cls(0 if settings.development else retries, backoff)

    def gives_up(self, error: BaseException, failures: int) -> bool:
        """True when ``error`` (the ``failures``-th in a row) ends the flow: expectation
        and validation errors are final whatever the count."""
        terminal = isinstance(error, ExpectationViolationError | GraphValidationError)
        return terminal or failures > self.retries

    def delay(self, failures: int) -> float:
        # Transient failures (a lost executor, a conflicting commit) often pass on a
        # second try; the wait doubles so a struggling store is not hammered.
        return self.backoff * 2 ** (failures - 1)


def emit_progress(
    log: EventLog,
    resolution: Resolution,
    name: str,
    status: str,
    *,
    outcome: Outcome | None = None,
    error: BaseException | None = None,
    attempt: int | None = None,
    batch: int | None = None,
    message: str | None = None,
    trigger: str | None = None,
) -> None:
    """One ``flow_progress`` event: status, attempt, micro-batch, metrics, data quality;
    ``trigger`` (continuous mode): ``ProcessingTime`` or ``RealTime``."""
    if outcome is not None and outcome.planning is not None:
        plan = outcome.planning
        log.emit(
            "planning_information",
            plan.message(),
            plan.details(resolution.flows[name].flow.target),
            flow=name,
            dataset=resolution.flows[name].flow.target,
        )
    details: dict[str, Any] = {"status": status}
    if attempt is not None:
        details["attempt"] = attempt
    if batch is not None:
        details["batch_id"] = batch
    if trigger is not None:
        details["trigger"] = trigger
    if outcome is not None:
        details["metrics"] = {"num_output_rows": outcome.rows}
        if outcome.expectations:
            rules = flow_expectations(resolution, resolution.flows[name])
            drops = {e.name for e in rules if e.action == "drop"}
            details["data_quality"] = {
                # An upper bound when several drop rules break on one row (each counts
                # it); input rows less rows written is exact.
                "dropped_records": sum(
                    e.failed_records for e in outcome.expectations if e.name in drops
                ),
                "expectations": [e.to_json() for e in outcome.expectations],
            }
    log.emit(
        "flow_progress",
        message or f"Flow {name!r} is {status}",
        details,
        level="ERROR" if status == "FAILED" else ("WARN" if status == "RETRYING" else "INFO"),
        flow=name,
        dataset=resolution.flows[name].flow.target,
        error=None if error is None else f"{type(error).__name__}: {error}",
    )


class UpdateDriver:
    """What drives the flows of one update (triggered or continuous) holds."""

    def __init__(
        self,
        spark: SparkSession,
        resolution: Resolution,
        settings: PipelineSettings,
        storage: Storage,
        log: EventLog,
        runnable: list[str],
    ) -> None:
        self._spark = spark
        self._resolution = resolution
        self._settings = settings
        self._storage = storage
        self._log = log
        self._runnable = runnable
        self._policy = RetryPolicy.of(settings)
        self._prepare()

    def _prepare(self) -> None:
        """What a driver sets up before it runs (nothing by default)."""

    def _progress(self, name: str, status: str, **details: Any) -> None:
        emit_progress(self._log, self._resolution, name, status, **details)
