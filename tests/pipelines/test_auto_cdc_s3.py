"""AUTO CDC with the pipeline's storage on S3 (SeaweedFS, see ``tests/_object_store.py``):
the target and the sequence state live on the object store, late and out-of-order events
across updates resolve as on local disk, and a full refresh starts the state over."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from deltaflow import pipelines as dp
from tests.pipelines import test_auto_cdc as cases

pytestmark = pytest.mark.slow


def _rows(store: Any, uri: str) -> list[dict[str, Any]]:
    return DeltaTable(uri, storage_options=store.storage_options).to_pyarrow_table().to_pylist()


@pytest.mark.parametrize("scd", [1, 2])
def test_auto_cdc_with_storage_on_s3(
    spark: Any, object_store: Any, tmp_path: Path, scd: int
) -> None:
    source, storage = object_store.uri(f"changes{scd}"), object_store.uri(f"cdc{scd}")
    spark.createDataFrame(cases.FIRST, cases.CHANGES).write.format("delta").save(source)
    settings = dp.PipelineSettings(
        name="cdc",
        storage=storage,
        database=f"cdc_{uuid.uuid4().hex[:8]}",
        configuration={"pipelines.checkpointRoot": str(tmp_path / "checkpoints")},
    )
    graph = cases._graph(spark, source, scd)
    table = f"{storage}/tables/customers"
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"
    spark.createDataFrame(cases.SECOND, cases.CHANGES).write.format("delta").mode("append").save(
        source
    )
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"

    if scd == 1:
        latest = [(1, "a3"), (2, "b5"), (4, "d1")]  # a2 and c0 late: not applied
        assert sorted((r["id"], r["name"]) for r in _rows(object_store, table)) == latest
        state = f"{storage}/system/cdc/customers"
        assert DeltaTable.is_deltatable(state, storage_options=object_store.storage_options)
        # A full refresh replays every event from the start: the state on the store
        # must start over too, or every replayed event would be dropped as stale.
        report = dp.run_update(spark, graph, settings, full_refresh_all=True)
        assert report.state == "COMPLETED", report
        assert sorted((r["id"], r["name"]) for r in _rows(object_store, table)) == latest
        return
    versions = sorted(
        (r["id"], r["name"], r["__START_AT"], r["__END_AT"]) for r in _rows(object_store, table)
    )
    assert versions == cases.SCD2_AFTER_SECOND
