"""Expectations' counts (built as SQL text) over real rows."""

from __future__ import annotations

from typing import Any

import pytest

from deltaflow.pipelines import _expectations
from deltaflow.pipelines._declarations import Expectation
from deltaflow.pipelines.errors import GraphValidationError

RULES = (
    Expectation("big", "x > 1 -- a comment ends with its line", "drop"),
    Expectation("small", "x < 5", "warn"),
    Expectation("named", "name IS NOT NULL", "drop"),
)


def test_counting_counts_rows_kept_and_each_rules_failures(spark: Any) -> None:
    df = spark.createDataFrame(
        [(0, "a"), (2, None), (3, "c"), (7, "d"), (None, "e")], "x INT, name STRING"
    )
    _expectations.check_constraints(df, RULES, "f")
    flags, keep, aggregate = _expectations.counting(RULES)
    rows, kept, counts = _expectations.counts_of(df.agg(*aggregate).first(), RULES, "t")
    assert (rows, kept) == (5, 2)  # x > 1 and a name: (3, c) and (7, d)
    # NULL breaks a rule.
    assert {c.name: c.failed_records for c in counts} == {"big": 2, "small": 2, "named": 1}
    assert sorted(r.x for r in df.filter(keep).collect()) == [3, 7]
    assert [df.filter(~flag).count() for flag in flags] == [2, 2, 1]
    assert keep is not None and _expectations.counting(RULES[1:2])[1] is None
    no_rule_drops = _expectations.counting(RULES[1:2])[2]
    assert df.agg(*no_rule_drops).first().asDict() == {"rows": 5, "kept": 5, "failed_0": 2}


def test_a_constraint_that_parses_only_inside_other_sql_is_refused(spark: Any) -> None:
    df = spark.createDataFrame([(1,)], "x INT")
    with pytest.raises(GraphValidationError) as caught:
        _expectations.check_constraints(df, (Expectation("odd", "x > 0) OR (true", "drop"),), "f")
    assert caught.value.problem == "bad_expectation"
