"""Partition filters derived from filters on the base column of a generated partition
column (delta-spark's "optimizable partition expressions").

A table partitioned by ``date GENERATED ALWAYS AS (CAST(ts AS DATE))`` answers a filter
on ``ts`` by partition values once ``ts >= v`` also reads as ``date >= CAST(v AS DATE)``.
The derived predicates are only for skipping files: Spark still evaluates the user's
filter on every row read, so they need only never exclude a file that holds a match.

Recognised generation expressions (the column may be back-quoted; names and format
strings case as Spark spells them): ``CAST(c AS DATE)``, ``TO_DATE(c)``, ``YEAR(c)``,
``TRUNC(c, 'YEAR' | 'YYYY' | 'YY' | 'MONTH' | 'MON' | 'MM')``, ``DATE_FORMAT(c, f)`` for
formats whose text sorts as time does (``yyyy``, ``yyyy-MM``, ``yyyy-MM-dd``, ``yyyyMM``,
``yyyyMMdd``, ``yyyy/MM``, ``yyyy/MM/dd``), and ``MONTH(c)`` / ``DAY(c)`` /
``DAYOFMONTH(c)``. The first ones grow with the base column, so ``=``, ``<=>``, ``<``,
``<=``, ``>``, ``>=``, ``IN`` and ``IS NULL`` all turn into partition filters; a month or
a day of the month wraps around, so only ``=``, ``<=>``, ``IN`` and ``IS NULL`` do. For a
TIMESTAMP base column the result depends on the session time zone at write time, which
the log does not record; the derived bounds are therefore widened by a day on each side
(no time zone is 24 hours from UTC), so a file of the neighbouring day may be read, never
a matching one skipped. A DATE base column derives exact bounds. Other predicates are left
to the row filter.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deltaflow.table import _generated
from deltaflow.table._pruning import AllOf, AnyOf, Comparison, Predicate

_NAME = r"`?([A-Za-z_][A-Za-z0-9_]*)`?"
_ARGUMENT = r"\s*,\s*'([^']*)'\s*\)$"
_FORMS = (
    (re.compile(rf"^cast\s*\(\s*{_NAME}\s+as\s+date\s*\)$", re.I), "date"),
    (re.compile(rf"^to_date\s*\(\s*{_NAME}\s*\)$", re.I), "date"),
    (re.compile(rf"^year\s*\(\s*{_NAME}\s*\)$", re.I), "year"),
    (re.compile(rf"^month\s*\(\s*{_NAME}\s*\)$", re.I), "month"),
    (re.compile(rf"^(?:day|dayofmonth)\s*\(\s*{_NAME}\s*\)$", re.I), "day"),
    (re.compile(rf"^trunc\s*\(\s*{_NAME}{_ARGUMENT}", re.I), "trunc"),
    (re.compile(rf"^date_format\s*\(\s*{_NAME}{_ARGUMENT}", re.I), "format"),
)
_DAY = dt.timedelta(days=1)
# TRUNC's units (Spark's names, any case) and the first day of the unit a date falls in.
_TRUNC_UNITS: dict[str, Callable[[dt.date], dt.date]] = {
    "year": lambda d: d.replace(month=1, day=1),
    "yyyy": lambda d: d.replace(month=1, day=1),
    "yy": lambda d: d.replace(month=1, day=1),
    "month": lambda d: d.replace(day=1),
    "mon": lambda d: d.replace(day=1),
    "mm": lambda d: d.replace(day=1),
}
# DATE_FORMAT patterns whose text sorts as the dates do, as Python strftime patterns.
_SORTED_FORMATS = {
    "yyyy": "%Y",
    "yyyy-MM": "%Y-%m",
    "yyyy-MM-dd": "%Y-%m-%d",
    "yyyyMM": "%Y%m",
    "yyyyMMdd": "%Y%m%d",
    "yyyy/MM": "%Y/%m",
    "yyyy/MM/dd": "%Y/%m/%d",
}
# Kinds whose value wraps around as the base column grows: equality only.
_CYCLIC: dict[str, Callable[[dt.date], int]] = {"month": lambda d: d.month, "day": lambda d: d.day}


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
            if found and (rule := _rule(kind, found.groups()[1:])) is not None:
                rules.setdefault(found.group(1).lower(), []).append((column.name, rule))
                break
    return rules


def _rule(kind: str, arguments: Sequence[str]) -> str | None:
    """The rule a recognised expression's kind and literal argument make (``trunc:mm``,
    ``format:%Y-%m``), or None for an argument whose result does not sort as time does."""
    if kind == "trunc":
        unit = arguments[0].lower()
        return f"trunc:{unit}" if unit in _TRUNC_UNITS else None
    if kind == "format":
        pattern = _SORTED_FORMATS.get(arguments[0])
        return f"format:{pattern}" if pattern is not None else None
    return kind


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
    if kind in _CYCLIC:
        return _cyclic_equality(c, column, kind)
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


def _cyclic_equality(c: Comparison, column: tuple[str], kind: str) -> Predicate | None:
    """``month = m`` (or ``day = d``), or any of the two or three values a timestamp's
    widened day range covers; None for a range, which a wrapping value cannot bound."""
    if c.op not in ("=", "<=>"):
        return None
    days = _days(c.value)
    if days is None:
        return None
    low, high = days
    part = _CYCLIC[kind]
    values = sorted({part(low + _DAY * k) for k in range((high - low).days + 1)})
    options = tuple(Comparison("=", column, v) for v in values)
    return options[0] if len(options) == 1 else AnyOf(options)


def _days(value: Any) -> tuple[dt.date, dt.date] | None:
    """The first and last day a base-column value may fall on in any time zone."""
    if isinstance(value, dt.datetime):
        return (value - _DAY).date(), (value + _DAY).date()
    if isinstance(value, dt.date):
        return value, value
    return None


def _bounds(value: Any, kind: str) -> tuple[Any, Any] | None:
    """The lowest and highest partition value a base-column value may map to."""
    days = _days(value)
    if days is None:
        return None
    low, high = days
    if kind == "year":
        return low.year, high.year
    if kind.startswith("trunc:"):
        first_day = _TRUNC_UNITS[kind.split(":", 1)[1]]
        return first_day(low), first_day(high)
    if kind.startswith("format:"):
        pattern = kind.split(":", 1)[1]
        return low.strftime(pattern), high.strftime(pattern)
    return low, high
