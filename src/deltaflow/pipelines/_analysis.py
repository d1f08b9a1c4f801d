"""Resolving a graph: what each flow reads, whether it streams, what it produces.

Every flow's query function runs once (Spark analyses the DataFrame it returns; no
job runs). A flow reading a dataset that is not resolved yet is put back and retried
after others, so the order found is a dependency order; when a round makes no
progress, what is left is a cycle or reads something that does not exist, and the
error says which.

Reads are found two ways: ``dlt.read`` / ``read_stream`` calls, and the relations in the
analysed plan (catalog tables by name, temporary views by name), so
``spark.read.table("bronze")`` counts as reading ``bronze``; so does a read by path of a
dataset's table (``spark.read.format("delta").load(<its location>)``). A query that
fails while other flows are still unresolved is put back too (it may read by path a
table they create), and analysed again, once the tables being created exist, before its
error is final. A dataset becomes readable
once resolved: :class:`Publisher` makes it so (a real run creates its Delta table and
registers it in the catalog; a dry run does the same in a scratch database).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from deltaflow.pipelines import _cdc, _cdc_snapshot, _connect, _flow_session
from deltaflow.pipelines._declarations import (
    AnyFlow,
    AutoCdcFlow,
    AutoCdcSnapshotFlow,
    Dataset,
    DatasetKind,
    Flow,
)
from deltaflow.pipelines._expectations import check_constraints
from deltaflow.pipelines._graph import Graph
from deltaflow.pipelines._reads import reading_with
from deltaflow.pipelines.errors import GraphValidationError, UserQueryError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class ResolvedFlow:
    """A flow after analysis: the datasets it reads (declared names) and whether its
    query is a stream. ``df`` is the DataFrame its function returned (for query flows)."""

    flow: AnyFlow
    inputs: tuple[str, ...]
    streaming: bool
    schema_json: str
    df: Any = None


@dataclass(frozen=True)
class ResolvedDataset:
    """A dataset after analysis: its kind decided (``dlt.table`` -> streaming table or
    materialized view) and its schema (Spark's JSON)."""

    dataset: Dataset
    kind: DatasetKind
    schema_json: str


@dataclass(frozen=True)
class Resolution:
    graph: Graph
    datasets: Mapping[str, ResolvedDataset]
    flows: Mapping[str, ResolvedFlow]
    order: tuple[str, ...]  # flow names, each after every flow writing what it reads

    def upstream(self, flow_name: str) -> tuple[str, ...]:
        """The flows that must finish before ``flow_name`` runs."""
        inputs = {i.lower() for i in self.flows[flow_name].inputs}
        return tuple(name for name, f in self.flows.items() if f.flow.target.lower() in inputs)


class Publisher(Protocol):
    """Makes a resolved dataset readable by name for the flows that read it. A table's
    creation may still be running when :meth:`publish` returns: :meth:`wait` for it
    before reading the table."""

    def publish(self, resolved: ResolvedDataset, views: Mapping[str, DataFrame]) -> None: ...

    def created_in_background(self, name: str) -> bool: ...

    def wait(self, name: str) -> None: ...

    def settle(self) -> bool:
        """Wait for every creation running in the background (their errors are left for
        :meth:`wait`); True when there were any."""
        ...

    def locations(self, datasets: Iterable[Dataset]) -> Mapping[str, str]:
        """Normalized table location -> dataset name, for reads by path."""
        ...


class _NotResolvedYet(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _RecordingReader:
    """``dlt.read`` during analysis: records the name; a resolved dataset reads as
    itself (a table or temporary view by name), an unresolved one defers the flow."""

    def __init__(
        self, spark: SparkSession, graph: Graph, published: set[str], publisher: Publisher
    ) -> None:
        self._spark = spark
        self._graph = graph
        self._published = published
        self._publisher = publisher
        self.reads: list[str] = []
        self.streamed = False

    def read(self, name: str, *, streaming: bool) -> DataFrame:
        dataset = self._graph.dataset(name)
        if dataset is not None:
            self.reads.append(dataset.name)
            if dataset.name.lower() not in self._published:
                raise _NotResolvedYet(dataset.name)
            try:
                self._publisher.wait(dataset.name)
            except Exception as exc:
                raise _CreationFailed(exc) from exc
        self.streamed = self.streamed or streaming
        reader = self._spark.readStream if streaming else self._spark.read
        return reader.table(name)


def resolve(spark: SparkSession, graph: Graph, publisher: Publisher) -> Resolution:
    """Analyse every flow of ``graph`` in a dependency order, publishing each dataset
    once all flows into it are resolved; :class:`GraphValidationError` on a cycle,
    a missing input or conflicting schemas."""
    pending: list[AnyFlow] = list(graph.flows.values())
    published: set[str] = set()
    flows: dict[str, ResolvedFlow] = {}
    datasets: dict[str, ResolvedDataset] = {}
    views: dict[str, DataFrame] = {}
    waiting: dict[str, str] = {}  # flow -> the dataset it waits on

    def publish_ready() -> None:
        for dataset in graph.datasets.values():
            key = dataset.name.lower()
            if key in published:
                continue
            into = graph.flows_into(dataset.name)
            if not all(f.name in flows for f in into):
                continue
            resolved = _resolve_dataset(dataset, [flows[f.name] for f in into])
            datasets[dataset.name] = resolved
            if dataset.kind == "temporary_view":
                views[dataset.name] = flows[into[0].name].df
            publisher.publish(resolved, views)
            published.add(key)

    locations = publisher.locations(graph.datasets.values())
    publish_ready()  # streaming tables with no flows yet, declared schemas
    while pending:
        progress = False
        failed: list[UserQueryError] = []
        for flow in list(pending):
            try:
                resolved = _analyse(spark, graph, flow, published, publisher, locations)
            except _NotResolvedYet as wait:
                waiting[flow.name] = wait.name
                continue
            except UserQueryError as error:
                # It may read by path a table that a flow still pending creates: again
                # after them; its error when no other flow resolves.
                if len(pending) == 1:
                    raise
                failed.append(error)
                continue
            flows[flow.name] = resolved
            pending.remove(flow)
            waiting.pop(flow.name, None)
            progress = True
            publish_ready()
        if not progress:
            if failed:
                raise failed[0]
            raise _cycle(graph, [f.name for f in pending], waiting)
    return Resolution(graph, datasets, flows, _dependency_order(graph, flows))


def _analyse(
    spark: SparkSession,
    graph: Graph,
    flow: AnyFlow,
    published: set[str],
    publisher: Publisher,
    locations: Mapping[str, str],
) -> ResolvedFlow:
    _flow_session.check_confs(
        spark, flow.name, _flow_session.flow_confs(flow, graph.dataset(flow.target))
    )
    _wait_for_named_tables(graph, flow, publisher)
    waited: set[str] = set()
    settled = False
    while True:
        try:
            return _analysed(spark, graph, flow, published, publisher, locations, waited)
        except _CreationFailed as failed:
            raise failed.error from None
        except UserQueryError:
            # A read by path (not seen by the reader, not waited for) of a table still
            # being created fails: once every creation under way ended, once more.
            if settled or not publisher.settle():
                raise
            settled = True
        except _BeingCreated as created:
            # The query read a dataset's table by name while it may still have been
            # being created (the publisher creates tables in the background): once it
            # exists, again. Missing after that: the read's own error.
            if created.name in waited and created.error is not None:
                raise created.error from None
            waited.add(created.name)
            publisher.wait(created.name)


def _wait_for_named_tables(graph: Graph, flow: AnyFlow, publisher: Publisher) -> None:
    """Before a query function runs: wait for the tables being created in the background
    whose dataset names appear in its code's strings (``spark.read.table("silver")``,
    ``spark.sql("... FROM silver")``). Only a hint, to save the read that would fail
    first and the analysis again after (a failed analysis costs about as much as the
    creation); a wrong guess costs a wait, a missed read the retry. A creation that failed
    is reported where the table is read, not here."""
    if not isinstance(flow, Flow):
        return  # its source is read through the reader, which waits
    for name in _words_in_code(flow.func):
        dataset = graph.dataset(name)
        if dataset is not None and publisher.created_in_background(dataset.name):
            with contextlib.suppress(Exception):
                publisher.wait(dataset.name)


def _words_in_code(func: Callable[..., Any]) -> set[str]:
    """Identifier-like words of the string constants in ``func``'s code and the code
    nested in it (lambdas, inner functions, comprehensions), and of the strings it closes
    over (a SQL file's query)."""
    import re
    import types

    code = getattr(func, "__code__", None)
    stack = [code] if isinstance(code, types.CodeType) else []
    texts = [
        cell.cell_contents
        for cell in getattr(func, "__closure__", None) or ()
        if isinstance(getattr(cell, "cell_contents", None), str)
    ]
    while stack:
        for const in stack.pop().co_consts:
            if isinstance(const, str):
                texts.append(const)
            elif isinstance(const, types.CodeType):
                stack.append(const)
    return {word for text in texts for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)}


class _BeingCreated(Exception):
    """A read of dataset ``name``'s table failed while its creation may have been running;
    ``error``: what to raise when it is still missing once created (None: a read by path,
    which reads an empty stream rather than failing)."""

    def __init__(self, name: str, error: GraphValidationError | None) -> None:
        super().__init__(name)
        self.name = name
        self.error = error


class _CreationFailed(Exception):
    """A dataset's table creation failed while a query read it: raised as its own error,
    not as the query function's."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _analysed(
    spark: SparkSession,
    graph: Graph,
    flow: AnyFlow,
    published: set[str],
    publisher: Publisher,
    locations: Mapping[str, str],
    waited: set[str],
) -> ResolvedFlow:
    if _connect.is_connect(spark):
        _connect.refuse_flow(graph, flow)
    reader = _RecordingReader(spark, graph, published, publisher)
    if isinstance(flow, AutoCdcFlow):
        df = _cdc.target_frame(reader.read(flow.source, streaming=True), flow)
    elif isinstance(flow, AutoCdcSnapshotFlow):
        df = _snapshot_source(reader, flow)
    else:
        df = _run_query(spark, graph, flow, reader, published, publisher)
        target = graph.dataset(flow.target)
        rules = (target.expectations if target is not None else ()) + flow.expectations
        check_constraints(df, rules, flow.name)
    by_name, by_path = _plan_reads(graph, df, locations)
    for name in by_path:
        # Streams by path of a table not created yet read as empty, without columns.
        if name.lower() not in published:
            raise _NotResolvedYet(name)
        if name not in waited and publisher.created_in_background(name):
            raise _BeingCreated(name, None)
    inputs = dict.fromkeys(reader.reads + by_name + by_path)
    return ResolvedFlow(
        flow=flow,
        inputs=tuple(inputs),
        streaming=bool(df.isStreaming) or reader.streamed,
        schema_json=df.schema.json(),
        df=df,
    )


def _snapshot_source(reader: _RecordingReader, flow: AutoCdcSnapshotFlow) -> DataFrame:
    snapshot = _call_user(
        flow.name,
        lambda: _cdc_snapshot.first_snapshot(flow, lambda n: reader.read(n, streaming=False)),
    )
    return _cdc_snapshot.target_frame(snapshot, flow)


def _run_query(
    spark: SparkSession,
    graph: Graph,
    flow: Flow,
    reader: _RecordingReader,
    published: set[str],
    publisher: Publisher,
) -> DataFrame:
    from pyspark.errors import AnalysisException

    with reading_with(reader):
        try:
            df = _call_user(flow.name, lambda: _analysed_now(flow.func()))
        except UserQueryError as error:
            cause = error.__cause__
            if isinstance(cause, AnalysisException):
                name = _missing_relation(cause)
                dataset = graph.dataset(name) if name else None
                if dataset is not None and dataset.name.lower() not in published:
                    raise _NotResolvedYet(dataset.name) from None
                if name is not None:
                    missing = GraphValidationError(
                        f"flow {flow.name!r} ({flow.location}) reads {name!r}, which is"
                        " neither a dataset of this pipeline nor an existing table. Declare"
                        " it, or fix the name.",
                        flow=flow.name,
                        problem="missing_input",
                    )
                    if dataset is not None and publisher.created_in_background(dataset.name):
                        raise _BeingCreated(dataset.name, missing) from None
                    raise missing from cause
            raise
    if not _is_dataframe(df):
        raise GraphValidationError(
            f"flow {flow.name!r} ({flow.location}) returned {type(df).__name__}, not a"
            " DataFrame. A dataset's function returns the query (spark.read... /"
            " spark.readStream...), it does not write.",
            flow=flow.name,
            problem="not_a_dataframe",
        )
    return df


def _analysed_now(df: Any) -> Any:
    """``df``, analysed: a classic DataFrame is; a Spark Connect one is analysed when its
    schema is first asked for, so a missing input raises here, as in a classic session."""
    if _connect.is_connect(df) and _is_dataframe(df):
        df.schema  # noqa: B018 - the server analyses the query
    return df


def _call_user(flow_name: str, func: Callable[[], Any]) -> Any:
    try:
        with _quiet_query_errors():
            return func()
    except (_NotResolvedYet, _CreationFailed, GraphValidationError):
        raise
    except Exception as exc:
        raise UserQueryError(
            f"the query function of flow {flow_name!r} raised {type(exc).__name__}: {exc}",
            flow=flow_name,
        ) from exc


@contextlib.contextmanager
def _quiet_query_errors() -> Iterator[None]:
    """pyspark logs every analysis error of a SQL or DataFrame query at ERROR, as JSON on
    stderr, before raising it. Analysing a dataset whose input is still being created is
    expected to fail and is retried; a real failure is raised and reported with its
    message either way, so the log line says nothing the update does not."""
    from pyspark.logger import PySparkLogger

    loggers = [
        PySparkLogger.getLogger(name)
        for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
    ]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before, strict=True):
            logger.disabled = disabled


def _is_dataframe(value: Any) -> bool:
    return hasattr(value, "isStreaming") and hasattr(value, "schema")


def _missing_relation(error: Exception) -> str | None:
    condition = getattr(error, "getCondition", lambda: None)()
    if condition != "TABLE_OR_VIEW_NOT_FOUND":
        return None
    raw = error.getMessageParameters().get("relationName", "")  # type: ignore[attr-defined]
    parts = [p.strip("`") for p in raw.split("`.`")]
    return parts[-1] if parts and parts[-1] else None


def _plan_reads(
    graph: Graph, df: DataFrame, locations: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """Datasets of ``graph`` that ``df``'s analysed plan reads: catalog tables and
    temporary views by name (a view not looked into: the view is the input), and tables
    by their location (batch or stream)."""
    if _connect.is_connect(df):
        return _connect.plan_reads(graph, df, locations)
    by_name: list[str] = []
    by_path: list[str] = []
    stack = [df._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        name = _relation_name(node)
        dataset = graph.dataset(name) if name else None
        if dataset is not None:
            by_name.append(dataset.name)
            if node.getClass().getSimpleName() == "View":
                continue
        elif (located := _path_read(node, locations)) is not None:
            by_path.append(located)
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return by_name, by_path


def _path_read(node: Any, locations: Mapping[str, str]) -> str | None:
    """The dataset a read by path reads, if it is one: deltaflow's tables name themselves
    ``delta.`<uri>``` when not read through the catalog; a stream's source keeps its
    ``path`` option."""
    from deltaflow.table import _uri

    kind = node.getClass().getSimpleName()
    try:
        if kind in ("DataSourceV2Relation", "StreamingRelationV2"):
            name = str(node.table().name())
            if not (name.startswith("delta.`") and name.endswith("`")):
                return None
            path = name[len("delta.`") : -1]
        elif kind == "StreamingRelation":
            option = node.dataSource().options().get("path")
            if not option.isDefined():
                return None
            path = str(option.get())
        else:
            return None
        return locations.get(_uri.normalize_uri(path))
    except Exception:  # a relation of another connector, a path that is no URI
        return None


def _relation_name(node: Any) -> str | None:
    kind = node.getClass().getSimpleName()
    if kind == "View":
        return str(node.desc().identifier().table())
    if kind in ("DataSourceV2Relation", "StreamingRelationV2"):
        ident = node.identifier()
        return str(ident.get().name()) if ident.isDefined() else None
    if kind == "LogicalRelation":
        table = node.catalogTable()
        return str(table.get().identifier().table()) if table.isDefined() else None
    return None


def _resolve_dataset(dataset: Dataset, into: list[ResolvedFlow]) -> ResolvedDataset:
    kind = dataset.kind
    if kind == "table":
        kind = "streaming_table" if into and into[0].streaming else "materialized_view"
    if dataset.schema is not None:
        schema_json = _declared_schema_json(dataset)
    elif into:
        schema_json = _union_schema(dataset, into)
    else:
        raise GraphValidationError(
            f"streaming table {dataset.name!r} ({dataset.location}) has no flow and no"
            " schema, so its columns are unknown. Give it `schema=`, or a flow"
            " (append_flow / create_auto_cdc_flow).",
            flow=dataset.name,
            problem="no_schema",
        )
    return ResolvedDataset(dataset, kind, schema_json)


def _declared_schema_json(dataset: Dataset) -> str:
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = dataset.schema
    parsed = schema if isinstance(schema, StructType) else _parse_datatype_string(str(schema))
    return str(parsed.json())


def _union_schema(dataset: Dataset, into: list[ResolvedFlow]) -> str:
    """Flows into one table must agree on the type of every column they share; the
    table has every column any of them writes (in first-seen order)."""
    import json

    fields: dict[str, dict[str, Any]] = {}
    owners: dict[str, str] = {}
    for resolved in into:
        for field in json.loads(resolved.schema_json)["fields"]:
            key = field["name"].lower()
            seen = fields.get(key)
            if seen is None:
                fields[key] = field
                owners[key] = resolved.flow.name
            elif seen["type"] != field["type"]:
                raise GraphValidationError(
                    f"flows {owners[key]!r} and {resolved.flow.name!r} both write column"
                    f" {field['name']!r} of {dataset.name!r}, as {_type(seen)} and"
                    f" {_type(field)}. Cast one of them so the types agree.",
                    flow=resolved.flow.name,
                    problem="schema_conflict",
                )
    if not fields:
        return json.dumps({"type": "struct", "fields": []})
    return json.dumps({"type": "struct", "fields": list(fields.values())})


def _type(field: Mapping[str, Any]) -> str:
    kind = field["type"]
    return kind if isinstance(kind, str) else str(kind.get("type"))


def _dependency_order(graph: Graph, flows: Mapping[str, ResolvedFlow]) -> tuple[str, ...]:
    """Flow names, each after every flow writing a dataset it reads (declaration order
    among independent flows). Tables left by an earlier run resolve without waiting, so
    the order comes from the reads, not from the order analysis happened in."""
    writers: dict[str, list[str]] = {}
    for name in graph.flows:
        writers.setdefault(graph.flows[name].target.lower(), []).append(name)
    needs = {
        name: {w for i in f.inputs for w in writers.get(i.lower(), [])} for name, f in flows.items()
    }
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(needs):
        ready = [n for n in graph.flows if n not in done and needs[n] <= done]
        if not ready:
            left = [n for n in graph.flows if n not in done]
            waiting = {
                n: next(
                    (i for i in flows[n].inputs if not set(writers.get(i.lower(), [])) <= done),
                    "",
                )
                for n in left
            }
            raise _cycle(graph, left, waiting)
        order.extend(ready)
        done.update(ready)
    return tuple(order)


def _cycle(graph: Graph, left: list[str], waiting: Mapping[str, str]) -> GraphValidationError:
    """The flows in ``left`` wait on one another (``waiting``: flow -> dataset it reads
    that is not ready): the error names the cycle."""
    writer: dict[str, str] = {}
    for flow in graph.flows.values():
        writer.setdefault(flow.target.lower(), flow.name)
    path = [left[0]]
    while True:
        target = waiting.get(path[-1])
        nxt = writer.get(target.lower()) if target else None
        if nxt is None:
            break
        if nxt in path:
            path = [*path[path.index(nxt) :], nxt]
            break
        path.append(nxt)
    return GraphValidationError(
        "the pipeline's flows read each other in a cycle: "
        + " -> ".join(path)
        + ". A dataset cannot depend on itself; break the cycle (read a source table"
        " instead of a downstream dataset).",
        flow=path[0],
        problem="cycle",
    )
