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


def test_demo_on_s3_with_s3a_keeps_checkpoints_and_landing_on_the_store(tmp_path) -> None:
    """`make demo STORAGE=s3` with Hadoop's S3A jars (as a cluster with hadoop-aws has them):
    the stream checkpoints, the landing zone and the declared pipeline's checkpoints go to
    the object store too (issue 29 part 4). Its own process: the jars must be on the JVM's
    class path when it starts, and its own S3 gateway, which it stops at the end."""
    import subprocess
    import sys
    from pathlib import Path

    from tests import _s3a
    from tests._standalone import driver_environment

    jars = _s3a.s3a_jars_or_skip()
    data_dir = tmp_path / "demo"
    root = Path(__file__).resolve().parents[1]
    argv = [
        *("--data-dir", str(data_dir), "--storage", "s3", "--s3a-jars", ",".join(jars)),
        *("--commits", "2", "--events-per-commit", "20000", "--live-seconds", "30"),
    ]
    done = subprocess.run(
        [sys.executable, str(root / "demo" / "main_job.py"), *argv],
        env=driver_environment({}, {}),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "with Hadoop's S3A (" in out
    assert "OK: the streams' checkpoints are on the object store" in out
    assert _object_store.SECRET_KEY not in out + done.stderr
    for verdict in (
        "OK: every acknowledged event is in bronze exactly once",
        "OK: gold equals silver's counts in every closed minute",
        "OK: the change feed shows exactly the devices the second round changed or added",
    ):
        assert verdict in out
    # On local disk only Auto Loader's schema location (SQLite) is left of the streams.
    assert sorted(p.name for p in (data_dir / "checkpoints").iterdir()) == ["landing_schema"]
    for gone in ("landing", "pipeline-checkpoints", "bronze", "pipeline"):
        assert not (data_dir / gone).exists(), gone
