"""Per-flow spark_conf: applied to that flow's queries only, parallel flows isolated."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt

# A key Spark does not know is taken, as spark.conf.set takes it.
TOKYO = {"spark.sql.session.timeZone": "Asia/Tokyo", "shop.custom.setting": "x"}
# One instant, rendered in the session's time zone when cast to a string.
AS_TEXT = "SELECT CAST(TIMESTAMP '2024-01-01 00:00:00 UTC' AS STRING) AS shown"


def _settings(tmp_path: Path) -> dp.PipelineSettings:
    return dp.PipelineSettings(
        name="conf",
        storage=str(tmp_path / "storage"),
        database=f"conf_{uuid.uuid4().hex[:8]}",
        configuration={"pipelines.maxConcurrentFlows": "3"},
    )


def _shown(tmp_path: Path, table: str) -> list[str]:
    rows = DeltaRsTable(str(tmp_path / "storage/tables" / table)).to_pyarrow_table().to_pylist()
    return sorted(r["shown"] for r in rows)


def test_spark_conf_applies_to_its_flow_only(spark: Any, tmp_path: Path) -> None:
    source = str(tmp_path / "source")
    spark.sql("SELECT TIMESTAMP '2024-01-01 00:00:00 UTC' AS ts").write.format("delta").save(source)
    with dp.collect() as declared:

        @dp.materialized_view(spark_conf=TOKYO)
        def in_tokyo() -> Any:
            return spark.sql(AS_TEXT)

        @dp.materialized_view
        def as_session() -> Any:
            return spark.sql(AS_TEXT)

        dp.create_streaming_table("streamed")

        @dp.append_flow(target="streamed", spark_conf=TOKYO)
        def tokyo_stream() -> Any:
            return (
                spark.readStream.format("delta")
                .load(source)
                .selectExpr("CAST(ts AS STRING) AS shown")
            )

    zone_before = spark.conf.get("spark.sql.session.timeZone")
    expected_here = spark.sql(AS_TEXT).collect()[0]["shown"]
    report = dp.run_update(spark, declared.graph(), _settings(tmp_path))
    assert report.state == "COMPLETED", report
    assert _shown(tmp_path, "in_tokyo") == ["2024-01-01 09:00:00"]
    assert _shown(tmp_path, "streamed") == ["2024-01-01 09:00:00"]
    assert _shown(tmp_path, "as_session") == [expected_here]
    assert spark.conf.get("spark.sql.session.timeZone") == zone_before


def test_static_spark_conf_is_refused_by_the_dry_run(spark: Any, tmp_path: Path) -> None:
    with dp.collect() as declared:

        @dlt.table(spark_conf={"spark.sql.extensions": "x.Y"})
        def fixed() -> Any:
            return spark.range(1)

    with pytest.raises(dp.GraphValidationError) as caught:
        dp.dry_run(spark, declared.graph(), _settings(tmp_path))
    assert caught.value.problem == "bad_spark_conf"
    assert caught.value.flow == "fixed"
    assert "spark.sql.extensions" in str(caught.value)
