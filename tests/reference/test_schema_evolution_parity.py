"""Schema evolution of writes into catalog tables, run the same way in deltaflow and in
delta-spark: each side runs the same PySpark code in its own session and warehouse, and
the tables they leave (columns, types, rows) or the fact that they refused must agree."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from tests.reference import _compare
from tests.reference._client import ReferenceJobError
from tests.reference._server import frame

pytestmark = [pytest.mark.reference, pytest.mark.slow]

_CREATE = (
    "spark.sql('DROP TABLE IF EXISTS {t}')\n"
    "spark.createDataFrame([(1, 'a')], 'id long, v string').write.format('delta')"
    ".saveAsTable('{t}')\n"
)
_AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"


def _under_auto_merge(statement: str) -> str:
    return (
        f"spark.conf.set({_AUTO_MERGE!r}, 'true')\n"
        f"try:\n    {statement}\nfinally:\n    spark.conf.unset({_AUTO_MERGE!r})\n"
    )


_WIDER = "spark.createDataFrame([(2, 'b', 2.5)], 'id long, v string, x double')"

# name -> (code run after _CREATE, whether delta-spark accepts it)
CASES: dict[str, tuple[str, bool]] = {
    "saveAsTable with mergeSchema": (
        f"{_WIDER}.write.format('delta').mode('append').option('mergeSchema', 'true')"
        ".saveAsTable('{t}')",
        True,
    ),
    "saveAsTable under autoMerge": (
        _under_auto_merge(f"{_WIDER}.write.format('delta').mode('append').saveAsTable('{{t}}')"),
        True,
    ),
    "saveAsTable without either": (
        f"{_WIDER}.write.format('delta').mode('append').saveAsTable('{{t}}')",
        False,
    ),
    "writeTo append with mergeSchema, reordered": (
        "spark.createDataFrame([('c', 3.5, 3)], 'v string, x double, id long').writeTo('{t}')"
        ".option('mergeSchema', 'true').append()",
        True,
    ),
    "SQL INSERT by position under autoMerge": (
        _under_auto_merge("spark.sql(\"INSERT INTO {t} SELECT 2 AS id, 'b' AS v, 2.5D AS x\")"),
        True,
    ),
    "SQL INSERT BY NAME under autoMerge": (
        _under_auto_merge(
            "spark.sql(\"INSERT INTO {t} BY NAME SELECT 'b' AS v, 2.5D AS x, 2 AS id\")"
        ),
        True,
    ),
    "insertInto with a mergeSchema option": (
        f"{_WIDER}.write.option('mergeSchema', 'true').insertInto('{{t}}')",
        False,
    ),
    "saveAsTable with fewer columns, reordered": (
        "spark.createDataFrame([('b', 2)], 'v string, id long').write.format('delta')"
        ".mode('append').saveAsTable('{t}')",
        True,
    ),
}

# Cases whose table has a struct column: name -> (code run after _CREATE_NESTED, accepted).
_CREATE_NESTED = (
    "spark.sql('DROP TABLE IF EXISTS {t}')\n"
    "spark.createDataFrame([(1, (1, 'a'))], 'id long, s struct<x:int, y:string>')"
    ".write.format('delta').saveAsTable('{t}')\n"
)
NESTED_CASES: dict[str, tuple[str, bool]] = {
    "saveAsTable with a new struct field, mergeSchema": (
        "spark.createDataFrame([(2, (2, 'b', 2.5))], 'id long, s struct<x:int, y:string,"
        " z:double>').write.format('delta').mode('append').option('mergeSchema', 'true')"
        ".saveAsTable('{t}')",
        True,
    ),
    "writeTo with struct fields reordered and one new": (
        "spark.createDataFrame([((True, 'c', 3), 3)], 's struct<w:boolean, y:string, x:int>,"
        " id long').writeTo('{t}').option('mergeSchema', 'true').append()",
        True,
    ),
    "saveAsTable with a new struct field, no mergeSchema": (
        "spark.createDataFrame([(2, (2, 'b', 2.5))], 'id long, s struct<x:int, y:string,"
        " z:double>').write.format('delta').mode('append').saveAsTable('{t}')",
        False,
    ),
}


@pytest.mark.parametrize("case", [*CASES, *NESTED_CASES])
def test_catalog_write_evolves_as_delta_spark_does(spark, reference, case: str) -> None:
    create, (code, accepted) = (
        (_CREATE, CASES[case]) if case in CASES else (_CREATE_NESTED, NESTED_CASES[case])
    )
    table = "parity_" + hashlib.sha1(case.encode()).hexdigest()[:12]
    setup = create.format(t=table)
    statement = code.format(t=table)

    reference.run(setup)
    assert _compare.deltaflow_run(spark, setup) is None
    theirs_failed: ReferenceJobError | None = None
    try:
        reference.run(statement)
    except ReferenceJobError as exc:
        theirs_failed = exc
    assert (theirs_failed is None) == accepted, theirs_failed  # the case's premise
    ours_failed = _compare.deltaflow_run(spark, statement)
    assert (ours_failed is None) == accepted, ours_failed

    ours = frame(spark.table(table))
    theirs = reference.run(f"spark.table({table!r})")
    assert ours == theirs
    # The new schema lands in the data's own commit (one version per write), as
    # delta-spark commits it.
    history = f"spark.sql('DESCRIBE HISTORY {table}').select('version', 'isBlindAppend')"
    assert _ours_frame(spark, history) == reference.run(history)


def _ours_frame(spark: Any, expression: str) -> Any:
    return frame(eval(expression, {"spark": spark}))  # the expression delta-spark evaluates
