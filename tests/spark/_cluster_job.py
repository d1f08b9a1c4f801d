"""Run by test_cluster.py in a child process: reads and writes on local-cluster.

Executors are separate JVMs with their own Python workers, so nothing may rely
on driver-local state. Prints one JSON line with what it observed.
"""

from __future__ import annotations

import json
import os
import sys

import deltaflow


def main(path: str) -> None:
    spark = deltaflow.session(
        app_name="deltaflow-cluster-test",
        master="local-cluster[2,1,1024]",
        conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "4"},
    )
    try:
        from pyspark.sql import functions as F

        df = spark.range(0, 20000, numPartitions=4).select(
            F.col("id"),
            (F.col("id") % 5).cast("string").alias("bucket"),
            (F.col("id") * 0.5).alias("v"),
        )
        df.write.format("delta").partitionBy("bucket").save(path)
        df.where("id < 100").write.format("delta").mode("append").save(path)
        back = spark.read.format("delta").load(path)
        executor_pids = back.rdd.mapPartitions(lambda _: [os.getpid()]).distinct().collect()
        result = {
            "count": back.count(),
            "sum": back.agg(F.sum("id")).first()[0],
            "bucket_2": back.where("bucket = '2'").count(),
            "executor_pids": executor_pids,
            "driver_pid": os.getpid(),
            # Block managers: the driver's plus one per executor JVM.
            "block_managers": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size(),
        }
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
