"""What differs between the pyspark 4.x minors deltaflow supports, in one place.

deltaflow supports pyspark 4.0 to 4.x (``SUPPORTED_PYSPARK``); the Python data source
API grew over those minors. Modules import these names from here, never from pyspark
directly, so each difference is handled once:

- ``pyspark.sql.datasource``'s filter classes (``Filter``, ``EqualTo``, ...) arrived in
  4.1, with filter pushdown into Python sources. On 4.0, Spark never calls
  ``pushFilters``; the stand-ins below only let the modules that name them import.
- ``DataSourceStreamArrowWriter`` arrived in 4.1. pyspark 4.0's write worker hands a
  streaming writer Arrow batches when it is also a ``DataSourceArrowWriter``, so the
  stand-in is both.
- ``pyspark.sql.pandas.types``: ``to_arrow_schema`` / ``to_arrow_type`` take
  ``timezone="UTC"`` since 4.2 (``timestamp_utc=True`` before), and ``from_arrow_*``
  default to ``prefer_timestamp_ntz=True`` since 4.2 (False before). The wrappers here
  give every version 4.2's answers: timestamps as UTC, zone-less Arrow timestamps as
  ``TIMESTAMP_NTZ``.
- Admission control for Python stream readers (``pyspark.sql.streaming.datasource``'s
  ``ReadLimit`` classes, ``latestOffset(start, limit)``, ``getDefaultReadLimit``) arrived
  in 4.2. Before it, Spark calls ``latestOffset()`` without arguments:
  :data:`STREAM_ADMISSION_CONTROL` tells the readers which call to expect. The stand-in
  ``ReadLimit`` classes let the connector's bridge (which calls the readers itself, on
  every version) describe its limits the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyspark
from pyspark.sql import datasource as _datasource

# The pyspark (major, minor) installed.
PYSPARK_MINOR: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(part) for part in pyspark.__version__.split(".")[:2]
)

# pyspark >= 4.2: Spark passes a stream reader's start offset and read limit to
# latestOffset, and asks for its default limit.
STREAM_ADMISSION_CONTROL = PYSPARK_MINOR >= (4, 2)


class _StandInFilter:
    """A pushdown filter class pyspark 4.0 does not have; Spark 4.0 never makes one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - never built
        raise TypeError(f"pyspark {pyspark.__version__} has no filter pushdown")


Filter: Any = getattr(_datasource, "Filter", None) or type("Filter", (_StandInFilter,), {})


def _filter(name: str) -> Any:
    return getattr(_datasource, name, None) or type(name, (Filter,), {})


EqualNullSafe: Any = _filter("EqualNullSafe")
EqualTo: Any = _filter("EqualTo")
GreaterThan: Any = _filter("GreaterThan")
GreaterThanOrEqual: Any = _filter("GreaterThanOrEqual")
In: Any = _filter("In")
IsNotNull: Any = _filter("IsNotNull")
IsNull: Any = _filter("IsNull")
LessThan: Any = _filter("LessThan")
LessThanOrEqual: Any = _filter("LessThanOrEqual")
Not: Any = _filter("Not")
StringStartsWith: Any = _filter("StringStartsWith")

DataSourceStreamArrowWriter: Any = getattr(_datasource, "DataSourceStreamArrowWriter", None)
if DataSourceStreamArrowWriter is None:

    class DataSourceStreamArrowWriter(  # type: ignore[no-redef]
        _datasource.DataSourceStreamWriter, _datasource.DataSourceArrowWriter
    ):
        """pyspark 4.0: a streaming writer that receives Arrow record batches."""


try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxFiles,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pyspark < 4.2

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """A reader with ``prepareForTriggerAvailableNow`` (Spark < 4.2 never calls it)."""

    class ReadLimit:  # type: ignore[no-redef]
        """How much a stream reader may admit in one batch (pyspark 4.2's, for < 4.2)."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Everything available."""

    @dataclass
    class ReadMaxFiles(ReadLimit):  # type: ignore[no-redef]
        """At most ``max_files`` files."""

        max_files: int


def to_arrow_schema(schema: Any) -> Any:
    """A Spark ``StructType`` as a ``pyarrow.Schema``, timestamps in UTC."""
    from pyspark.sql.pandas import types  # imports pandas: only when needed

    if "timezone" in inspect.signature(types.to_arrow_schema).parameters:
        return types.to_arrow_schema(schema, timezone="UTC")
    return types.to_arrow_schema(schema, timestamp_utc=True)


def to_arrow_type(data_type: Any) -> Any:
    """A Spark ``DataType`` as a ``pyarrow.DataType``, timestamps in UTC."""
    from pyspark.sql.pandas import types

    if "timezone" in inspect.signature(types.to_arrow_type).parameters:
        return types.to_arrow_type(data_type, timezone="UTC")
    return types.to_arrow_type(data_type, timestamp_utc=True)


def from_arrow_type(arrow_type: Any) -> Any:
    """A ``pyarrow.DataType`` as a Spark ``DataType`` (zone-less timestamps: NTZ)."""
    from pyspark.sql.pandas import types

    return types.from_arrow_type(arrow_type, prefer_timestamp_ntz=True)


def from_arrow_schema(arrow_schema: Any) -> Any:
    """A ``pyarrow.Schema`` as a Spark ``StructType`` (zone-less timestamps: NTZ)."""
    from pyspark.sql.pandas import types

    return types.from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)


_LatestOffset = TypeVar("_LatestOffset", bound=Callable[..., dict[str, Any]])
_PREVIOUS_END = "_deltaflow_previous_end"
# Walks to the newest offset on a reader's first legacy call (each admits everything).
_LEGACY_RESOLVE_STEPS = 8


def legacy_latest_offset(method: _LatestOffset) -> _LatestOffset:
    """``latestOffset(start, limit)`` that also answers Spark < 4.2's ``latestOffset()``.

    Spark < 4.2 gives a Python stream reader neither the batch's start nor a read limit.
    In a running query the next batch starts where the previous ``latestOffset`` ended,
    which the reader remembers, and admits as its default read limit allows
    (``maxFilesPerTrigger``). On its first call (a new query, or a restart from a
    checkpoint whose offset the reader is not told) it answers the newest offset,
    walking from ``initialOffset()`` admitting everything: Spark then plans the batch
    from the checkpoint's offset, or the initial one, to there. On Spark >= 4.2 the call
    passes through unchanged.
    """

    @functools.wraps(method)
    def latest(self: Any, start: Any = None, limit: Any = None) -> dict[str, Any]:
        if start is not None:
            return method(self, start, limit)
        previous = getattr(self, _PREVIOUS_END, None)
        if previous is not None:
            end = method(self, previous, self.getDefaultReadLimit())
        else:
            end = self.initialOffset()
            for _ in range(_LEGACY_RESOLVE_STEPS):
                step = method(self, end, ReadAllAvailable())
                if step == end:
                    break
                end = step
        setattr(self, _PREVIOUS_END, end)
        return end

    return latest  # type: ignore[return-value]


__all__ = [
    "PYSPARK_MINOR",
    "STREAM_ADMISSION_CONTROL",
    "DataSourceStreamArrowWriter",
    "EqualNullSafe",
    "EqualTo",
    "Filter",
    "GreaterThan",
    "GreaterThanOrEqual",
    "In",
    "IsNotNull",
    "IsNull",
    "LessThan",
    "LessThanOrEqual",
    "Not",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxFiles",
    "StringStartsWith",
    "SupportsTriggerAvailableNow",
    "from_arrow_schema",
    "from_arrow_type",
    "legacy_latest_offset",
    "to_arrow_schema",
    "to_arrow_type",
]
