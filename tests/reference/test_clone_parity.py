"""Shallow clones between deltaflow and delta-spark: each engine clones a table with
deletion vectors by ``CREATE TABLE delta.`<clone>` SHALLOW CLONE delta.`<source>```; both
engines read each clone alike, and the statement answers the same row shape. Then
``CREATE OR REPLACE TABLE ... SHALLOW CLONE`` over an existing table: refused by both while
it has rows, and the same CLONE commit on it once emptied."""

from __future__ import annotations

from typing import Any

import pytest

from tests.reference._server import frame

pytestmark = [pytest.mark.reference, pytest.mark.slow]


def _script(source: str, clone: str) -> str:
    return (
        f"spark.range(12).write.format('delta')"
        f".option('delta.enableDeletionVectors', 'true').save({source!r})\n"
        f"spark.sql('DELETE FROM delta.`{source}` WHERE id % 3 = 0')\n"
        f"cloned = spark.sql('CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{source}`')\n"
        "result = [cloned.columns, [list(r) for r in cloned.collect()]]\n"
    )


def _ours(spark: Any, code: str) -> Any:
    scope: dict[str, Any] = {"spark": spark}
    exec(code, scope)  # the same snippet delta-spark runs
    return scope["result"]


def test_each_engine_reads_the_others_clone(spark, reference, tmp_path):
    made = {}
    for engine in ("deltaflow", "delta-spark"):
        source, clone = str(tmp_path / f"{engine}_source"), str(tmp_path / f"{engine}_clone")
        code = _script(source, clone)
        made[engine] = (clone, _ours(spark, code) if engine == "deltaflow" else reference.run(code))

    columns = {engine: answer[0] for engine, (_, answer) in made.items()}
    assert columns["deltaflow"] == columns["delta-spark"]
    rows = {
        engine: dict(zip(answer[0], answer[1][0], strict=True))
        for engine, (_, answer) in made.items()
    }
    for row in rows.values():
        assert (row["num_copied_files"], row["num_removed_files"]) == (0, 0)
        assert row["source_num_of_files"] >= 1

    for engine, (clone, _) in made.items():
        ours = frame(spark.read.format("delta").load(clone))
        theirs = reference.run(f"spark.read.format('delta').load({clone!r})")
        assert ours == theirs, engine
        assert sorted(r[0] for r in ours["rows"]) == [i for i in range(12) if i % 3], engine
        history = reference.run(
            f"[r.operation for r in spark.sql('DESCRIBE HISTORY delta.`{clone}`').collect()]"
        )
        assert history == ["CLONE"], engine
        # delta-spark's clone commit says readVersion -1, which delta-rs cannot parse.
        ours_history = spark.sql(f"DESCRIBE HISTORY delta.`{clone}`").collect()
        assert [(r.version, r.operation) for r in ours_history] == [(0, "CLONE")], engine


def _replace_script(source: str, target: str) -> str:
    return (
        "import json, os\n"
        "def refused(statement):\n"
        "    try:\n"
        "        spark.sql(statement)\n"
        "    except Exception:\n"
        "        return True\n"
        "    return False\n"
        f"spark.range(12).write.format('delta')"
        f".option('delta.enableDeletionVectors', 'true').save({source!r})\n"
        f"spark.sql('DELETE FROM delta.`{source}` WHERE id % 3 = 0')\n"
        f"spark.range(5).selectExpr('id', \"'x' AS s\").write.format('delta')"
        f".partitionBy('s').save({target!r})\n"
        f"statement = 'CREATE OR REPLACE TABLE delta.`{target}` SHALLOW CLONE delta.`{source}`'\n"
        "with_rows = refused(statement)\n"
        f"spark.sql('DELETE FROM delta.`{target}`')\n"
        "cloned = spark.sql(statement)\n"
        f"log = os.path.join({target!r}, '_delta_log')\n"
        "def actions(version):\n"
        "    with open(os.path.join(log, f'{version:020d}.json')) as handle:\n"
        "        return [json.loads(line) for line in handle]\n"
        "info = next(a['commitInfo'] for a in actions(2) if 'commitInfo' in a)\n"
        "ids = [next(a['metaData']['id'] for a in actions(v) if 'metaData' in a) for v in (0, 2)]\n"
        "result = [with_rows, [list(r)[1:] for r in cloned.collect()], info['operation'],"
        " info['isBlindAppend'], info.get('readVersion'),"
        " info['operationParameters']['sourceVersion'], ids[0] == ids[1]]\n"
    )


def test_an_emptied_table_is_replaced_by_a_clone_as_in_delta_spark(spark, reference, tmp_path):
    made = {}
    for engine in ("deltaflow", "delta-spark"):
        source, target = str(tmp_path / f"{engine}_source"), str(tmp_path / f"{engine}_target")
        code = _replace_script(source, target)
        answer = _ours(spark, code) if engine == "deltaflow" else reference.run(code)
        made[engine] = (target, answer)
    ours, theirs = made["deltaflow"][1], made["delta-spark"][1]
    # Refused while the target has rows; then CLONE at read version 1, not a blind
    # append, the source's version 1, the target's table id kept (the output row but
    # for the source's size, which each engine's Parquet writer makes its own).
    assert theirs[0] is True and theirs[2:] == ["CLONE", False, 1, 1, True]
    assert ours == theirs

    for engine, (target, _) in made.items():
        ours_read = frame(spark.read.format("delta").load(target))
        theirs_read = reference.run(f"spark.read.format('delta').load({target!r})")
        assert ours_read == theirs_read, engine
        assert sorted(r[0] for r in ours_read["rows"]) == [i for i in range(12) if i % 3], engine
