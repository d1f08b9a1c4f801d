"""Run by test_pipeline_chaos.py: one triggered update of a four-dataset pipeline.

``<landing> <storage> <database>``: bronze (JSON files, one per micro-batch), silver (an
expect_or_drop rule, so the Delta sink under the flow's identity), latest (AUTO CDC SCD 1 from
silver: the newest event per key) and counts (a materialized view over silver). Prints
``EVENT <flow> <status>`` as flows progress and ``UPDATE <state>`` at the end.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import deltaflow
from deltaflow import pipelines as dp

SCHEMA = "event_id BIGINT, key BIGINT, value BIGINT"
VALID = "value % 3 <> 0"


def graph(spark: Any, landing: str) -> dp.Graph:
    with dp.collect() as declared:

        @dp.table
        def bronze() -> Any:
            return spark.readStream.option("maxFilesPerTrigger", 1).schema(SCHEMA).json(landing)

        @dp.table
        @dp.expect_or_drop("valid", VALID)
        def silver() -> Any:
            return spark.readStream.table("bronze")

        dp.create_streaming_table("latest")
        dp.create_auto_cdc_flow(
            target="latest", source="silver", keys=["key"], sequence_by="event_id"
        )

        @dp.materialized_view
        def counts() -> Any:
            return spark.read.table("silver").groupBy("key").count()

    return declared.graph()


def main(landing: str, storage: str, database: str) -> None:
    spark = deltaflow.session(app_name=f"pipeline-chaos-{uuid.uuid4().hex[:6]}")
    settings = dp.PipelineSettings(
        name="chaos",
        storage=storage,
        database=database,
        configuration={"pipelines.maxConcurrentFlows": "2"},
        development=True,
    )

    def show(event: dict[str, Any]) -> None:
        if event["event_type"] == "flow_progress":
            status = event["details"].split('"status": "')[1].split('"')[0]
            print(f"EVENT {event['origin']['flow_name']} {status}", flush=True)

    report = dp.run_update(spark, graph(spark, landing), settings, on_event=show)
    print(f"UPDATE {report.state}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
