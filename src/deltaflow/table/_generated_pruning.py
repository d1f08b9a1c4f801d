"""Partition filters derived from filters on the base column of a generated partition
column (delta-spark's "optimizable partition expressions").

A table partitioned by ``date GENERATED ALWAYS AS (CAST(ts AS DATE))`` answers a filter
on ``ts`` by partition values once ``ts >= v`` also reads as ``date >= CAST(v AS DATE)``.
The derived predicates are only for skipping files: Spark still evaluates the user's
filter on every row read, so they need only never exclude a file that holds a match.

Recognised generation expressions (the column may be back-quoted): ``CAST(c AS DATE)``,
``TO_DATE(c)`` and ``YEAR(c)``. For a TIMESTAMP base column the cast's result depends on
the session time zone at write time, which the log does not record; the derived bounds
are therefore widened by a day on each side (no time zone is 24 hours from UTC), so a
file of the neighbouring day may be read, never a matching one skipped. A DATE base
column derives exact bounds. ``=``, ``<=>``, ``<``, ``<=``, ``>``, ``>=``, ``IN`` and
``IS NULL`` on the base column are turned into partition filters; other predicates are
left to the row filter.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from deltaflow.table import _generated
from deltaflow.table._pruning import AllOf, AnyOf, Comparison, Predicate

_NAME = r"`?([A-Za-z_][A-Za-z0-9_]*)`?"
_FORMS = (
    (re.compile(rf"^cast\s*\(\s*{_NAME}\s+as\s+date\s*\)$", re.I), "date"),
    (re.compile(rf"^to_date\s*\(\s*{_NAME}\s*\)$", re.I), "date"),
    (re.compile(rf"^year\s*\(\s*{_NAME}\s*\)$", re.I), "year"),
)
_DAY = dt.timedelta(days=1)


def derived_predicates(
    schema: Mapping[str, Any],
    partition_columns: Sequence[str],
    predicates: Sequence[Predicate],
) -> list[Predicate]:
    """Partition predicates implied by ``predicates`` (ANDed) through the table's
    generated partition columns; empty when none applies."""
    rules = _rules(schema, partition_columns)
    if not rules:
        return []
    out: list[Predicate] = []
    for predicate in predicates:
        if not isinstance(predicate, Comparison) or len(predicate.column) != 1:
            continue
        for partition, kind in rules.get(predicate.column[0].lower(), ()):
            derived = _derive(predicate, partition, kind)
            if derived is not None:
                out.append(derived)
    return out


def _rules(
    schema: Mapping[str, Any], partition_columns: Sequence[str]
) -> dict[str, list[tuple[str, str]]]:
    """Base column (lower case) -> the generated partition columns over it and their kind."""
    partitions = {p.lower() for p in partition_columns}
    rules: dict[str, list[tuple[str, str]]] = {}
    for column in _generated.generated_columns(schema):
        if column.name.lower() not in partitions:
            continue
        expression = " ".join(column.expression.split())
        for pattern, kind in _FORMS:
            found = pattern.match(expression)
            if found:
                rules.setdefault(found.group(1).lower(), []).append((column.name, kind))
                break
    return rules


def _derive(c: Comparison, partition: str, kind: str) -> Predicate | None:
    column = (partition,)
    if c.op == "is_null":
        return Comparison("is_null", column)
    if c.op == "in":
        if not isinstance(c.value, (tuple, list)):
            return None
        options = [_derive(Comparison("=", c.column, v), partition, kind) for v in c.value]
        if not options or any(o is None for o in options):
            return None
        return AnyOf(tuple(o for o in options if o is not None))
    bounds = _bounds(c.value, kind)
    if bounds is None:
        return None
    low, high = bounds
    if c.op in ("=", "<=>"):
        return AllOf((Comparison(">=", column, low), Comparison("<=", column, high)))
    if c.op in ("<", "<="):
        return Comparison("<=", column, high)
    if c.op in (">", ">="):
        return Comparison(">=", column, low)
    return None


def _bounds(value: Any, kind: str) -> tuple[Any, Any] | None:
    """The lowest and highest partition value a base-column value may map to."""
    if isinstance(value, dt.datetime):
        low, high = (value - _DAY).date(), (value + _DAY).date()
    elif isinstance(value, dt.date):
        low = high = value
    else:
        return None
    if kind == "year":
        return low.year, high.year
    return low, high
