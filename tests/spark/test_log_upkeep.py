"""Log upkeep through the Spark stream sink (issue 14): one commit per micro-batch, a
checkpoint every ``delta.checkpointInterval`` of them, as delta-spark writes."""

from __future__ import annotations

import json
import os

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from tests._waiting import wait_until


def test_stream_sink_checkpoints_at_the_tables_interval(spark, table_path, tmp_path) -> None:
    source, target = table_path("source"), table_path("target")
    for b in range(11):
        write_deltalake(source, pa.table({"id": pa.array([b], pa.int64())}), mode="append")
    # One commit per micro-batch: the stream's default auto compaction kept off.
    spark.createDataFrame([], "id bigint").write.format("delta").option(
        "delta.checkpointInterval", "5"
    ).option("delta.autoOptimize.autoCompact", "false").save(target)  # version 0
    query = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", "1")
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(target)
    )
    assert query.awaitTermination(600)
    assert query.exception() is None

    log = os.path.join(target, "_delta_log")
    table = DeltaTable(target)
    assert table.version() == 11  # one commit per micro-batch

    def checkpoints() -> list[int]:
        names = os.listdir(log)
        return sorted(int(n[:20]) for n in names if n.endswith(".checkpoint.parquet"))

    # The brain checkpoints off the commit path (a background worker that coalesces a
    # backlog to its newest due version): the one at 10 follows the commit shortly.
    wait_until(lambda: 10 in checkpoints(), 60, "the checkpoint at version 10")
    assert set(checkpoints()) <= {5, 10}
    with open(os.path.join(log, "_last_checkpoint")) as f:
        assert json.load(f)["version"] == 10
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(11))
    assert spark.read.format("delta").load(target).count() == 11
