"""Run by test_pipelines_s3a.py as its own driver: a classic session with Hadoop's S3A on
its class path (which the test process's shared session lacks).

``python -m tests.pipelines._s3a_pipeline_job <source> <storage> <rows>``: the Spark
settings come from ``DELTAFLOW_JOB_CONF`` (JSON), the store's AWS variables from the
environment. It appends ``rows`` (JSON rows of ``test_pipelines_s3.SCHEMA``) to the Delta
table ``source``, runs one update of ``test_pipelines_s3.declare``'s pipeline stored at
``storage`` without ``pipelines.checkpointRoot``, and prints one ``RESULT <json>`` line.
"""

from __future__ import annotations

import json
import os
import sys

import deltaflow
from deltaflow import pipelines as dp
from tests.pipelines.test_pipelines_s3 import declare, land


def main(source: str, storage: str, rows: list[list[object]]) -> None:
    conf = json.loads(os.environ["DELTAFLOW_JOB_CONF"])
    spark = deltaflow.session(app_name="s3a-pipeline", master="local[1]", conf=conf)
    land(spark, source, [tuple(r) for r in rows])
    settings = dp.PipelineSettings(name="shop", storage=storage, database="shop")
    report = dp.run_update(spark, declare(spark, source), settings)
    result = {
        "state": report.state,
        "rows": {name: flow.rows_written for name, flow in report.flows.items()},
    }
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
