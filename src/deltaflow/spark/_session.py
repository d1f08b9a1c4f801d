"""Spark sessions with the ``delta`` source registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Confs every deltaflow session needs; register() applies them to a user's session too.
REQUIRED_CONF = {
    # pushFilters is how file skipping learns a query's predicates.
    "spark.sql.python.filterPushdown.enabled": "true",
}

_LOCAL_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
}


def register(spark: SparkSession) -> SparkSession:
    """Register the ``delta`` data source on ``spark`` (a session you built yourself)."""
    from deltaflow.ingest._cloudfiles import CloudFilesDataSource
    from deltaflow.spark import _reader_compat, _writer_compat
    from deltaflow.spark._source import DeltaDataSource

    _reader_compat.install()
    _writer_compat.install()

    for key, value in REQUIRED_CONF.items():
        spark.conf.set(key, value)
    spark.dataSource.register(DeltaDataSource)
    spark.dataSource.register(CloudFilesDataSource)
    return spark


def session(
    app_name: str | None = None,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with the ``delta`` source registered and sensible local defaults.

    Python workers run this interpreter; shuffle partitions match the cores;
    logs are quiet; the session time zone is UTC (so timestamps, ``timestampAsOf``
    and partition values mean the same on every machine). ``conf`` overrides any
    default.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = os.cpu_count() or 2
    builder = SparkSession.builder.appName(app_name or "deltaflow").master(
        master or f"local[{cores}]"
    )
    log_config = os.path.join(os.path.dirname(__file__), "log4j2.properties")
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    settings = {
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        **_LOCAL_DEFAULTS,
        "spark.sql.shuffle.partitions": str(max(cores * 2, 2)),
        **REQUIRED_CONF,
    }
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return register(spark)
