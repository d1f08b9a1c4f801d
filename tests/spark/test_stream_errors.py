"""What a user sees when a Delta stream fails: deltaflow's typed message on the first line
of ``query.exception()`` and of what ``awaitTermination()`` raises, and wrong settings
refused by ``start()`` itself, before any batch runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow.errors import DeltaflowError, InvalidOptionError
from deltaflow.spark.errors import ChangeCommitError
from deltaflow.spark.write._native import NATIVE_WRITE_CONF
from deltaflow.table.errors import SchemaMismatchError, TableNotFoundError

# Spark's own prefix for any failed stream; deltaflow's message follows on that line.
_STREAM_FAILED = "[STREAM_FAILED] Query [id = "


def append(path: str, ids: list[int]) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})
    write_deltalake(path, data, mode="append")


def start(spark: Any, source: str, target: str, checkpoint: str, **options: str) -> Any:
    return (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .options(**options)
        .trigger(availableNow=True)
        .start(target)
    )


def failure(query: Any) -> tuple[BaseException, BaseException]:
    """What ``awaitTermination()`` raised, and ``query.exception()``."""
    with pytest.raises(Exception) as caught:
        query.awaitTermination(180)
    exception = query.exception()
    assert exception is not None
    return caught.value, exception


def assert_leads_with(
    raised: BaseException, exception: BaseException, error: DeltaflowError
) -> None:
    """Both texts start with the error's own message (after Spark's stream prefix for the
    raised one), and neither first line carries the wire marker."""
    first = str(exception).splitlines()[0]
    assert first == error.message
    raised_first = str(raised).splitlines()[0]
    assert raised_first.startswith(_STREAM_FAILED), raised_first
    assert raised_first.endswith(f"terminated with exception: {error.message}"), raised_first
    assert "deltaflow-error" not in first + raised_first


@pytest.fixture(params=["jvm", "python"])
def sink_kind(request: Any, spark: Any) -> Any:
    if request.param == "python":
        spark.conf.set(NATIVE_WRITE_CONF, "false")
    yield request.param
    spark.conf.unset(NATIVE_WRITE_CONF)


def test_schema_mismatch_leads_the_query_error(spark, table_path, sink_kind) -> None:
    source, target = table_path("src"), table_path("dst")
    append(source, [1, 2])
    write_deltalake(target, pa.table({"id": pa.array([1], pa.int64()), "x": [1.0]}))

    raised, exception = failure(start(spark, source, target, table_path("ck")))

    error = deltaflow.typed_error(exception)
    assert isinstance(error, SchemaMismatchError)
    assert error.table_uri == "file://" + str(Path(target).resolve())
    assert "mergeSchema" in error.message
    assert isinstance(deltaflow.typed_error(raised), SchemaMismatchError)
    assert_leads_with(raised, exception, error)


def test_change_commit_upstream_leads_the_query_error(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    start(spark, source, target, checkpoint).awaitTermination(180)
    DeltaTable(source).delete("id = 1")

    raised, exception = failure(start(spark, source, target, checkpoint))

    error = deltaflow.typed_error(raised)
    assert isinstance(error, ChangeCommitError) and error.version == 1
    assert_leads_with(raised, exception, error)


def test_deleted_source_fails_the_query_typed(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .start(target)
    )
    try:
        query.processAllAvailable()
        shutil.rmtree(source)
        # Before, the query waited for commits of a table that no longer exists.
        raised, exception = failure(query)
    finally:
        query.stop()

    error = deltaflow.typed_error(exception)
    assert isinstance(error, TableNotFoundError)
    assert error.table_uri == "file://" + str(Path(source).resolve())
    assert_leads_with(raised, exception, error)


# ---- wrong settings fail at start() ---------------------------------------------------


def start_with(spark: Any, source: str, target: str, *, checkpoint: str | None, **kw: Any) -> Any:
    writer = spark.readStream.format("delta").load(source).writeStream.format("delta")
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", checkpoint)
    return writer.trigger(availableNow=True).start(target, **kw)


@pytest.mark.parametrize(
    ("settings", "option"),
    [
        ({"mergeSchema": "maybe"}, "mergeSchema"),
        ({"mergeSchemaa": "true"}, "mergeschemaa"),
        ({"txnAppId": "app", "txnVersion": "abc"}, "txnAppId"),
        ({"txnVersion": "3"}, "txnVersion"),
    ],
)
def test_wrong_sink_settings_fail_at_start(spark, table_path, settings, option) -> None:
    source, target = table_path("src"), table_path("dst")
    append(source, [1])
    with pytest.raises(InvalidOptionError) as caught:
        start_with(spark, source, target, checkpoint=table_path("ck"), **settings)
    assert caught.value.option == option
    assert spark.streams.active == []
    assert not Path(target).exists()


def test_missing_checkpoint_location_fails_at_start(spark, table_path) -> None:
    source, target = table_path("src"), table_path("dst")
    append(source, [1])
    assert spark.conf.get("spark.sql.streaming.checkpointLocation", None) is None
    with pytest.raises(InvalidOptionError) as caught:
        start_with(spark, source, target, checkpoint=None)
    assert caught.value.option == "checkpointLocation"
    assert "spark.sql.streaming.checkpointLocation" in str(caught.value)
    assert spark.streams.active == []


def test_sink_refuses_a_directory_of_other_data_at_start(spark, table_path) -> None:
    source, target = table_path("src"), table_path("dst")
    append(source, [1])
    Path(target).mkdir()
    (Path(target) / "events.csv").write_text("a,b\n")
    with pytest.raises(InvalidOptionError, match=r"events\.csv") as caught:
        start_with(spark, source, target, checkpoint=table_path("ck"))
    assert caught.value.option == "path"
    assert not (Path(target) / "_delta_log").exists()

    # Hidden entries are not data: a staging leftover or a checkpoint kept in the table's
    # directory does not stop a first start.
    empty = table_path("empty")
    (Path(empty) / "_checkpoint").mkdir(parents=True)
    (Path(empty) / "_delta_staging" / "0a1b-x").mkdir(parents=True)
    start_with(spark, source, empty, checkpoint=str(Path(empty) / "_checkpoint")).awaitTermination(
        180
    )
    assert DeltaTable(empty).to_pyarrow_table().column("id").to_pylist() == [1]


def test_stream_killed_before_its_first_commit_restarts_over_its_own_files(
    spark, table_path
) -> None:
    """The state a kill between the first batch's file writes and its commit leaves:
    data files in the sink's directory, no _delta_log, the batch planned in the
    checkpoint (offsets/0) but not committed (no commits/0). The restart owns the files."""
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    start_with(spark, source, target, checkpoint=checkpoint).awaitTermination(180)
    shutil.rmtree(Path(target) / "_delta_log")
    for name in ("0", ".0.crc"):  # Hadoop's checksum file goes with it
        (Path(checkpoint) / "commits" / name).unlink(missing_ok=True)
    leftovers = sorted(p.name for p in Path(target).glob("*.parquet"))
    assert leftovers

    start_with(spark, source, target, checkpoint=checkpoint).awaitTermination(180)
    table = DeltaTable(target)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2]
    # The first attempt's files are not part of the table (VACUUM removes them later).
    assert not set(leftovers) & {Path(f).name for f in table.file_uris()}


def test_sink_refuses_a_file_at_start(spark, table_path) -> None:
    source, target = table_path("src"), table_path("file")
    append(source, [1])
    Path(target).write_text("x")
    with pytest.raises(InvalidOptionError, match="is a file") as caught:
        start_with(spark, source, target, checkpoint=table_path("ck"))
    assert caught.value.option == "path"
