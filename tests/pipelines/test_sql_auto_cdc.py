"""AUTO CDC declared in SQL library files gives what the Python declaration gives."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from deltaflow.pipelines import _loader, dlt
from deltaflow.pipelines._spec import load_spec

CHANGES = "id BIGINT, name STRING, seq INT, op STRING"
FIRST = [
    (1, "a1", 1, "UPSERT"),
    (1, "a3", 3, "UPSERT"),
    (2, "b1", 1, "UPSERT"),
    (3, "c1", 1, "UPSERT"),
    (3, None, 2, "DELETE"),
]
# Late (older than what the key saw) and out-of-order events.
SECOND = [
    (1, "a2", 2, "UPSERT"),
    (3, "c0", 0, "UPSERT"),
    (2, "b5", 5, "UPSERT"),
    (4, "d1", 1, "UPSERT"),
]

SQL = """
CREATE OR REFRESH STREAMING TABLE dim1;
CREATE FLOW dim1_flow AS AUTO CDC INTO dim1
FROM stream(changes_src)
KEYS (id)
APPLY AS DELETE WHEN op = 'DELETE'
SEQUENCE BY seq
COLUMNS * EXCEPT (op)
STORED AS SCD TYPE 1;

-- Lakeflow's older statement, LIVE. prefixes and all.
CREATE STREAMING TABLE dim2;
APPLY CHANGES INTO LIVE.dim2
FROM STREAM(LIVE.changes_src)
KEYS (id)
APPLY AS DELETE WHEN op = 'DELETE'
SEQUENCE BY seq
COLUMNS id, name, seq
STORED AS SCD TYPE 2
"""


def _python_graph() -> dp.Graph:
    with dp.collect() as declared:
        for target, scd in (("dim1", 1), ("dim2", 2)):
            dlt.create_streaming_table(target)
            dlt.apply_changes(
                target=target,
                source="changes_src",
                keys=["id"],
                sequence_by="seq",
                apply_as_deletes="op = 'DELETE'",
                except_column_list=["op"],
                stored_as_scd_type=scd,
            )
    return declared.graph()


def _sql_graph(spark: Any, project: Path) -> dp.Graph:
    (project / "transformations").mkdir(parents=True)
    (project / "spark-pipeline.yml").write_text(
        "name: sqlcdc\nstorage: st\nlibraries:\n  - glob:\n      include: transformations/**\n"
    )
    (project / "transformations/cdc.sql").write_text(SQL)
    return _loader.load_graph(spark, load_spec(project / "spark-pipeline.yml"))


def _tables(spark: Any, root: Path, graph: dp.Graph) -> dict[str, list[tuple[Any, ...]]]:
    """Both targets after two updates of ``graph`` over the same change feed."""
    source = str(root / "changes")
    database = f"sqlcdc_{uuid.uuid4().hex[:8]}"
    spark.createDataFrame(FIRST, CHANGES).write.format("delta").save(source)
    spark.sql(f"CREATE DATABASE `{database}`")
    spark.sql(f"CREATE TABLE `{database}`.changes_src USING delta LOCATION '{source}'")
    settings = dp.PipelineSettings(name="cdc", storage=str(root / "storage"), database=database)
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"
    spark.createDataFrame(SECOND, CHANGES).write.format("delta").mode("append").save(source)
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"
    out = {}
    for table in ("dim1", "dim2"):
        rows = DeltaRsTable(str(root / "storage/tables" / table)).to_pyarrow_table().to_pylist()
        out[table] = sorted((tuple(sorted(r.items())) for r in rows), key=repr)
    return out


def test_sql_auto_cdc_matches_the_python_declaration(spark: Any, tmp_path: Path) -> None:
    sql_graph = _sql_graph(spark, tmp_path / "project")
    flow = sql_graph.flows["dim1_flow"]
    assert (flow.target, flow.source, flow.keys, flow.stored_as_scd_type) == (
        "dim1",
        "changes_src",
        ("id",),
        1,
    )
    assert sql_graph.flows["dim2"].column_list == ("id", "name", "seq")
    from_sql = _tables(spark, tmp_path / "sql", sql_graph)
    from_python = _tables(spark, tmp_path / "python", _python_graph())
    assert from_sql == from_python
    current = {dict(r)["id"]: dict(r)["name"] for r in from_sql["dim1"]}
    assert current == {1: "a3", 2: "b5", 4: "d1"}
    assert len(from_sql["dim2"]) == 8  # every version, closed ones included


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ("APPLY CHANGES INTO t FROM STREAM(s) SEQUENCE BY seq", "KEYS"),
        (
            "APPLY CHANGES INTO t FROM STREAM(s) KEYS (id) SEQUENCE BY a SYSTEM SEQUENCE BY b",
            "SYSTEM",
        ),
        ("APPLY CHANGES INTO t FROM STREAM(s) KEYS (id) SEQUENCE BY a STORED AS BITEMPORAL", "SCD"),
    ],
)
def test_bad_sql_auto_cdc_is_a_definition_error(statement: str, problem: str) -> None:
    with dp.collect(), pytest.raises(dp.DefinitionError) as caught:
        _loader._declare_sql(None, statement, _loader.SourceLocation("x.sql", 1), None)  # type: ignore[arg-type]
    assert problem in str(caught.value)
    assert caught.value.dataset == "t"
