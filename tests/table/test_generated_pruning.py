"""Partition filters derived from filters on a generated partition column's base column."""

from __future__ import annotations

import datetime as dt

from deltaflow.table._generated_pruning import derived_predicates
from deltaflow.table._pruning import AllOf, AnyOf, Comparison


def _schema(*generated: tuple[str, str, str]) -> dict:
    fields = [
        {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "d", "type": "date", "nullable": True, "metadata": {}},
    ]
    for name, kind, expression in generated:
        fields.append(
            {
                "name": name,
                "type": kind,
                "nullable": True,
                "metadata": {"delta.generationExpression": expression},
            }
        )
    return {"type": "struct", "fields": fields}


def test_timestamp_bounds_are_widened_by_a_day_and_date_bounds_exact():
    schema = _schema(("day", "date", "CAST(`ts` AS DATE)"), ("y", "integer", "year(d)"))
    moment = dt.datetime(2024, 1, 8, 12, tzinfo=dt.timezone.utc)
    derived = derived_predicates(
        schema,
        ["day", "y"],
        [
            Comparison(">=", ("ts",), moment),
            Comparison("=", ("d",), dt.date(2023, 12, 31)),
            Comparison("in", ("TS",), (moment,)),
            Comparison("is_null", ("ts",)),
        ],
    )
    assert derived == [
        Comparison(">=", ("day",), dt.date(2024, 1, 7)),
        AllOf((Comparison(">=", ("y",), 2023), Comparison("<=", ("y",), 2023))),
        AnyOf(
            (
                AllOf(
                    (
                        Comparison(">=", ("day",), dt.date(2024, 1, 7)),
                        Comparison("<=", ("day",), dt.date(2024, 1, 9)),
                    )
                ),
            )
        ),
        Comparison("is_null", ("day",)),
    ]


def test_sorted_forms_bound_ranges_and_cyclic_forms_only_equalities():
    schema = _schema(
        ("m", "string", "date_format(ts, 'yyyy-MM')"),
        ("first", "date", "TRUNC(`d`, 'MM')"),
        ("mo", "integer", "month(ts)"),
        ("dd", "integer", "DAYOFMONTH(d)"),
    )
    moment = dt.datetime(2024, 2, 1, 6, tzinfo=dt.timezone.utc)  # Jan 31 .. Feb 2
    derived = derived_predicates(
        schema,
        ["m", "first", "mo", "dd"],
        [
            Comparison(">", ("ts",), moment),
            Comparison("<=", ("d",), dt.date(2024, 3, 15)),
            Comparison("=", ("ts",), moment),
            Comparison("in", ("d",), (dt.date(2024, 3, 15),)),
            Comparison(">", ("d",), dt.date(2024, 3, 15)),  # a day of the month: no range
        ],
    )
    assert derived == [
        Comparison(">=", ("m",), "2024-01"),
        Comparison("<=", ("first",), dt.date(2024, 3, 1)),
        AllOf((Comparison(">=", ("m",), "2024-01"), Comparison("<=", ("m",), "2024-02"))),
        AnyOf((Comparison("=", ("mo",), 1), Comparison("=", ("mo",), 2))),
        AnyOf(
            (
                AllOf(
                    (
                        Comparison(">=", ("first",), dt.date(2024, 3, 1)),
                        Comparison("<=", ("first",), dt.date(2024, 3, 1)),
                    )
                ),
            )
        ),
        AnyOf((Comparison("=", ("dd",), 15),)),
        Comparison(">=", ("first",), dt.date(2024, 3, 1)),
    ]


def test_other_expressions_and_columns_derive_nothing():
    schema = _schema(
        ("m", "string", "date_format(ts, 'MM-yyyy')"), ("day", "date", "CAST(ts AS DATE)")
    )
    moment = dt.datetime(2024, 1, 8, tzinfo=dt.timezone.utc)
    # 'MM-yyyy' does not sort as time does; day is not a partition column; "<>" is not
    # turned around.
    assert derived_predicates(schema, ["m"], [Comparison(">", ("ts",), moment)]) == []
    assert derived_predicates(schema, [], [Comparison(">", ("ts",), moment)]) == []
    assert derived_predicates(schema, ["day"], [Comparison("starts_with", ("ts",), "x")]) == []
