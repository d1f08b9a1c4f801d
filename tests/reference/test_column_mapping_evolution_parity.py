"""Schema evolution of column-mapped tables, run the same way in deltaflow and in delta-spark.

Each case creates a column-mapped table (``name`` or ``id`` mode) on both sides and runs
one write that brings new columns or struct fields. The two sides must agree on whether it
is accepted, on the table it leaves (columns, types, rows), and on its log: one commit with
the metadata and the data, the same ids for the same fields and the same
``delta.columnMapping.maxColumnId``. Then each engine reads the other's table and writes
on top of it (one more column, by ``mergeSchema``), and both read it again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.reference import _compare
from tests.reference._client import ReferenceJobError, ReferenceSpark
from tests.reference._server import frame

pytestmark = [pytest.mark.reference, pytest.mark.slow]

_AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"
_CREATE = (
    "spark.sql('DROP TABLE IF EXISTS {t}')\n"
    'spark.sql("CREATE TABLE {t} ({columns}) USING delta'
    " LOCATION '{p}' TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}')\")\n"
    'spark.sql("INSERT INTO {t} VALUES ({values})")\n'
)
_COLUMNS = ("id BIGINT, s STRUCT<a: INT, b: STRING>", "1, named_struct('a', 1, 'b', 'x')")
_COLLECTIONS = (
    "id BIGINT, l ARRAY<STRUCT<a: INT>>, m MAP<STRING, STRUCT<a: INT>>",
    "1, array(named_struct('a', 1)), map('k', named_struct('a', 1))",
)


def _under_auto_merge(statement: str) -> str:
    return (
        f"spark.conf.set({_AUTO_MERGE!r}, 'true')\n"
        f"try:\n    {statement}\nfinally:\n    spark.conf.unset({_AUTO_MERGE!r})\n"
    )


# name -> (code run after _CREATE, whether delta-spark accepts it)
CASES: dict[str, tuple[str, bool]] = {
    "save by path, a column and a struct field": (
        "spark.createDataFrame([(2, (2, 'y', 2.5), 'new')], 'id long, s struct<a:int, b:string,"
        " c:double>, z string').write.format('delta').mode('append')"
        ".option('mergeSchema', 'true').save('{p}')",
        True,
    ),
    "saveAsTable with mergeSchema": (
        "spark.createDataFrame([(2, (2, 'y'), 2.5)], 'id long, s struct<a:int, b:string>,"
        " x double').write.format('delta').mode('append').option('mergeSchema', 'true')"
        ".saveAsTable('{t}')",
        True,
    ),
    "writeTo append, reordered, a struct field": (
        "spark.createDataFrame([('t', 3, (True, 'z', 3))], 'y string, id long, s struct<w:boolean,"
        " b:string, a:int>').writeTo('{t}').option('mergeSchema', 'true').append()",
        True,
    ),
    "SQL INSERT BY NAME under autoMerge": (
        _under_auto_merge(
            "spark.sql(\"INSERT INTO {t} BY NAME SELECT named_struct('a', 4, 'b', 'q', 'w',"
            " false) AS s, 4L AS id, 'u' AS y\")"
        ),
        True,
    ),
    "save by path without mergeSchema": (
        "spark.createDataFrame([(2, 'new')], 'id long, z string').write.format('delta')"
        ".mode('append').save('{p}')",
        False,
    ),
    "save by path, struct fields in an array and a map": (
        "spark.sql(\"SELECT 2L AS id, array(named_struct('a', 2, 'b', 'y')) AS l,"
        " map('k', named_struct('a', 2, 'c', 'z')) AS m\").write.format('delta')"
        ".mode('append').option('mergeSchema', 'true').save('{p}')",
        True,
    ),
}
# The cases whose table has array and map columns (the rest: _COLUMNS).
_ON_COLLECTIONS = {"save by path, struct fields in an array and a map"}
# What the other engine writes on top of each side's evolved table.
_ON_TOP = (
    "spark.createDataFrame([(9, 'k')], 'id long, k string').write.format('delta')"
    ".mode('append').option('mergeSchema', 'true').save('{p}')"
)


def _fill(code: str, table: str, path: str, mode: str, case: str = "") -> str:
    columns, values = _COLLECTIONS if case in _ON_COLLECTIONS else _COLUMNS
    return (
        code.replace("{columns}", columns)
        .replace("{values}", values)
        .replace("{t}", table)
        .replace("{p}", path)
        .replace("{mode}", mode)
    )


def _theirs(reference: ReferenceSpark, code: str) -> ReferenceJobError | None:
    try:
        reference.run(code)
    except ReferenceJobError as exc:
        return exc
    return None


def _log(path: str) -> dict[str, Any]:
    """What the latest commit of ``path`` says about column mapping: its version, the
    kinds of action in it, each field's id by path, maxColumnId, the physical names."""
    commits = sorted(p for p in Path(path, "_delta_log").glob("*.json") if p.stem.isdigit())
    version = int(commits[-1].stem)
    schema: dict[str, Any] = {}
    configuration: dict[str, str] = {}
    kinds: set[str] = set()
    for commit in commits:
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if commit == commits[-1]:
                kinds.update(action)
            if "metaData" in action:
                schema = json.loads(action["metaData"]["schemaString"])
                configuration = action["metaData"]["configuration"]
    ids: dict[str, int] = {}
    names: list[str] = []

    def visit(t: Any, prefix: str) -> None:
        if not isinstance(t, dict):
            return
        for f in t.get("fields", ()):
            ids[prefix + f["name"]] = f["metadata"]["delta.columnMapping.id"]
            names.append(f["metadata"]["delta.columnMapping.physicalName"])
            visit(f["type"], prefix + f["name"] + ".")
        for part in ("elementType", "keyType", "valueType"):
            if part in t:
                visit(t[part], f"{prefix}<{part}>.")

    visit(schema, "")
    assert len(set(names)) == len(names), f"physical names repeat in {path}"
    return {
        "version": version,
        "kinds": sorted(kinds - {"commitInfo"}),
        "ids": ids,
        "maxColumnId": configuration.get("delta.columnMapping.maxColumnId"),
    }


def _cases() -> list[Any]:
    return [
        pytest.param(case, mode, id=f"{case}-{mode}") for case in CASES for mode in ("name", "id")
    ]


@pytest.mark.parametrize(("case", "mode"), _cases())
def test_mapped_table_evolves_as_delta_spark_does(
    spark: Any, reference: ReferenceSpark, tmp_path: Path, case: str, mode: str
) -> None:
    code, accepted = CASES[case]
    table = "cm_parity_" + hashlib.sha1(f"{case}-{mode}".encode()).hexdigest()[:12]
    ours_path, theirs_path = str(tmp_path / "ours"), str(tmp_path / "theirs")

    reference.run(_fill(_CREATE, table, theirs_path, mode, case))
    assert _compare.deltaflow_run(spark, _fill(_CREATE, table, ours_path, mode, case)) is None
    theirs_failed = _theirs(reference, _fill(code, table, theirs_path, mode))
    assert (theirs_failed is None) == accepted, theirs_failed  # the case's premise
    ours_failed = _compare.deltaflow_run(spark, _fill(code, table, ours_path, mode))
    assert (ours_failed is None) == accepted, ours_failed

    assert frame(spark.table(table)) == reference.run(f"spark.table({table!r})")
    assert _log(ours_path) == _log(theirs_path)
    if accepted:
        assert _log(ours_path)["version"] == 2
        assert _log(ours_path)["kinds"] == ["add", "metaData"]

    # Each engine reads the other's table, then adds a column to it.
    for path in (ours_path, theirs_path):
        assert _compare.deltaflow_read(spark, path) == _compare.reference_read(reference, path)
    reference.run(_fill(_ON_TOP, table, ours_path, mode))
    assert _compare.deltaflow_run(spark, _fill(_ON_TOP, table, theirs_path, mode)) is None
    assert _log(ours_path) == _log(theirs_path)
    for path in (ours_path, theirs_path):
        assert _compare.deltaflow_read(spark, path) == _compare.reference_read(reference, path)
    assert _compare.deltaflow_read(spark, ours_path) == _compare.deltaflow_read(spark, theirs_path)
