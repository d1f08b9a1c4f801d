"""``dlt.read`` / ``dlt.read_stream``: reading another dataset of the pipeline.

Only meaningful while the runner evaluates a flow's query: it installs the reader
that resolves a dataset name to its table (and records the dependency). Outside a
run there is nothing to read, and the functions say so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from deltaflow.pipelines.errors import NoActivePipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class DatasetReader(Protocol):
    def read(self, name: str, *, streaming: bool) -> DataFrame: ...


_READER: ContextVar[DatasetReader | None] = ContextVar("deltaflow_pipeline_reader", default=None)


@contextmanager
def reading_with(reader: DatasetReader) -> Iterator[None]:
    """Resolve ``read`` / ``read_stream`` with ``reader`` inside the block."""
    token = _READER.set(reader)
    try:
        yield
    finally:
        _READER.reset(token)


def _reader(call: str) -> DatasetReader:
    reader = _READER.get()
    if reader is None:
        raise NoActivePipelineError(
            f"{call} reads a dataset of a running pipeline, and no pipeline is running. Call"
            " it inside a dataset's query function, or read the table directly with"
            " spark.read.table(name).",
            declaration=call,
        )
    return reader


def read(name: str) -> DataFrame:
    """The dataset ``name`` of this pipeline as a batch DataFrame."""
    return _reader(f"read({name!r})").read(name, streaming=False)


def read_stream(name: str) -> DataFrame:
    """The dataset ``name`` of this pipeline as a streaming DataFrame."""
    return _reader(f"read_stream({name!r})").read(name, streaming=True)
