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
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.errors import typed_error
from deltaflow.pipelines import _connect, _expectations, _realtime
from deltaflow.pipelines._analysis import Resolution, ResolvedFlow, resolve
from deltaflow.pipelines._declarations import Flow
from deltaflow.pipelines._event_log import EventLog, Origin
from deltaflow.pipelines._flows import FlowRun, UpdateDriver, event_log_flush_interval
from deltaflow.pipelines._graph import Graph
from deltaflow.pipelines._storage import CatalogPublisher, Storage
from deltaflow.pipelines.errors import (
    FlowFailedError,
    GraphValidationError,
)
from deltaflow.spark._hadoop_fs import hadoop_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# STOPPED: a continuous update's flow, running until the update was stopped.
FlowStatus = Literal["COMPLETED", "FAILED", "SKIPPED", "STOPPED"]
UpdateState = Literal["COMPLETED", "FAILED", "CANCELED"]


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
    continuous: bool = False  # Lakeflow's `continuous`: updates run until stopped

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
    state: UpdateState  # CANCELED: a continuous update stopped without failures
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
            publisher = CatalogPublisher(spark, storage)
            resolution = resolve(spark, graph, publisher)
            _check_flow_shapes(resolution)
            _realtime.check(resolution, settings, continuous=settings.continuous or None)
            publisher.wait_all()
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
    continuous: bool = False,
    stop: threading.Event | None = None,
) -> UpdateReport:
    """Run one triggered update of the pipeline; the report says how each flow ended
    (``report.raise_for_failure()`` to turn failures into an exception).

    ``refresh``: update only these datasets; ``full_refresh``: these datasets are
    emptied and their flows start over (checkpoints reset); ``full_refresh_all``: all.
    ``on_event``: called with each event-log row as it is recorded (live progress).
    ``continuous``: streams stay up and materialized views refresh every
    ``pipelines.trigger.interval`` until ``stop`` is set (:mod:`._continuous`).
    """
    continuous = continuous or settings.continuous
    if continuous and stop is None:
        raise ValueError("a continuous update runs until `stop` is set: pass a threading.Event")
    if continuous and _connect.is_connect(spark):
        raise _connect.refuse(
            "a continuous update (its streams write through the driver's foreachBatch)",
            None,
            "Run triggered updates (without --continuous) on a schedule",
        )
    storage = Storage.of(
        settings.storage,
        settings.database,
        settings.configuration,
        lambda uri: hadoop_uri(spark, uri),
    )
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
    from deltaflow.spark.catalog._jvm_catalog import create_database_if_missing

    create_database_if_missing(spark, settings.database)
    try:
        with (
            _session_for(spark, settings, settings.database),
            _publishing(spark, storage, graph) as publisher,
        ):
            for name in reset:
                for flow in graph.flows_into(name):
                    storage.reset_checkpoint(flow.name)
            _progress(log, "SETTING_UP_TABLES")
            resolution = resolve(spark, graph, publisher)
            _check_flow_shapes(resolution)
            _realtime.check(resolution, settings, continuous=continuous)
            if reset:
                publisher.wait_all()  # a full refresh overwrites the tables
            _truncate(spark, resolution, storage, reset)
            for resolved in resolution.flows.values():
                _flow_definition(log, resolution, resolved, settings)
            _progress(log, "RUNNING")
            runnable = _runnable(resolution, selected)
            if continuous:
                from deltaflow.pipelines._continuous import Continuous

                assert stop is not None
                publisher.wait_all()
                reports = Continuous(spark, resolution, settings, storage, log, runnable).run(stop)
            else:
                scheduler = _Scheduler(spark, resolution, settings, storage, log, runnable)
                reports = scheduler.run(publisher.wait)
            # Every table exists now (also those no selected flow writes); a creation
            # error is raised, failing the update as when tables were created up front.
            publisher.wait_all()
    except Exception as exc:
        error = typed_error(exc) or exc
        _progress(log, "FAILED", error=str(error))
        log.flush()
        if error is exc:
            raise
        raise error from None
    failed = any(r.status == "FAILED" for r in reports.values())
    state: UpdateState = "FAILED" if failed else ("CANCELED" if continuous else "COMPLETED")
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


@contextlib.contextmanager
def _publishing(spark: SparkSession, storage: Storage, graph: Graph) -> Iterator[CatalogPublisher]:
    """The update's publisher, creating new tables in the background while the flows are
    analysed and start (each flow waits for its own table); private datasets leave the
    catalog when the update ends, however it ends."""
    publisher = CatalogPublisher(spark, storage, graph, background=True)
    try:
        yield publisher
    finally:
        publisher.close()
        publisher.unpublish_private(graph.datasets.values())


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
            # overwriteSchema takes the partitioning from partitionBy (none: unpartitioned).
            .partitionBy(*resolved.dataset.partition_cols)
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


def _flow_definition(
    log: EventLog, resolution: Resolution, resolved: ResolvedFlow, settings: PipelineSettings
) -> None:
    flow = resolved.flow
    target = resolution.datasets.get(flow.target)
    details: dict[str, Any] = {
        "output_dataset": flow.target,
        "input_datasets": list(resolved.inputs),
        "flow_type": type(flow).__name__,
        "output_kind": target.kind if target is not None else "sink",
        "streaming": resolved.streaming,
        "schema_json": resolved.schema_json,
    }
    if isinstance(flow, Flow):
        details["output_mode"] = flow.output_mode
    dataset = target.dataset if target is not None else None
    if _realtime.requested(flow, dataset):
        details["trigger"] = "RealTime"
        details["trigger_interval"] = _realtime.epoch(flow, dataset, settings)
    log.emit(
        "flow_definition",
        f"Flow {flow.name!r} defined" + (" (real-time)" if "trigger" in details else ""),
        details,
        flow=flow.name,
        dataset=flow.target,
    )


# ---- running the flows ----------------------------------------------------------------


def _runnable(resolution: Resolution, selected: set[str] | None) -> list[str]:
    """The flows an update runs, in dependency order: those into the selected datasets
    (all when None); a temporary view's query runs inside the flows that read it."""
    views = {n for n, d in resolution.datasets.items() if d.kind == "temporary_view"}
    return [
        name
        for name in resolution.order
        if resolution.flows[name].flow.target not in views
        and (selected is None or resolution.flows[name].flow.target in selected)
    ]


class _Scheduler(UpdateDriver):
    """Runs the selected flows: each once its upstream flows completed, up to
    ``pipelines.maxConcurrentFlows`` at a time; downstream of a failure is skipped."""

    def run(self, table_ready: Callable[[str], None]) -> dict[str, FlowReport]:
        """``table_ready(dataset)``: returns once the dataset's table exists (raises its
        creation's error); each flow calls it for its target before its first attempt."""
        self._table_ready = table_ready
        reports: dict[str, FlowReport] = {}
        upstream = {
            n: [u for u in self._resolution.upstream(n) if u in self._runnable]
            for n in self._runnable
        }
        for name in self._runnable:
            self._progress(name, "QUEUED")
        workers = max(1, int(self._settings.setting("pipelines.maxConcurrentFlows", "2")))
        flush_every = event_log_flush_interval(self._settings)
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
                # The flows' events are committed from here, off their critical path.
                self._log.flush_every(flush_every)
                done, _ = wait(running, timeout=flush_every, return_when=FIRST_COMPLETED)
                for future in done:
                    reports[running.pop(future)] = future.result()
        return reports

    def _skip(self, name: str, needs: list[str], reports: Mapping[str, FlowReport]) -> FlowReport:
        failed = next(u for u in needs if reports[u].status != "COMPLETED")
        target = self._resolution.flows[name].flow.target
        self._progress(name, "SKIPPED", message=f"upstream flow {failed!r} did not complete")
        return FlowReport(name, target, "SKIPPED", error=f"upstream flow {failed!r} failed")

    def _run_with_retries(self, name: str) -> FlowReport:
        resolved = self._resolution.flows[name]
        policy = self._policy
        attempt = 0
        try:
            if resolved.flow.target in self._resolution.datasets:
                self._table_ready(resolved.flow.target)
        except Exception as exc:
            error = typed_error(exc) or exc
            self._progress(name, "FAILED", attempt=1, error=error)
            return FlowReport(name, resolved.flow.target, "FAILED", 1, error=str(error))
        while True:
            attempt += 1
            self._progress(name, "RUNNING", attempt=attempt)
            try:
                outcome = FlowRun(
                    self._spark,
                    self._resolution,
                    resolved,
                    self._storage,
                    first_attempt=attempt == 1,
                ).run()
            except Exception as exc:
                error = typed_error(exc) or exc
                if policy.gives_up(error, attempt):
                    self._progress(name, "FAILED", attempt=attempt, error=error)
                    return FlowReport(
                        name, resolved.flow.target, "FAILED", attempt, error=str(error)
                    )
                self._progress(name, "RETRYING", attempt=attempt, error=error)
                time.sleep(policy.delay(attempt))
                continue
            self._progress(name, "COMPLETED", attempt=attempt, outcome=outcome)
            return FlowReport(
                name,
                resolved.flow.target,
                "COMPLETED",
                attempt,
                rows_written=outcome.rows,
                expectations=outcome.expectations,
            )
