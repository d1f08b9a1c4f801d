"""Run by test_sql_server.py: a stream appending to a Delta table until it is killed.

A rate source, one row per 200 ms, into partition ``src = 'stream'`` of the table at
``path``, a micro-batch every second.
"""

from __future__ import annotations

import sys

import deltaflow


def main(path: str, checkpoint: str) -> None:
    spark = deltaflow.session(app_name="stream-writer", master="local[1]")
    rows = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 5)
        .load()
        .selectExpr("value AS id", "'s' AS v", "'stream' AS src")
    )
    query = (
        rows.writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start(path)
    )
    print("STARTED", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
