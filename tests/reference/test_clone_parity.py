"""Shallow clones between deltaflow and delta-spark: each engine clones a table with
deletion vectors by ``CREATE TABLE delta.`<clone>` SHALLOW CLONE delta.`<source>```; both
engines read each clone alike, and the statement answers the same row shape."""

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
