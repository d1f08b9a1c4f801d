"""Per-file statistics in the Delta log's ``stats`` JSON, read from a Parquet footer.

Files written by someone else (Spark's own Parquet writer, on the JVM write path)
already carry row-group min/max/null counts in their footers. Folding those over
the row groups gives the same JSON :mod:`deltaflow.table._stats` computes from
the rows, without reading a single data page: numRecords; nullCount, minValues
and maxValues for the first ``delta.dataSkippingNumIndexedCols`` leaf columns,
in the table's order; timestamps in milliseconds rounded outward; strings cut to
32 characters as bounds.

Where a footer cannot prove a value it is left out, never guessed (stats are
optional per column, and a missing bound only costs skipping):

- min/max of a column some row group has no min/max for (e.g. INT96 timestamps,
  binary values over parquet-mr's 4 KiB stats limit, all-NaN float groups);
- nullCount of an array or map column with nulls in its leaf: the footer counts
  null *elements* together with null lists, Delta wants null lists only.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow.table._stats import (
    DEFAULT_NUM_INDEXED_COLS,
    _has_min_max,
    _json_value,
    _put,
)

Path = tuple[str, ...]


class _Bounds:
    __slots__ = ("high", "low", "min_max_known", "nulls", "nulls_known")

    def __init__(self) -> None:
        self.nulls = 0
        self.nulls_known = True
        self.low: Any = None
        self.high: Any = None
        self.min_max_known = True


def footer_stats(
    metadata: pq.FileMetaData,
    data_schema: pa.Schema,
    num_indexed: int = DEFAULT_NUM_INDEXED_COLS,
) -> str:
    """The stats JSON of the file ``metadata`` describes.

    ``data_schema`` is the Arrow schema of the file's columns as the table sees them
    (logical types, partition columns excluded, table order): it decides which leaves
    count against ``num_indexed`` and how footer values are rendered.
    """
    columns = _column_bounds(metadata)
    budget = [num_indexed if num_indexed >= 0 else 1 << 30]
    leaves: list[tuple[Path, pa.DataType]] = []
    for f in data_schema:
        _collect_leaves((f.name,), f.type, budget, leaves)
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    for path, arrow_type in leaves:
        bounds = _leaf_bounds(columns, path)
        if bounds is None:
            continue
        if bounds.nulls_known:
            _put(nulls, path, bounds.nulls)
        if not (bounds.min_max_known and _has_min_max(arrow_type)):
            continue
        low = _json_value(bounds.low, arrow_type, upper=False)
        high = _json_value(bounds.high, arrow_type, upper=True)
        if low is not None:
            _put(mins, path, low)
        if high is not None:
            _put(maxs, path, high)
    stats = {
        "numRecords": metadata.num_rows,
        "minValues": mins,
        "maxValues": maxs,
        "nullCount": nulls,
    }
    return json.dumps(stats, separators=(",", ":"), allow_nan=False)


def _collect_leaves(
    path: Path, arrow_type: pa.DataType, budget: list[int], out: list[tuple[Path, pa.DataType]]
) -> None:
    # Same walk as _stats.StatsAccumulator._visit: structs recurse, anything else is one leaf.
    if budget[0] <= 0:
        return
    if pa.types.is_struct(arrow_type):
        for index in range(arrow_type.num_fields):
            child = arrow_type.field(index)
            _collect_leaves((*path, child.name), child.type, budget, out)
        return
    budget[0] -= 1
    out.append((path, arrow_type))


def _column_bounds(metadata: pq.FileMetaData) -> dict[str, _Bounds]:
    """Null counts and min/max per Parquet leaf column (dotted path), over all row groups."""
    out: dict[str, _Bounds] = {}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            bounds = out.setdefault(chunk.path_in_schema, _Bounds())
            stats = chunk.statistics
            if stats is None:
                bounds.nulls_known = bounds.min_max_known = False
                continue
            if stats.has_null_count:
                bounds.nulls += stats.null_count
            else:
                bounds.nulls_known = False
            if group.num_rows == 0 or (stats.has_null_count and stats.null_count == group.num_rows):
                continue  # no values: nothing to bound
            if not stats.has_min_max:
                bounds.min_max_known = False
                continue
            low, high = stats.min, stats.max
            if isinstance(low, float) and (low != low or high != high):
                bounds.min_max_known = False  # NaN bounds: no order to trust
                continue
            bounds.low = low if bounds.low is None else min(bounds.low, low)
            bounds.high = high if bounds.high is None else max(bounds.high, high)
    return out


def _leaf_bounds(columns: dict[str, _Bounds], path: Path) -> _Bounds | None:
    dotted = ".".join(path)
    bounds = columns.get(dotted)
    if bounds is not None:
        return bounds
    # Arrays and maps are one Delta leaf but one or more Parquet leaves below it.
    nested = [b for name, b in columns.items() if name.startswith(dotted + ".")]
    if not nested:
        return None
    out = _Bounds()
    out.min_max_known = False
    # A leaf's null count includes null lists; zero there proves no list is null.
    out.nulls_known = all(b.nulls_known and b.nulls == 0 for b in nested)
    return out
