"""Collecting declarations into a graph: the builder the decorators talk to, and the
frozen :class:`Graph` it produces.

Declarations register with the builder active in the current context (a ``ContextVar``,
so threads and the runner's library loading do not mix graphs). The rules that need
only the declarations are checked here: duplicate names, flows into undeclared or
unsuitable datasets. Those that need the queries (missing inputs, cycles, schemas) are
the runner's dry run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from deltaflow.pipelines._declarations import (
    AnyFlow,
    AutoCdcFlow,
    AutoCdcSnapshotFlow,
    Dataset,
    Expectation,
    Flow,
    Sink,
)
from deltaflow.pipelines.errors import DefinitionError, NoActivePipelineError

_T = TypeVar("_T")


def _key(name: str) -> str:
    # Spark identifiers are case-insensitive; so are dataset and flow names.
    return name.lower()


@dataclass(frozen=True)
class Graph:
    """Every dataset, flow and sink of one pipeline, by name (as declared)."""

    datasets: Mapping[str, Dataset]
    flows: Mapping[str, AnyFlow]
    sinks: Mapping[str, Sink]

    def dataset(self, name: str) -> Dataset | None:
        return _find(self.datasets, name)

    def sink(self, name: str) -> Sink | None:
        return _find(self.sinks, name)

    def flows_into(self, target: str) -> tuple[AnyFlow, ...]:
        """The flows writing ``target``, in declaration order."""
        return tuple(f for f in self.flows.values() if _key(f.target) == _key(target))


def _find(items: Mapping[str, _T], name: str) -> _T | None:
    for key, value in items.items():
        if _key(key) == _key(name):
            return value
    return None


class GraphBuilder:
    """The mutable side of a pipeline definition: the decorators add to it while a
    pipeline's source files run; :meth:`graph` checks and freezes the result."""

    def __init__(self) -> None:
        self._datasets: dict[str, Dataset] = {}
        self._flows: dict[str, AnyFlow] = {}
        self._sinks: dict[str, Sink] = {}

    def add_dataset(self, dataset: Dataset) -> None:
        self._check_new_output(dataset.name, str(dataset.location))
        self._datasets[_key(dataset.name)] = dataset

    def add_sink(self, sink: Sink) -> None:
        self._check_new_output(sink.name, str(sink.location))
        self._sinks[_key(sink.name)] = sink

    def add_flow(self, flow: AnyFlow) -> None:
        existing = self._flows.get(_key(flow.name))
        if existing is not None:
            raise DefinitionError(
                f"flow {flow.name!r} at {flow.location} is declared twice (first at"
                f" {existing.location}). Give one of them another name (append_flow's"
                " `name=`).",
                dataset=flow.name,
                location=str(flow.location),
            )
        self._flows[_key(flow.name)] = flow

    def add_expectations(self, name: str, expectations: tuple[Expectation, ...]) -> None:
        """Expectations declared above a dataset's decorator, after it registered."""
        dataset = self._datasets.get(_key(name))
        if dataset is not None:
            merged = expectations + dataset.expectations
            self._datasets[_key(name)] = dataclasses.replace(dataset, expectations=merged)
            return
        flow = self._flows.get(_key(name))
        if isinstance(flow, Flow):
            merged = expectations + flow.expectations
            self._flows[_key(name)] = dataclasses.replace(flow, expectations=merged)

    def graph(self) -> Graph:
        """The declarations as a frozen :class:`Graph`, once every flow's target is a
        dataset or sink that can take it."""
        for flow in self._flows.values():
            self._check_target(flow)
        return Graph(
            datasets=MappingProxyType({d.name: d for d in self._datasets.values()}),
            flows=MappingProxyType({f.name: f for f in self._flows.values()}),
            sinks=MappingProxyType({s.name: s for s in self._sinks.values()}),
        )

    def _check_new_output(self, name: str, location: str) -> None:
        if not name or not isinstance(name, str):
            raise DefinitionError(
                f"a dataset at {location} has no name: pass `name=` or decorate a named function.",
                dataset=None,
                location=location,
            )
        first = self._datasets.get(_key(name)) or self._sinks.get(_key(name))
        if first is not None:
            raise DefinitionError(
                f"dataset {name!r} at {location} is declared twice (first at"
                f" {first.location}). Each table, view and sink needs its own name; to feed"
                " one streaming table from several queries use append_flow.",
                dataset=name,
                location=location,
            )

    def _check_target(self, flow: AnyFlow) -> None:
        where = str(flow.location)
        if _key(flow.target) in self._sinks:
            if not isinstance(flow, Flow):
                raise DefinitionError(
                    f"AUTO CDC flow {flow.name!r} at {where} targets sink {flow.target!r}:"
                    " AUTO CDC writes only streaming tables.",
                    dataset=flow.name,
                    location=where,
                )
            return
        dataset = self._datasets.get(_key(flow.target))
        if isinstance(flow, Flow) and flow.output_mode == "update":
            # Lakeflow's rule: update flows write sinks only.
            raise DefinitionError(
                f"update_flow {flow.name!r} at {where} writes to {flow.target!r}, which is"
                " not a sink: update flows write sinks only (create_sink). To stream into"
                " a table, use append_flow or the table's own query.",
                dataset=flow.name,
                location=where,
            )
        if dataset is None:
            raise DefinitionError(
                f"flow {flow.name!r} at {where} writes to {flow.target!r}, which this"
                " pipeline does not declare. Declare it first, e.g."
                f" create_streaming_table({flow.target!r}).",
                dataset=flow.name,
                location=where,
            )
        own = _key(flow.name) == _key(dataset.name) and isinstance(flow, Flow)
        if dataset.kind in ("materialized_view", "temporary_view") and not own:
            raise DefinitionError(
                f"flow {flow.name!r} at {where} writes to {dataset.kind.replace('_', ' ')}"
                f" {dataset.name!r}, whose only flow is its own query. Append flows and AUTO"
                " CDC need a streaming table (create_streaming_table).",
                dataset=flow.name,
                location=where,
            )
        if isinstance(flow, AutoCdcFlow | AutoCdcSnapshotFlow):
            others = [
                f
                for f in self._flows.values()
                if _key(f.target) == _key(flow.target) and not isinstance(f, type(flow))
            ]
            if others:
                raise DefinitionError(
                    f"streaming table {dataset.name!r} is the target of AUTO CDC flow"
                    f" {flow.name!r} ({where}) and of flow {others[0].name!r}"
                    f" ({others[0].location}). An AUTO CDC target takes only AUTO CDC flows"
                    " of one kind; write the other query into its own table.",
                    dataset=flow.name,
                    location=where,
                )


_ACTIVE: ContextVar[GraphBuilder | None] = ContextVar("deltaflow_pipeline_graph", default=None)


@contextmanager
def collect() -> Iterator[GraphBuilder]:
    """Collect the datasets and flows declared inside the block.

    >>> with collect() as declared:
    ...     import my_pipeline  # its decorators register here
    >>> graph = declared.graph()
    """
    builder = GraphBuilder()
    token = _ACTIVE.set(builder)
    try:
        yield builder
    finally:
        _ACTIVE.reset(token)


def active_builder(declaration: str) -> GraphBuilder:
    """The builder of the definition under way; ``declaration`` names what asks (for
    the error when there is none)."""
    builder = _ACTIVE.get()
    if builder is None:
        raise NoActivePipelineError(
            f"{declaration} was declared outside a pipeline definition. Pipeline source"
            " files are loaded by `deltaflow pipelines run` / `dry-run`; in tests, wrap"
            " them in `with deltaflow.pipelines.collect() as declared:`.",
            declaration=declaration,
        )
    return builder
