"""Private datasets (materialized, not left in the catalog) and the refused row_filter."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt


def test_private_table_is_materialized_and_read_but_not_left_in_the_catalog(
    spark: Any, tmp_path: Path
) -> None:
    with dp.collect() as declared:

        @dlt.table(private=True)
        def staged() -> Any:
            return spark.range(5)

        @dp.materialized_view
        def published() -> Any:
            return spark.read.table("staged").where("id >= 2")

    database = f"priv_{uuid.uuid4().hex[:8]}"
    settings = dp.PipelineSettings(name="priv", storage=str(tmp_path / "s"), database=database)
    for _ in range(2):  # a second update finds the private table's files and reuses them
        assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
        # Temporary views (other tests' too) are listed with any database's tables.
        names = {t.name for t in spark.catalog.listTables(database) if not t.isTemporary}
        assert names == {"published"}
    staged_rows = DeltaRsTable(str(tmp_path / "s/tables/staged")).to_pyarrow_table()
    assert sorted(staged_rows.column("id").to_pylist()) == [0, 1, 2, 3, 4]
    assert sorted(r["id"] for r in spark.read.table(f"{database}.published").collect()) == [2, 3, 4]


def test_row_filter_is_refused_with_the_alternative() -> None:
    with dp.collect(), pytest.raises(dp.DefinitionError) as caught:

        @dlt.table(row_filter="ROW FILTER region_filter ON (region)")
        def sales() -> Any:
            raise AssertionError("not called while declaring")

    assert caught.value.dataset == "sales"
    assert "filter" in str(caught.value).lower() and "view" in str(caught.value)
    with dp.collect(), pytest.raises(dp.DefinitionError):
        dp.create_streaming_table("t", row_filter="f ON (c)")
