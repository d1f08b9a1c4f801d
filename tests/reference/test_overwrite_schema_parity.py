"""Overwrites that change (or try to change) a table's partitioning, run the same way in
deltaflow and in delta-spark: each side runs the same PySpark code on its own table
(partitioned by ``a``), and whether it refused, the partitioning it leaves, the rows and,
where both record them alike, the commit's parameters must agree. The other engine then
reads each side's table."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from tests.reference._client import ReferenceJobError
from tests.reference._server import canonical, frame

pytestmark = [pytest.mark.reference, pytest.mark.slow]

_ROWS = "rows = spark.range(6).selectExpr('id', 'id % 2 AS a', 'id % 3 AS b')\n"
_SETUP = (
    _ROWS + "rows.write.format('delta').partitionBy('a').save({p!r})\n"
    "spark.sql('DROP TABLE IF EXISTS {t}')\n"
    "rows.write.format('delta').partitionBy('a').saveAsTable('{t}')\n"
)
_OVER = ".write.format('delta').mode('overwrite')"
_OVERWRITE = "rows" + _OVER
_SCHEMA = ".option('overwriteSchema', 'true')"
_DYNAMIC = ".option('partitionOverwriteMode', 'dynamic')"
_WHERE = ".option('replaceWhere', 'a = 1')"


class Case:
    def __init__(
        self,
        code: str,
        accepted: bool,
        *,
        by_name: bool = False,
        same_params: bool = False,
        same_history: bool = False,
    ):
        self.code = code
        self.accepted = accepted
        self.by_name = by_name  # the catalog table, else the path
        self.same_params = same_params  # both record the same operationParameters
        self.same_history = same_history  # DESCRIBE HISTORY's last row agrees (catalog table)


CASES: dict[str, Case] = {
    "overwrite with another partitionBy": Case(
        f"{_OVERWRITE}.partitionBy('b').save({{p!r}})", False
    ),
    "append with another partitionBy": Case(
        "rows.write.format('delta').mode('append').partitionBy('b').save({p!r})", False
    ),
    "overwriteSchema with another partitionBy": Case(
        f"{_OVERWRITE}{_SCHEMA}.partitionBy('b').save({{p!r}})", True, same_params=True
    ),
    "overwriteSchema without partitionBy": Case(
        f"{_OVERWRITE}{_SCHEMA}.save({{p!r}})", True, same_params=True
    ),
    "overwriteSchema, dynamic, partitioned": Case(
        f"{_OVERWRITE}{_SCHEMA}{_DYNAMIC}.partitionBy('a').save({{p!r}})", False
    ),
    "overwriteSchema, dynamic, unpartitioned": Case(
        f"{_OVERWRITE}{_SCHEMA}{_DYNAMIC}.save({{p!r}})", True, same_params=True
    ),
    "overwriteSchema, replaceWhere, a new column": Case(
        f"rows.where('a = 1').selectExpr('*', \"'x' AS c\").write.format('delta')"
        f".mode('overwrite'){_SCHEMA}{_WHERE}.save({{p!r}})",
        False,
    ),
    "overwriteSchema, replaceWhere, fitting rows": Case(
        f"rows.where('a = 1').selectExpr('id + 10 AS id', 'a', 'b').write.format('delta')"
        f".mode('overwrite'){_SCHEMA}{_WHERE}.save({{p!r}})",
        True,
    ),
    "saveAsTable with another partitionBy": Case(
        f"{_OVERWRITE}.partitionBy('b').saveAsTable('{{t}}')", False, by_name=True
    ),
    "saveAsTable, overwriteSchema, another partitionBy": Case(
        f"{_OVERWRITE}{_SCHEMA}.partitionBy('b').saveAsTable('{{t}}')", True, by_name=True
    ),
    # saveAsTable's overwrite is delta-spark's V1 writer: a DataFrame overwrite of the table
    # (schema enforced, columns by name), recorded as CREATE OR REPLACE TABLE AS SELECT.
    "saveAsTable with a new column": Case(
        f"rows.selectExpr('*', \"'x' AS c\"){_OVER}.partitionBy('a').saveAsTable('{{t}}')",
        False,
        by_name=True,
    ),
    "saveAsTable with another type": Case(
        f"rows.selectExpr('id', 'a', 'CAST(b AS STRING) AS b'){_OVER}.partitionBy('a')"
        ".saveAsTable('{t}')",
        False,
        by_name=True,
    ),
    "saveAsTable with a column left out": Case(
        f"rows.selectExpr('id', 'a'){_OVER}.partitionBy('a').saveAsTable('{{t}}')",
        True,
        by_name=True,
        same_history=True,
    ),
    "saveAsTable with the columns in another order": Case(
        f"rows.selectExpr('b', 'a', 'id'){_OVER}.saveAsTable('{{t}}')",
        True,
        by_name=True,
        same_history=True,
    ),
    "saveAsTable, mergeSchema, a new column": Case(
        f"rows.selectExpr('*', \"'x' AS c\"){_OVER}.option('mergeSchema', 'true')"
        ".partitionBy('a').saveAsTable('{t}')",
        True,
        by_name=True,
        same_history=True,
    ),
    "saveAsTable, overwriteSchema, a new column": Case(
        f"rows.selectExpr('*', \"'x' AS c\"){_OVER}{_SCHEMA}.partitionBy('a').saveAsTable('{{t}}')",
        True,
        by_name=True,
        same_history=True,
    ),
    "CREATE OR REPLACE TABLE AS SELECT, another PARTITIONED BY": Case(
        "spark.sql('CREATE OR REPLACE TABLE {t} USING delta PARTITIONED BY (b) AS SELECT id,"
        " id % 2 AS a, id % 3 AS b FROM range(6)')",
        True,
        by_name=True,
    ),
    "CREATE OR REPLACE TABLE AS SELECT, no PARTITIONED BY": Case(
        "spark.sql('CREATE OR REPLACE TABLE {t} USING delta AS SELECT id, id % 2 AS a,"
        " id % 3 AS b FROM range(6)')",
        True,
        by_name=True,
    ),
}

_DETAIL = 'spark.sql("DESCRIBE DETAIL {target}").collect()[0].partitionColumns'
_LAST_PARAMETERS = (
    "import json, os\n"
    "log = os.path.join({p!r}, '_delta_log')\n"
    "last = sorted(f for f in os.listdir(log) if f.endswith('.json'))[-1]\n"
    "with open(os.path.join(log, last)) as handle:\n"
    "    result = next(json.loads(l)['commitInfo'] for l in handle if 'commitInfo' in l)"
    "['operationParameters']\n"
)


def _ours(spark: Any, code: str) -> Any:
    scope: dict[str, Any] = {"spark": spark}
    exec(code, scope)  # the same snippet delta-spark runs
    return scope.get("result")


def _failure(run: Any) -> Exception | None:
    try:
        run()
    except Exception as exc:
        return exc
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_overwrite_partitioning_as_delta_spark(spark, reference, tmp_path, name: str) -> None:
    case = CASES[name]
    table = "ow_" + hashlib.sha1(name.encode()).hexdigest()[:12]
    made: dict[str, str] = {}
    for engine in ("deltaflow", "delta-spark"):
        path = str(tmp_path / engine)
        setup = _SETUP.format(p=path, t=table)
        statement = _ROWS + case.code.format(p=path, t=table)
        if engine == "deltaflow":
            _ours(spark, setup)
            failed = _failure(lambda: _ours(spark, statement))  # noqa: B023
        else:
            reference.run(setup)
            failed = _failure(lambda: reference.run(statement))  # noqa: B023
            assert failed is None or isinstance(failed, ReferenceJobError), failed
        assert (failed is None) == case.accepted, (engine, failed)
        made[engine] = f"`{table}`" if case.by_name else f"delta.`{path}`"

    ours = canonical(_ours(spark, f"result = {_DETAIL.format(target=made['deltaflow'])}"))
    assert ours == reference.run(_DETAIL.format(target=made["delta-spark"]))
    if case.by_name:  # each engine's own catalog
        theirs = reference.run(f"spark.table({table!r})")
        assert frame(spark.table(table)) == theirs
    else:  # each side's table, read by both engines
        for target in made.values():
            query = f"spark.sql('SELECT * FROM {target}')"
            assert frame(_ours(spark, f"result = {query}")) == reference.run(query), target
    if case.same_history:
        last = f"result = spark.sql('DESCRIBE HISTORY {table}').collect()[0]"
        row = "result = [result.operation, result.operationParameters]"
        ours = canonical(_ours(spark, f"{last}\n{row}"))
        assert ours == reference.run(f"{last}\n{row}")
    if case.same_params:
        ours = canonical(_ours(spark, _LAST_PARAMETERS.format(p=str(tmp_path / "deltaflow"))))
        theirs = reference.run(_LAST_PARAMETERS.format(p=str(tmp_path / "delta-spark")))
        assert ours == theirs
