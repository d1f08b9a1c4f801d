"""The replaceWhere predicate parser: grammar, SQL null semantics, stats pruning."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from deltaflow import InvalidOptionError
from deltaflow.table import _predicates as P

UTC = dt.timezone.utc

DATA = pa.table(
    {
        "id": pa.array([1, 2, 3, None, 5], pa.int64()),
        "name": pa.array(["a", "b", None, "d", "it's"], pa.string()),
        "day": pa.array(
            [
                dt.date(2024, 1, 1),
                dt.date(2024, 1, 2),
                None,
                dt.date(2024, 2, 1),
                dt.date(2023, 12, 31),
            ]
        ),
        "ts": pa.array(
            [dt.datetime(2024, 1, 1, 12, tzinfo=UTC)] * 4 + [None], pa.timestamp("us", tz="UTC")
        ),
        "price": pa.array([decimal.Decimal("1.50")] * 5, pa.decimal128(10, 2)),
        "flag": pa.array([True, False, None, True, False]),
        "s": pa.array([{"x": 1}, {"x": 2}, None, {"x": 4}, {"x": 5}]),
    }
)


def values(text: str) -> list[bool | None]:
    expression = P.to_expression(P.parse(text), DATA.schema)
    return P.evaluate(expression, DATA).to_pylist()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id = 2", [False, True, False, None, False]),
        ("id <> 2", [True, False, True, None, True]),
        ("id != 2", [True, False, True, None, True]),
        ("id < 3", [True, True, False, None, False]),
        ("id <= 3", [True, True, True, None, False]),
        ("id > 3", [False, False, False, None, True]),
        ("3 < id", [False, False, False, None, True]),
        ("id >= -1", [True, True, True, None, True]),
        ("id > 1.5", [False, True, True, None, True]),
        ("id IN (1, 5)", [True, False, False, None, True]),
        ("id NOT IN (1, 5)", [False, True, True, None, False]),
        ("id IN (1, NULL)", [True, None, None, None, None]),
        ("id NOT IN (1, NULL)", [False, None, None, None, None]),
        ("id IS NULL", [False, False, False, True, False]),
        ("id is not null", [True, True, True, False, True]),
        ("id BETWEEN 2 AND 3", [False, True, True, None, False]),
        ("id NOT BETWEEN 2 AND 3", [True, False, False, None, True]),
        ("name = 'it''s'", [False, False, None, False, True]),
        ('name = "b"', [False, True, None, False, False]),
        ("`name` = 'a' OR id = 3", [True, False, True, None, False]),
        ("day = DATE'2024-01-02'", [False, True, None, False, False]),
        ("day >= '2024-01-02'", [False, True, None, True, False]),
        ("ts = TIMESTAMP'2024-01-01 12:00:00'", [True, True, True, True, None]),
        ("ts < TIMESTAMP'2024-01-01T12:00:00Z'", [False, False, False, False, None]),
        ("price = 1.5", [True] * 5),
        ("s.x > 3", [False, False, None, True, True]),
        ("flag", [True, False, None, True, False]),
        ("NOT flag", [False, True, None, False, True]),
        ("id <=> NULL", [False, False, False, True, False]),
        ("NOT (id = 1 OR id = 2) AND name IS NOT NULL", [False, False, False, None, True]),
        ("id = 1 AND (name = 'a' OR name = 'zz')", [True, False, False, False, False]),
    ],
)
def test_predicate_values(text: str, expected: list[bool | None]) -> None:
    assert values(text) == expected


def test_kleene_logic() -> None:
    # false AND null is false, true OR null is true: SQL's three-valued logic.
    assert values("id = 2 AND name IS NULL AND flag") == [False] * 5
    assert values("id = 4 OR flag") == [True, False, None, True, False]
    assert values("flag OR id = 3") == [True, False, True, True, False]


@pytest.mark.parametrize(
    ("text", "bit"),
    [
        ("id LIKE 'a%'", "LIKE"),
        ("upper(name) = 'A'", "upper"),
        ("id + 1 = 2", "+"),
        ("id =", "end"),
        ("", "empty"),
        ("id = 1 extra", "extra"),
        ("day = DATE'not a date'", "not a date"),
        ("id BETWEEN 1", "end"),
    ],
)
def test_unsupported_syntax_names_option_and_bit(text: str, bit: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        P.parse(text)
    assert info.value.option == "replaceWhere"
    assert bit.lower() in info.value.message.lower()


def test_unknown_column_and_bad_literal_are_invalid_options() -> None:
    with pytest.raises(InvalidOptionError) as info:
        P.to_expression(P.parse("nope = 1"), DATA.schema)
    assert info.value.option == "replaceWhere"
    with pytest.raises(InvalidOptionError):
        P.to_expression(P.parse("id = 'abc'"), DATA.schema)


def test_columns() -> None:
    node = P.parse("a = 1 AND (s.x IN (1, 2) OR NOT b IS NULL) AND c BETWEEN 1 AND d")
    assert P.columns(node) == {("a",), ("s", "x"), ("b",), ("c",), ("d",)}


def stats_of(mapping: dict[str, P.ColumnStats]):
    return lambda path: mapping.get(".".join(path))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x = 5", True),
        ("x = 11", False),
        ("x > 10", False),
        ("x >= 10", True),
        ("x < 1", False),
        ("x IN (0, 11)", False),
        ("x IN (0, 3)", True),
        ("x BETWEEN 11 AND 20", False),
        ("x NOT BETWEEN 1 AND 10", False),
        ("NOT (x <= 10)", False),
        ("NOT (x > 0 AND x < 100)", False),
        ("x IS NULL", False),
        ("x IS NOT NULL", True),
        ("x = 11 OR y = 'q'", True),
        ("x = 11 AND y = 'q'", False),
        ("unknown = 3", True),
        ("x = NULL", False),
        ("c = 3", True),
        ("c <> 3", False),
        ("allnull = 1", False),
        ("allnull IS NULL", True),
    ],
)
def test_may_match(text: str, expected: bool) -> None:
    stats = stats_of(
        {
            "x": P.ColumnStats(1, 10, 0, 100),
            "y": P.ColumnStats("a", "z", 3, 100),
            "c": P.ColumnStats(3, 3, 0, 100),
            "allnull": P.ColumnStats(None, None, 100, 100),
        }
    )
    assert P.may_match(P.parse(text), stats) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The file's max is 12:00:00.123 in the log, its row 12:00:00.123456.
        ("ts = TIMESTAMP '2024-01-01 12:00:00.123456'", True),
        ("ts > TIMESTAMP '2024-01-01 12:00:00.1232'", True),
        ("ts >= TIMESTAMP '2024-01-01 12:00:00.123999'", True),
        ("ts > TIMESTAMP '2024-01-01 12:00:00.124'", False),
        ("ts = TIMESTAMP '2024-01-01 12:00:00.125'", False),
    ],
)
def test_may_match_allows_for_timestamp_stats_truncated_to_milliseconds(
    text: str, expected: bool
) -> None:
    utc = dt.timezone.utc
    low = dt.datetime(2024, 1, 1, 11, 0, tzinfo=utc)
    high = dt.datetime(2024, 1, 1, 12, 0, 0, 123000, tzinfo=utc)
    stats = stats_of({"ts": P.ColumnStats(low, high, 0, 10)})
    assert P.may_match(P.parse(text), stats) is expected
