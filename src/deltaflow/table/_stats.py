"""Per-file statistics in the Delta log's ``stats`` JSON.

Every file we add carries numRecords, minValues, maxValues and nullCount for the
first ``delta.dataSkippingNumIndexedCols`` (default 32) leaf columns, so that
any engine reading the table can skip files. Files are written batch by batch;
:class:`StatsAccumulator` keeps raw bounds per leaf and renders JSON at the end.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

DEFAULT_NUM_INDEXED_COLS = 32
# delta-spark truncates string statistics to this many characters.
STRING_PREFIX_LENGTH = 32
_MS = dt.timedelta(milliseconds=1)
_MAX_CHAR = "\U0010ffff"

Path = tuple[str, ...]


def num_indexed_cols(configuration: dict[str, str | None]) -> int:
    raw = configuration.get("delta.dataSkippingNumIndexedCols")
    return DEFAULT_NUM_INDEXED_COLS if raw is None else int(raw)


class _Leaf:
    __slots__ = ("high", "low", "nulls", "type")

    def __init__(self, t: pa.DataType) -> None:
        self.type = t
        self.nulls = 0
        self.low: Any = None
        self.high: Any = None


class StatsAccumulator:
    """Statistics of one file, fed with every batch written to it."""

    def __init__(self, num_indexed: int = DEFAULT_NUM_INDEXED_COLS) -> None:
        self.num_indexed = num_indexed if num_indexed >= 0 else 1 << 30
        self.num_records = 0
        self._leaves: dict[Path, _Leaf] = {}
        self._order: list[Path] = []

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.num_records += batch.num_rows
        budget = [self.num_indexed]
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            self._visit((name,), column, budget)

    def _visit(self, path: Path, column: Any, budget: list[int]) -> None:
        if budget[0] <= 0:
            return
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_struct(column.type):
            children = column.flatten()
            for index, child in enumerate(children):
                self._visit((*path, column.type.field(index).name), child, budget)
            return
        budget[0] -= 1
        leaf = self._leaves.get(path)
        if leaf is None:
            leaf = self._leaves[path] = _Leaf(column.type)
            self._order.append(path)
        leaf.nulls += column.null_count
        if not _has_min_max(column.type) or column.null_count == len(column):
            return
        result = pc.min_max(column)
        low, high = result["min"].as_py(), result["max"].as_py()
        if low is not None:
            leaf.low = low if leaf.low is None else min(leaf.low, low)
        if high is not None:
            leaf.high = high if leaf.high is None else max(leaf.high, high)

    def to_json(self) -> str:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for path in self._order:
            leaf = self._leaves[path]
            _put(nulls, path, leaf.nulls)
            low = _json_value(leaf.low, leaf.type, upper=False)
            high = _json_value(leaf.high, leaf.type, upper=True)
            # Bounds are independent: a long string may keep its lower bound only.
            if low is not None:
                _put(mins, path, low)
            if high is not None:
                _put(maxs, path, high)
        stats = {
            "numRecords": self.num_records,
            "minValues": mins,
            "maxValues": maxs,
            "nullCount": nulls,
        }
        return json.dumps(stats, separators=(",", ":"), allow_nan=False)


def file_stats(
    table: pa.Table | pa.RecordBatch, num_indexed: int = DEFAULT_NUM_INDEXED_COLS
) -> str:
    """The stats JSON of a file holding ``table`` (column names as written in the file)."""
    accumulator = StatsAccumulator(num_indexed)
    accumulator.add(table)
    return accumulator.to_json()


def _put(tree: dict[str, Any], path: Path, value: Any) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def _has_min_max(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def _json_value(value: Any, t: pa.DataType, *, upper: bool) -> Any:
    if value is None:
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        as_float = float(value)
        # JSON numbers are read back as doubles by most engines; skip stats that would lie.
        return as_float if decimal.Decimal(repr(as_float)) == value else None
    if isinstance(value, str):
        if len(value) <= STRING_PREFIX_LENGTH:
            return value
        prefix = value[:STRING_PREFIX_LENGTH]
        if not upper:
            return prefix  # a prefix sorts before the whole string
        # delta-spark's tie-breaker: the prefix followed by the highest code point sorts
        # after every string starting with that prefix, except one continuing with that
        # very code point; for such a string there is no short upper bound, so none.
        bound = prefix + _MAX_CHAR
        return bound if bound >= value else None
    if isinstance(value, dt.datetime):
        return _timestamp_json(value, upper=upper, with_zone=getattr(t, "tz", None) is not None)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, int):
        return value
    return None


def _timestamp_json(value: dt.datetime, *, upper: bool, with_zone: bool) -> str:
    # The log keeps millisecond precision: round the bounds outward so they stay bounds.
    truncated = value.replace(microsecond=(value.microsecond // 1000) * 1000)
    if upper and truncated != value:
        truncated += _MS
    if with_zone:
        truncated = truncated.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return truncated.isoformat(timespec="milliseconds") + "Z"
    return truncated.replace(tzinfo=None).isoformat(timespec="milliseconds")
