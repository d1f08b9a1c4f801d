"""Run by test_cloudfiles_chaos.py: the landing-zone stream that gets killed.

``<landing> <schema_location> <checkpoint> <target> <loop|once>`` runs
``readStream.format("cloudFiles")`` (NDJSON, a given schema, a few files per trigger) into
``writeStream.format("delta")``. ``loop`` triggers every 200 ms until killed and prints
``PROGRESS <batchId> <rows>`` whenever a batch finishes; ``once`` drains the landing zone
with availableNow (larger batches, as a catch-up job would) and prints DONE.
"""

from __future__ import annotations

import sys
from typing import Any

import deltaflow

SCHEMA = "id BIGINT, file BIGINT, payload STRING, _rescued_data STRING"
MAX_FILES_PER_TRIGGER = 3  # small batches: more of them, so more kills land mid-batch
CATCH_UP_FILES_PER_TRIGGER = 200


def run(landing: str, schemas: str, checkpoint: str, target: str, mode: str) -> None:
    spark = deltaflow.session(
        app_name="chaos-cloudfiles",
        master="local[1]",
        conf={"spark.sql.shuffle.partitions": "1", "spark.ui.enabled": "false"},
    )
    per_trigger = CATCH_UP_FILES_PER_TRIGGER if mode == "once" else MAX_FILES_PER_TRIGGER
    frame = (
        spark.readStream.format("cloudFiles")
        .option("cloudFiles.format", "json")
        .option("cloudFiles.schemaLocation", schemas)
        .option("cloudFiles.maxFilesPerTrigger", str(per_trigger))
        .schema(SCHEMA)
        .load(landing)
    )
    writer = frame.writeStream.format("delta").option("checkpointLocation", checkpoint)
    if mode == "once":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="200 milliseconds")
    query = writer.start(target)
    print("STARTED", flush=True)
    if mode == "once":
        query.awaitTermination()
        if query.exception() is not None:
            print(f"FAILED {query.exception()}", flush=True)
            sys.exit(1)
        print("DONE", flush=True)
        spark.stop()
        return
    seen = None
    while True:  # killed by the test
        if query.exception() is not None:
            print(f"FAILED {query.exception()}", flush=True)
            sys.exit(1)
        progress: Any = query.lastProgress
        if progress and progress["batchId"] != seen:
            seen = progress["batchId"]
            print(f"PROGRESS {seen} {progress['numInputRows']}", flush=True)
        query.awaitTermination(0.05)  # wakes at once when the query fails


if __name__ == "__main__":
    run(*sys.argv[1:6])
