"""Helpers for testing your own deltaflow pipelines.

Deterministic, vectorised event generators that hand out Arrow tables, and a helper to
turn them into Spark DataFrames::

    from deltaflow.testing import DeviceEventGenerator, to_spark

    gen = DeviceEventGenerator(seed=42, devices=500)
    df = to_spark(spark, gen.batch(10_000))
    df.write.format("delta").mode("append").save(path)

Importing this module starts nothing and touches no storage; pyspark is imported only
when you call a helper that needs it.
"""

from deltaflow.testing._events import (
    DEVICE_EVENT_DDL,
    DEVICE_EVENT_SCHEMA,
    EVENT_TYPE_WEIGHTS,
    EVENT_TYPES,
    DeviceEventGenerator,
    to_spark,
)
from deltaflow.testing._states import STATE_BOXES, STATES, StateBox

__all__ = [
    "DEVICE_EVENT_DDL",
    "DEVICE_EVENT_SCHEMA",
    "EVENT_TYPES",
    "EVENT_TYPE_WEIGHTS",
    "STATES",
    "STATE_BOXES",
    "DeviceEventGenerator",
    "StateBox",
    "to_spark",
]
