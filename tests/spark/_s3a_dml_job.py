"""Run by test_s3a_driver_dml.py: a classic Spark driver with S3A on its class path
(``DELTAFLOW_JOB_CONF``, see ``tests/_s3a.py``) MERGEs into an ``s3a://`` table through the
Python API, the route that plans its scan and rewrite in this driver Python (not the brain),
and prints one ``RESULT <json>`` line: whether this process routes ``s3a://`` to the JVM, and
S3A's own request counts (its IOStatistics) during the MERGE.
"""

from __future__ import annotations

import json
import os
import sys

import deltaflow
from deltaflow.spark.read import _native

COUNTERS = ("object_put_request", "action_http_get_request", "object_list_request")


def s3a_counts(spark, uri: str) -> dict[str, int]:
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(
        jvm.java.net.URI(uri), spark._jsc.hadoopConfiguration()
    )
    counters = fs.getIOStatistics().counters()
    return {k: int(counters.get(k) or 0) for k in COUNTERS}


def main(uri: str) -> None:
    conf = {
        "spark.sql.shuffle.partitions": "1",
        # The MERGE as Spark jobs (the delta-rs route would read and write through delta-rs).
        "spark.deltaflow.merge.nativeMaxSourceRows": "0",
        **json.loads(os.environ.get("DELTAFLOW_JOB_CONF", "{}")),
    }
    spark = deltaflow.session(app_name="s3a-dml", master="local[1]", conf=conf)
    spark.range(100).selectExpr("id", "id * 2 AS v").write.format("delta").save(uri)
    before = s3a_counts(spark, uri)
    changes = spark.range(90, 110).selectExpr("id", "-1 AS v")
    table = deltaflow.DeltaTable.forPath(spark, uri)
    (
        table.alias("t")
        .merge(changes.alias("c"), "t.id = c.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    after = s3a_counts(spark, uri)
    rows = spark.read.format("delta").load(uri).where("v = -1").count()
    result = {
        "opens": _native.hadoop_opens(uri),
        "merge_requests": {k: after[k] - before[k] for k in COUNTERS},
        "updated_or_inserted": rows,
    }
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
