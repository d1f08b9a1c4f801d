"""`make demo STORAGE=s3`: the demo's tables on a real S3 server (SeaweedFS), not on disk."""

from __future__ import annotations

import deltalake
import pytest
from demo import main_job

from tests import _object_store

pytestmark = pytest.mark.slow


def test_demo_puts_its_tables_on_the_object_store(spark, object_store, tmp_path, capsys):
    data_dir = tmp_path / "demo"
    argv = [
        "--data-dir",
        str(data_dir),
        "--storage",
        "s3",
        "--commits",
        "2",
        "--events-per-commit",
        "20000",
        # As in test_demo: enough event time for gold's first minute to close.
        "--live-seconds",
        "30",
    ]

    assert main_job.main(argv, spark=spark, object_store=object_store) == 0

    out = capsys.readouterr().out
    root = f"s3://{object_store.bucket}/{main_job.S3_PREFIX}"
    assert f"tables under {root}/" in out
    assert "no hadoop-aws" in out
    assert _object_store.SECRET_KEY not in out
    for verdict in (
        "OK: both agree",
        "OK: every acknowledged event is in bronze exactly once",
        "OK: gold equals silver's counts in every closed minute",
        "OK: the change feed shows exactly the devices the second round changed or added",
    ):
        assert verdict in out

    options = object_store.storage_options
    backfill = deltalake.DeltaTable(f"{root}/bronze/device_events", storage_options=options)
    assert backfill.to_pyarrow_dataset().count_rows() == 40_000
    assert backfill.version() == 1
    live = {
        name: deltalake.DeltaTable(f"{root}/{name}", storage_options=options)
        for name in ("bronze/live_events", "silver/events", "gold/events_per_minute")
    }
    assert all(table.to_pyarrow_dataset().count_rows() > 0 for table in live.values())
    registry = deltalake.DeltaTable(f"{root}/dims/device_registry", storage_options=options)
    assert registry.version() >= 2
    # The declared pipeline's tables and event log are on the store too.
    silver = deltalake.DeltaTable(f"{root}/pipeline/tables/silver_events", storage_options=options)
    assert silver.to_pyarrow_dataset().count_rows() > 0
    events = deltalake.DeltaTable(f"{root}/pipeline/system/events", storage_options=options)
    assert events.to_pyarrow_dataset().count_rows() > 0
    # Nothing of those tables on local disk; the checkpoints are there.
    for local in ("bronze", "silver", "gold", "dims", "pipeline"):
        assert not (data_dir / local).exists()
    assert any((data_dir / "pipeline-checkpoints").iterdir())
    assert (data_dir / "checkpoints" / "gold").is_dir()
