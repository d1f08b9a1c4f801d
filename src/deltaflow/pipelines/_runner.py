"""Running a pipeline update: resolve the graph, publish the datasets, run the flows.

A *triggered* update runs every selected flow to completion: streaming flows with
``availableNow`` (all data available when the flow starts, then stop), materialized
views recomputed, ``once`` flows a single time ever (until a full refresh). Flows run in
dependency order, independent ones in parallel (``pipelines.maxConcurrentFlows``
threads), each retried with exponential backoff (``pipelines.maxFlowRetryAttempts``; none
in development mode). A failed flow fails the update and skips the flows downstream
of it; the others still run, as in Lakeflow.

Exactly once: a streaming flow's progress is its checkpoint; a flow with expectations
writes each micro-batch with ``txnAppId`` / ``txnVersion`` (the checkpoint's identity and
the batch id), so a batch replayed after a crash is not written twice. A materialized
view is replaced in one commit: readers see the old or the new result, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.errors import DeltaflowError, typed_error
from deltaflow.pipelines import _cdc, _expectations
from deltaflow.pipelines._analysis import Resolution, ResolvedFlow, resolve
from deltaflow.pipelines._declarations import AutoCdcFlow, AutoCdcSnapshotFlow, Flow
from deltaflow.pipelines._event_log import EventLog, Origin
from deltaflow.pipelines._graph import Graph
from deltaflow.pipelines._reads import reading_with
from deltaflow.pipelines._storage import CatalogPublisher, Storage
from deltaflow.pipelines.errors import (
    ExpectationViolationError,
    FlowFailedError,
    GraphValidationError,
    PipelineError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FlowStatus = Literal["COMPLETED", "FAILED", "SKIPPED"]


@dataclass(frozen=True)
class PipelineSettings:
    """What an update needs beyond the graph (``spark-pipeline.yml``'s fields).

    ``configuration`` is set on the Spark session for the update (read it in queries
    with ``spark.conf.get``); ``pipelines.*`` keys in it tune the runner.
    """

    name: str
    storage: str
    database: str = "default"
    configuration: Mapping[str, str] = field(default_factory=dict)
    development: bool = False

    @property
    def pipeline_id(self) -> str:
        return self.name

    def setting(self, key: str, default: str) -> str:
        return self.configuration.get(key, default)


@dataclass(frozen=True)
class FlowReport:
    """How one flow ended in an update."""

    name: str
    target: str
    status: FlowStatus
    attempts: int = 0
    rows_written: int | None = None
    expectations: tuple[_expectations.ExpectationCounts, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class UpdateReport:
    update_id: str
    state: Literal["COMPLETED", "FAILED"]
    flows: Mapping[str, FlowReport]

    def raise_for_failure(self) -> None:
        failed = {n: r.error or r.status for n, r in self.flows.items() if r.status == "FAILED"}
        if failed:
            raise FlowFailedError(
                f"update {self.update_id} failed: "
                + "; ".join(f"{n}: {e}" for n, e in failed.items()),
                update_id=self.update_id,
                failed=failed,
            )


# ---- dry run --------------------------------------------------------------------------


def dry_run(spark: SparkSession, graph: Graph, settings: PipelineSettings) -> Resolution:
    """Validate ``graph`` without running anything or touching the pipeline's tables:
    every query is analysed against empty tables in a scratch database and directory,
    dropped afterwards. Raises :class:`GraphValidationError` (cycle, missing input,
    schema conflict, bad expectation) or :class:`UserQueryError`."""
    import tempfile

    scratch = tempfile.mkdtemp(prefix="deltaflow-dry-run-")
    database = f"deltaflow_dry_run_{uuid.uuid4().hex[:12]}"
    storage = Storage(scratch, database)
    spark.sql(f"CREATE DATABASE `{database}`")
    try:
        with _session_for(spark, settings, database):
            resolution = resolve(spark, graph, CatalogPublisher(spark, storage))
            _check_flow_shapes(resolution)
            return resolution
    finally:
        spark.sql(f"DROP DATABASE IF EXISTS `{database}` CASCADE")
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


# ---- an update ------------------------------------------------------------------------


def run_update(
    spark: SparkSession,
    graph: Graph,
    settings: PipelineSettings,
    *,
    refresh: Sequence[str] | None = None,
    full_refresh: Sequence[str] | None = None,
    full_refresh_all: bool = False,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> UpdateReport:
    """Run one triggered update of the pipeline; the report says how each flow ended
    (``report.raise_for_failure()`` to turn failures into an exception).

    ``refresh``: update only these datasets; ``full_refresh``: these datasets are
    emptied and their flows start over (checkpoints reset); ``full_refresh_all``: all.
    ``on_event``: called with each event-log row as it is recorded (live progress).
    """
    storage = Storage(settings.storage, settings.database)
    update_id = str(uuid.uuid4())
    origin = Origin(settings.pipeline_id, settings.name, update_id)
    log = EventLog(storage.event_log, origin, on_event)
    reset = _names_or_all(graph, full_refresh, full_refresh_all)
    selected = _selected(graph, refresh, full_refresh, full_refresh_all)
    log.emit(
        "create_update",
        f"Update {update_id[:8]} started",
        {
            "cause": "API_CALL",
            "full_refresh": full_refresh_all,
            "full_refresh_selection": sorted(reset) if not full_refresh_all else [],
            "refresh_selection": sorted(refresh or []),
            "development": settings.development,
        },
    )
    _progress(log, "INITIALIZING")
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{settings.database}`")
    try:
        with _session_for(spark, settings, settings.database):
            for name in reset:
                for flow in graph.flows_into(name):
                    storage.reset_checkpoint(flow.name)
            _progress(log, "SETTING_UP_TABLES")
            resolution = resolve(spark, graph, CatalogPublisher(spark, storage))
            _check_flow_shapes(resolution)
            _truncate(spark, resolution, storage, reset)
            for resolved in resolution.flows.values():
                _flow_definition(log, resolution, resolved)
            _progress(log, "RUNNING")
            log.flush()
            reports = _Scheduler(spark, resolution, settings, storage, log, selected).run()
    except Exception as exc:
        error = typed_error(exc) or exc
        _progress(log, "FAILED", error=str(error))
        log.flush()
        if error is exc:
            raise
        raise error from None
    state: Literal["COMPLETED", "FAILED"] = (
        "FAILED" if any(r.status == "FAILED" for r in reports.values()) else "COMPLETED"
    )
    _progress(log, state)
    log.flush()
    return UpdateReport(update_id, state, reports)


def _names_or_all(graph: Graph, names: Sequence[str] | None, every: bool) -> set[str]:
    if every:
        return {d.name for d in graph.datasets.values() if d.kind != "temporary_view"}
    found = set()
    for name in names or ():
        dataset = graph.dataset(name)
        if dataset is None:
            raise GraphValidationError(
                f"full refresh of {name!r}: the pipeline has no such dataset"
                f" (datasets: {', '.join(sorted(graph.datasets))}).",
                flow=name,
                problem="unknown_dataset",
            )
        found.add(dataset.name)
    return found


def _selected(
    graph: Graph,
    refresh: Sequence[str] | None,
    full_refresh: Sequence[str] | None,
    every: bool,
) -> set[str] | None:
    """Datasets whose flows run; None: all of them."""
    if every or (refresh is None and full_refresh is None):
        return None
    return _names_or_all(graph, refresh, False) | _names_or_all(graph, full_refresh, False)


@contextlib.contextmanager
def _session_for(spark: SparkSession, settings: PipelineSettings, database: str) -> Iterator[None]:
    """The update's configuration and current database, restored afterwards."""
    before = {k: spark.conf.get(k, None) for k in settings.configuration}
    current = spark.catalog.currentDatabase()
    for key, value in settings.configuration.items():
        spark.conf.set(key, value)
    spark.catalog.setCurrentDatabase(database)
    try:
        yield
    finally:
        spark.catalog.setCurrentDatabase(current)
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _check_flow_shapes(resolution: Resolution) -> None:
    """Streaming tables take streams (or ``once`` batches); materialized views take
    batch queries."""
    for resolved in resolution.flows.values():
        flow = resolved.flow
        if not isinstance(flow, Flow):
            continue
        target = resolution.datasets.get(flow.target)
        kind = target.kind if target is not None else "sink"
        if kind in ("streaming_table", "sink") and not resolved.streaming and not flow.once:
            raise GraphValidationError(
                f"flow {flow.name!r} ({flow.location}) is a batch query writing"
                f" {kind.replace('_', ' ')} {flow.target!r}. Read a stream"
                " (spark.readStream... / read_stream), declare a materialized_view instead,"
                " or mark a backfill append_flow(once=True).",
                flow=flow.name,
                problem="batch_into_stream",
            )
        if kind == "materialized_view" and resolved.streaming:
            raise GraphValidationError(
                f"materialized view {flow.target!r} ({flow.location}) has a streaming query;"
                " a materialized view is recomputed from a batch query. Declare a streaming"
                " table (table / create_streaming_table) for a stream.",
                flow=flow.name,
                problem="stream_into_view",
            )


def _truncate(
    spark: SparkSession, resolution: Resolution, storage: Storage, names: set[str]
) -> None:
    """Full refresh: the datasets' tables emptied in one commit each (readers see the
    old rows or none), with the schema the queries produce now."""
    import json

    from pyspark.sql.types import StructType

    for name in sorted(names):
        resolved = resolution.datasets.get(name)
        if resolved is None or resolved.kind == "temporary_view":
            continue
        schema = StructType.fromJson(json.loads(resolved.schema_json))
        (
            spark.createDataFrame([], schema)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .save(storage.table_path(resolved.dataset))
        )


def _progress(log: EventLog, state: str, error: str | None = None) -> None:
    log.emit(
        "update_progress",
        f"Update is {state}",
        {"state": state},
        level="ERROR" if state == "FAILED" else "INFO",
        error=error,
    )


def _flow_definition(log: EventLog, resolution: Resolution, resolved: ResolvedFlow) -> None:
    flow = resolved.flow
    target = resolution.datasets.get(flow.target)
    log.emit(
        "flow_definition",
        f"Flow {flow.name!r} defined",
        {
            "output_dataset": flow.target,
            "input_datasets": list(resolved.inputs),
            "flow_type": type(flow).__name__,
            "output_kind": target.kind if target is not None else "sink",
            "streaming": resolved.streaming,
            "schema_json": resolved.schema_json,
        },
        flow=flow.name,
        dataset=flow.target,
    )


# ---- running the flows ----------------------------------------------------------------


class _Scheduler:
    """Runs the selected flows: each once its upstream flows completed, up to
    ``pipelines.maxConcurrentFlows`` at a time; downstream of a failure is skipped."""

    def __init__(
        self,
        spark: SparkSession,
        resolution: Resolution,
        settings: PipelineSettings,
        storage: Storage,
        log: EventLog,
        selected: set[str] | None,
    ) -> None:
        self._spark = spark
        self._resolution = resolution
        self._settings = settings
        self._storage = storage
        self._log = log
        views = {n for n, d in resolution.datasets.items() if d.kind == "temporary_view"}
        self._runnable = [
            name
            for name in resolution.order
            if resolution.flows[name].flow.target not in views
            and (selected is None or resolution.flows[name].flow.target in selected)
        ]

    def run(self) -> dict[str, FlowReport]:
        reports: dict[str, FlowReport] = {}
        upstream = {
            n: [u for u in self._resolution.upstream(n) if u in self._runnable]
            for n in self._runnable
        }
        for name in self._runnable:
            self._flow_progress(name, "QUEUED")
        workers = max(1, int(self._settings.setting("pipelines.maxConcurrentFlows", "2")))
        running: dict[Future[FlowReport], str] = {}
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pipeline-flow") as pool:
            while len(reports) < len(self._runnable):
                for name in self._runnable:
                    if name in reports or name in running.values():
                        continue
                    needs = upstream[name]
                    if any(reports.get(u) and reports[u].status != "COMPLETED" for u in needs):
                        reports[name] = self._skip(name, needs, reports)
                    elif all(u in reports for u in needs):
                        running[pool.submit(self._run_with_retries, name)] = name
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    reports[running.pop(future)] = future.result()
        return reports

    def _skip(self, name: str, needs: list[str], reports: Mapping[str, FlowReport]) -> FlowReport:
        failed = next(u for u in needs if reports[u].status != "COMPLETED")
        target = self._resolution.flows[name].flow.target
        self._flow_progress(name, "SKIPPED", message=f"upstream flow {failed!r} did not complete")
        return FlowReport(name, target, "SKIPPED", error=f"upstream flow {failed!r} failed")

    def _run_with_retries(self, name: str) -> FlowReport:
        resolved = self._resolution.flows[name]
        retries = (
            0
            if self._settings.development
            else int(self._settings.setting("pipelines.maxFlowRetryAttempts", "2"))
        )
        backoff = float(self._settings.setting("pipelines.flowRetryBackoffSeconds", "1"))
        attempt = 0
        while True:
            attempt += 1
            self._flow_progress(name, "RUNNING", attempt=attempt)
            try:
                outcome = _FlowRun(self._spark, self._resolution, resolved, self._storage).run()
            except Exception as exc:
                error = typed_error(exc) or exc
                terminal = isinstance(error, ExpectationViolationError | GraphValidationError)
                if terminal or attempt > retries:
                    self._flow_progress(name, "FAILED", attempt=attempt, error=error)
                    self._log.flush()
                    return FlowReport(
                        name, resolved.flow.target, "FAILED", attempt, error=str(error)
                    )
                # Transient failures (a lost executor, a conflicting commit) often pass
                # on a second try; the wait doubles so a struggling store is not hammered.
                self._flow_progress(name, "RETRYING", attempt=attempt, error=error)
                time.sleep(backoff * 2 ** (attempt - 1))
                continue
            report = FlowReport(
                name,
                resolved.flow.target,
                "COMPLETED",
                attempt,
                rows_written=outcome.rows,
                expectations=outcome.expectations,
            )
            self._flow_progress(name, "COMPLETED", attempt=attempt, report=report)
            self._log.flush()
            return report

    def _flow_progress(
        self,
        name: str,
        status: str,
        *,
        attempt: int | None = None,
        error: BaseException | None = None,
        report: FlowReport | None = None,
        message: str | None = None,
    ) -> None:
        target = self._resolution.flows[name].flow.target
        details: dict[str, Any] = {"status": status}
        if attempt is not None:
            details["attempt"] = attempt
        if report is not None:
            details["metrics"] = {"num_output_rows": report.rows_written}
            if report.expectations:
                failed = {e.name: e.failed_records for e in report.expectations}
                dropped = _dropped(self._resolution, name, failed)
                details["data_quality"] = {
                    "dropped_records": dropped,
                    "expectations": [e.to_json() for e in report.expectations],
                }
        self._log.emit(
            "flow_progress",
            message or f"Flow {name!r} is {status}",
            details,
            level="ERROR" if status == "FAILED" else ("WARN" if status == "RETRYING" else "INFO"),
            flow=name,
            dataset=target,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )


def _dropped(resolution: Resolution, flow_name: str, failed: Mapping[str, int]) -> int:
    # An upper bound when several drop rules break on the same row (each counts it):
    # the exact figure is input rows less rows written, which metrics also give.
    rules = _flow_expectations(resolution, resolution.flows[flow_name])
    return sum(failed.get(e.name, 0) for e in rules if e.action == "drop")


def _flow_expectations(resolution: Resolution, resolved: ResolvedFlow) -> tuple[Any, ...]:
    flow = resolved.flow
    target = resolution.datasets.get(flow.target)
    own = flow.expectations if isinstance(flow, Flow) else ()
    return (target.dataset.expectations if target is not None else ()) + own


@dataclass
class _Outcome:
    rows: int | None = None
    expectations: tuple[_expectations.ExpectationCounts, ...] = ()


class _FlowRun:
    """One attempt at one flow."""

    def __init__(
        self, spark: SparkSession, resolution: Resolution, resolved: ResolvedFlow, storage: Storage
    ) -> None:
        self._spark = spark
        self._resolution = resolution
        self._resolved = resolved
        self._storage = storage
        self._rules = _flow_expectations(resolution, resolved)

    def run(self) -> _Outcome:
        flow = self._resolved.flow
        if isinstance(flow, AutoCdcSnapshotFlow):
            raise PipelineError(
                f"AUTO CDC from snapshot {flow.name!r}: declared, but not run by this version"
                " of deltaflow yet (issue 13). Use create_auto_cdc_flow over a change feed"
                " meanwhile.",
                flow=flow.name,
            )
        if isinstance(flow, AutoCdcFlow):
            return self._auto_cdc(flow)
        df = self._query(flow)
        target = self._resolution.datasets.get(flow.target)
        if target is None or (target.kind == "streaming_table" and self._resolved.streaming):
            return self._stream(flow, df, target is None)
        if target.kind == "materialized_view":
            return self._recompute(flow, df)
        return self._once(flow, df)

    def _query(self, flow: Flow) -> DataFrame:
        reader = _TableReader(self._spark)
        with reading_with(reader):
            df = flow.func()
        _expectations.check_constraints(df, self._rules, flow.name)
        return df

    def _path(self, flow: Flow) -> str:
        return self._storage.table_path(self._resolution.datasets[flow.target].dataset)

    def _stream(self, flow: Flow, df: DataFrame, to_sink: bool) -> _Outcome:
        checkpoint = self._storage.checkpoint(flow.name)
        writer = (
            df.writeStream.queryName(f"{flow.name}")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
        )
        batches = None
        if to_sink:
            sink = self._resolution.graph.sink(flow.target)
            assert sink is not None
            query = writer.format(sink.format).options(**sink.options).start()
        elif self._rules:
            batches = _CheckedBatches(self, flow, _flow_identity(checkpoint))
            query = writer.foreachBatch(batches).start()
        else:
            query = writer.format("delta").option("mergeSchema", "true").start(self._path(flow))
        _await(query, flow.name)
        if batches is not None:
            return batches.outcome()
        return _Outcome(rows=_input_rows(query))

    def _auto_cdc(self, flow: AutoCdcFlow) -> _Outcome:
        source = self._spark.readStream.table(flow.source)
        dataset = self._resolution.datasets[flow.target].dataset
        batches = _cdc.CdcBatches(
            self._spark,
            flow,
            self._storage.table_path(dataset),
            self._storage.cdc_state(flow.name),
        )
        query = (
            source.writeStream.queryName(flow.name)
            .option("checkpointLocation", self._storage.checkpoint(flow.name))
            .trigger(availableNow=True)
            .foreachBatch(batches)
            .start()
        )
        _await(query, flow.name)
        return _Outcome(rows=batches.rows)

    def _recompute(self, flow: Flow, df: DataFrame) -> _Outcome:
        return self._write_batch(flow, df, mode="overwrite", app=None)

    def _once(self, flow: Flow, df: DataFrame) -> _Outcome:
        """A ``once`` flow: appended a single time; the marker in its checkpoint (gone
        after a full refresh) says it ran, the app transaction makes a crash between
        the append and the marker harmless."""
        checkpoint = self._storage.checkpoint(flow.name)
        marker = os.path.join(checkpoint, "once-completed")
        if os.path.exists(marker):
            return _Outcome(rows=0)
        outcome = self._write_batch(flow, df, mode="append", app=(_flow_identity(checkpoint), 0))
        with open(marker, "w") as out:
            out.write("1\n")
        return outcome

    def _write_batch(
        self, flow: Flow, df: DataFrame, *, mode: str, app: tuple[str, int] | None
    ) -> _Outcome:
        """Expectations applied to ``df`` (persisted meanwhile: it is read twice), then
        one write: ``overwrite`` (a materialized view, schema replaced) or ``append``
        (idempotent under ``app`` = (txnAppId, txnVersion))."""
        from pyspark import StorageLevel

        if not self._rules:
            self._write(flow, df, mode, app)
            return _Outcome(rows=_last_output_rows(self._path(flow)))
        df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            checked = _expectations.apply(df, self._rules, flow=flow.name, dataset=flow.target)
            self._write(flow, checked.kept, mode, app)
        finally:
            df.unpersist()
        return _Outcome(rows=checked.kept_rows, expectations=checked.counts)

    def _write(self, flow: Flow, df: DataFrame, mode: str, app: tuple[str, int] | None) -> None:
        writer = df.write.format("delta").mode(mode)
        if mode == "overwrite":
            writer = writer.option("overwriteSchema", "true")
        else:
            writer = writer.option("mergeSchema", "true")
        if app is not None:
            writer = writer.option("txnAppId", app[0]).option("txnVersion", str(app[1]))
        writer.save(self._path(flow))


class _CheckedBatches:
    """foreachBatch of a streaming flow with expectations: each micro-batch counted,
    filtered and appended idempotently (``txnAppId`` / ``txnVersion``)."""

    def __init__(self, run: _FlowRun, flow: Flow, identity: str) -> None:
        self._run = run
        self._flow = flow
        self._identity = identity
        self._lock = threading.Lock()
        self._rows = 0
        self._counts: dict[str, list[int]] = {}

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        outcome = self._run._write_batch(
            self._flow, batch, mode="append", app=(self._identity, batch_id)
        )
        with self._lock:
            self._rows += outcome.rows or 0
            for c in outcome.expectations:
                seen = self._counts.setdefault(c.name, [0, 0])
                seen[0] += c.passed_records
                seen[1] += c.failed_records

    def outcome(self) -> _Outcome:
        counts = tuple(
            _expectations.ExpectationCounts(name, self._flow.target, passed, failed)
            for name, (passed, failed) in self._counts.items()
        )
        return _Outcome(rows=self._rows, expectations=counts)


class _TableReader:
    """``dlt.read`` while running: the dataset's table (or view) by name."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def read(self, name: str, *, streaming: bool) -> DataFrame:
        reader = self._spark.readStream if streaming else self._spark.read
        return reader.table(name)


def _await(query: Any, flow: str) -> None:
    """Wait for an ``availableNow`` stream to finish; its failure as a typed error."""
    query.awaitTermination()
    failure = query.exception()
    if failure is not None:
        raise typed_error(failure) or DeltaflowError(
            f"flow {flow!r}: its stream failed: {failure}", flow=flow
        )


def _flow_identity(checkpoint: str) -> str:
    """The identity of a flow's checkpoint, made with it: the app id of its idempotent
    writes. A full refresh deletes the checkpoint, so batch ids restarting at 0 write
    under a new identity instead of being taken for replays."""
    os.makedirs(checkpoint, exist_ok=True)
    path = os.path.join(checkpoint, "deltaflow-flow-id")
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as out:
            out.write(f"deltaflow-pipeline-flow-{uuid.uuid4()}")
        os.replace(path + ".tmp", path)
    with open(path) as source:
        return source.read().strip()


def _input_rows(query: Any) -> int:
    """Rows the stream read over its recent progress reports (Spark keeps the last
    ``spark.sql.streaming.numRecentProgressUpdates``, 100 by default)."""
    total = 0
    for progress in query.recentProgress:
        value = progress.get("numInputRows") if isinstance(progress, dict) else None
        total += int(value if value is not None else getattr(progress, "numInputRows", 0))
    return total


def _last_output_rows(path: str) -> int | None:
    from deltalake import DeltaTable

    from deltaflow.table import _uri

    entry = DeltaTable(_uri.delta_rs_uri(_uri.normalize_uri(path))).history(1)[0]
    metrics = entry.get("operationMetrics") or {}
    value = metrics.get("numOutputRows")
    return None if value is None else int(value)
