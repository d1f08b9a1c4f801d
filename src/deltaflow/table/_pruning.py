"""File skipping: decide from partition values and min/max stats which files a
predicate can match.

A file is skipped only when the predicate is certainly false for every row in it;
when in doubt (missing stats, values of another type) the file is kept. Spark
evaluates every predicate again on the rows we return, so skipping never has to
be exact, only safe.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from deltaflow.table._snapshot import FileEntry

Op = Literal["=", "<=>", "<", "<=", ">", ">=", "in", "is_null", "is_not_null", "starts_with"]

# The log keeps timestamps at millisecond precision: a max of 12:00:00.123 may stand
# for 12:00:00.123999, so comparisons against a max allow for the lost digits.
_TIMESTAMP_SLACK = dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class Comparison:
    """``column <op> value``; ``column`` is a path of (nested) field names."""

    op: Op
    column: tuple[str, ...]
    value: Any = None


@dataclass(frozen=True)
class Negation:
    child: Comparison


@dataclass(frozen=True)
class AnyOf:
    """Holds when one of ``children`` may hold (SQL ``OR``)."""

    children: tuple[Predicate, ...]


@dataclass(frozen=True)
class AllOf:
    """Holds when every one of ``children`` may hold (an ``AND`` under an ``OR``)."""

    children: tuple[Predicate, ...]


Predicate = Comparison | Negation | AnyOf | AllOf


@dataclass(frozen=True)
class PruningResult:
    files: list[FileEntry]
    files_in_snapshot: int
    skipped_by_partition: int
    skipped_by_stats: int


def prune_files(
    files: Sequence[FileEntry], predicates: Iterable[Predicate], partition_columns: Sequence[str]
) -> PruningResult:
    """Keep the files on which the AND of ``predicates`` may hold."""
    predicates = list(predicates)
    partition_lookup = {c.lower(): c for c in partition_columns}
    kept: list[FileEntry] = []
    by_partition = by_stats = 0
    for entry in files:
        verdict = "keep"
        for predicate in predicates:
            verdict = _verdict(entry, predicate, partition_lookup)
            if verdict != "keep":
                break
        if verdict == "partition":
            by_partition += 1
        elif verdict == "stats":
            by_stats += 1
        else:
            kept.append(entry)
    return PruningResult(kept, len(files), by_partition, by_stats)


def _verdict(entry: FileEntry, predicate: Predicate, partitions: dict[str, str]) -> str:
    if isinstance(predicate, AnyOf):
        verdicts = [_verdict(entry, child, partitions) for child in predicate.children]
        if "keep" in verdicts:
            return "keep"
        return "stats" if "stats" in verdicts else "partition"
    if isinstance(predicate, AllOf):
        for child in predicate.children:
            verdict = _verdict(entry, child, partitions)
            if verdict != "keep":
                return verdict
        return "keep"
    comparison = predicate.child if isinstance(predicate, Negation) else predicate
    column = comparison.column
    if len(column) == 1 and column[0].lower() in partitions:
        value = entry.partition_values.get(partitions[column[0].lower()])
        holds = _evaluate(comparison, value)
        if isinstance(predicate, Negation) and holds is not None:
            holds = not holds
        return "partition" if holds is not True else "keep"
    if isinstance(predicate, Negation):
        return "keep"
    try:
        return "stats" if _stats_exclude(entry, comparison) else "keep"
    except TypeError:
        return "keep"


def _evaluate(c: Comparison, value: Any) -> bool | None:
    """SQL three-valued evaluation of ``c`` on one value; None means NULL."""
    try:
        if c.op == "is_null":
            return value is None
        if c.op == "is_not_null":
            return value is not None
        if c.op == "<=>":
            return (
                bool(value == c.value)
                if value is not None and c.value is not None
                else (value is None and c.value is None)
            )
        if value is None or (c.value is None and c.op != "in"):
            return None
        target = _align(c.value, value)
        if c.op == "=":
            return bool(value == target)
        if c.op == "<":
            return bool(value < target)
        if c.op == "<=":
            return bool(value <= target)
        if c.op == ">":
            return bool(value > target)
        if c.op == ">=":
            return bool(value >= target)
        if c.op == "in":
            return any(value == _align(v, value) for v in c.value if v is not None)
        if c.op == "starts_with":
            return isinstance(value, str) and value.startswith(str(c.value))
    except TypeError:
        return True  # incomparable: keep the file
    return True


def _lookup(values: dict[str, Any], column: tuple[str, ...]) -> Any:
    current: Any = values
    for name in column:
        if not isinstance(current, dict):
            return None
        match = current.get(name)
        if match is None:
            lowered = {k.lower(): v for k, v in current.items()}
            match = lowered.get(name.lower())
        current = match
    return current


def _stats_exclude(entry: FileEntry, c: Comparison) -> bool:
    num_records = entry.num_records
    null_count = _lookup(entry.null_counts, c.column)
    if c.op == "is_null":
        return null_count == 0
    all_null = num_records is not None and null_count is not None and null_count == num_records
    if c.op == "is_not_null":
        return all_null
    if c.op == "<=>" and c.value is None:
        return null_count == 0
    if all_null and num_records:
        return True  # every comparison with NULL is NULL
    low = _lookup(entry.min_values, c.column)
    high = _lookup(entry.max_values, c.column)
    if low is None or high is None or isinstance(low, dict) or (c.value is None and c.op != "in"):
        return False
    if isinstance(high, dt.datetime):
        high = high + _TIMESTAMP_SLACK
    if c.op in ("=", "<=>"):
        value = _align(c.value, low)
        return bool(value < low or value > high)
    if c.op == "<":
        return bool(low >= _align(c.value, low))
    if c.op == "<=":
        return bool(low > _align(c.value, low))
    if c.op == ">":
        return bool(high <= _align(c.value, high))
    if c.op == ">=":
        return bool(high < _align(c.value, high))
    if c.op == "in":
        values = [_align(v, low) for v in c.value if v is not None]
        return (bool(values) and all(v < low or v > high for v in values)) or not values
    if c.op == "starts_with":
        prefix = str(c.value)
        if not isinstance(low, str) or not isinstance(high, str):
            return False
        return high < prefix or low[: len(prefix)] > prefix
    return False


def _align(value: Any, like: Any) -> Any:
    """Make ``value`` comparable with ``like`` where Python would refuse or mislead."""
    if isinstance(like, dt.datetime) and isinstance(value, dt.datetime):
        if like.tzinfo is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        if like.tzinfo is None and value.tzinfo is not None:
            return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value
    if isinstance(like, dt.datetime) and isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=like.tzinfo)
    if type(like) is dt.date and isinstance(value, dt.datetime):
        raise TypeError("date column compared with a timestamp")
    return value
