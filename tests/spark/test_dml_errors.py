"""A user's mistake in MERGE / UPDATE / DELETE is reported in the user's terms: Spark's
"did you mean" list and plan name the table's and the source's columns, never the
helper columns deltaflow's DML plans add (file keys, row ids, marks, ``_metadata``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow import DeltaTable
from deltaflow.spark.dml import _merge_rows, _target_scan

INTERNAL = (
    _target_scan.FILE_INDEX,
    _merge_rows.ROW_ID,
    _merge_rows.TARGET_MARK,
    _merge_rows.SOURCE_MARK,
    _merge_rows.ACTION,
    _merge_rows.SOURCE_ID,
    _merge_rows.MATCHED_ID,
    _merge_rows.RANK,
    "__deltaflow",
    "_metadata",
)


@pytest.fixture
def table(spark: Any, table_path: Any) -> tuple[str, Any]:
    path = table_path("t")
    write_deltalake(path, pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
    return path, DeltaTable.forPath(spark, path)


def assert_user_terms(error: BaseException, *expected: str) -> None:
    text = str(error)
    leaked = [name for name in INTERNAL if name in text]
    assert not leaked, text
    for name in expected:
        assert name in text, text


def test_merge_misspelt_columns_name_only_user_columns(spark, table) -> None:
    path, target = table
    source = spark.createDataFrame([(1, "x"), (4, "y")], "id long, v string").alias("s")
    version = RsTable(path).version()
    attempts = [
        lambda: target.alias("t").merge(source, "t.id = s.idd").whenMatchedUpdateAll(),
        lambda: (
            target.alias("t")
            .merge(source, "t.id = s.id")
            .whenMatchedUpdate(condition="t.zz > 1", set={"v": "s.v"})
        ),
        lambda: target.alias("t").merge(source, "t.id = s.id").whenMatchedUpdate(set={"v": "s.vv"}),
        lambda: (
            target.alias("t")
            .merge(source, "t.id = s.id")
            .whenNotMatchedInsert(values={"id": "s.id", "v": "nope"})
        ),
    ]
    for attempt in attempts:
        with pytest.raises(Exception, match="UNRESOLVED_COLUMN") as caught:
            attempt().execute()
        assert_user_terms(caught.value, "`id`", "`v`")
    with pytest.raises(Exception, match="AMBIGUOUS_REFERENCE") as caught:
        target.alias("t").merge(source, "id = id").whenMatchedUpdateAll().execute()
    assert_user_terms(caught.value, "`s`.`id`", "`t`.`id`")
    assert RsTable(path).version() == version


def test_update_and_delete_misspelt_columns_name_only_user_columns(spark, table) -> None:
    path, target = table
    version = RsTable(path).version()
    for attempt in (
        lambda: target.delete("idd = 1"),
        lambda: target.update("idd = 1", {"v": "'z'"}),
        lambda: target.update("id = 1", {"v": "vv"}),
    ):
        with pytest.raises(Exception, match="UNRESOLVED_COLUMN") as caught:
            attempt()
        assert_user_terms(caught.value, "`id`", "`v`")
    assert RsTable(path).version() == version


def test_column_objects_are_checked_in_user_terms_too(spark, table) -> None:
    from pyspark.sql import functions as F

    path, target = table
    target.update(F.col("id") == 1, {"v": F.lit("z")})
    target.delete(F.col("id") == 2)
    assert RsTable(path).to_pyarrow_table().sort_by("id").to_pylist() == [
        {"id": 1, "v": "z"},
        {"id": 3, "v": "c"},
    ]
    # A Column bound to another DataFrame of the table cannot be resolved in the scan's
    # plan (its attributes are not the scan's); the error still names only user columns.
    with pytest.raises(Exception, match="MISSING_ATTRIBUTES") as caught:
        target.delete(target.toDF()["id"] == 1)
    assert_user_terms(caught.value, '"v"')
    source = spark.createDataFrame([(3, "x")], "id long, v string").alias("s")
    target.alias("t").merge(source, F.col("t.id") == source["id"]).whenMatchedUpdateAll().execute()
    assert RsTable(path).to_pyarrow_table().sort_by("id").column("v").to_pylist() == ["z", "x"]
