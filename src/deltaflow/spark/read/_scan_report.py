"""Scan reports: how many files a Delta read planned, visible from the driver.

Spark plans a Python data source read in a short-lived Python worker, so the
planner's state (which files were skipped, and why) never reaches the driver's
Python objects. The report travels through Spark's Python worker logs instead
(Spark 4.1+): the planner logs one record per scan on the ``deltaflow.scan``
logger with the report's fields in the record's ``context``, and
:func:`scan_reports` reads them back with ``spark.tvf.python_worker_logs()``.

Why logs and not an accumulator, a side file or a metric: the Python Data
Source API offers the planner no channel back to the driver, side files would
need a location every process can write, and custom metrics are JVM-only. Logs
need no storage of their own and show up in the same place as everything else
a user's Python code logs. The price is one session setting::

    spark.conf.set("spark.sql.pyspark.worker.logging.enabled", "true")

Without it, planning still logs the report on ``deltaflow.scan`` at INFO for
whatever logging the worker process has, and :func:`scan_reports` raises
``InvalidOptionError`` saying which setting to turn on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOGGER_NAME = "deltaflow.scan"
WORKER_LOGGING_CONF = "spark.sql.pyspark.worker.logging.enabled"
# Spark sets this in a Python worker's environment exactly when it collects the
# worker's logs for python_worker_logs() (pyspark.logger.worker_io.capture_outputs).
_CAPTURE_ENV = "PYSPARK_SPARK_SESSION_UUID"

log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class ScanReport:
    """What a scan planned: how many files it reads out of the snapshot's."""

    table_uri: str
    version: int
    files_in_snapshot: int
    files_scanned: int
    skipped_by_partition: int
    skipped_by_stats: int
    bytes_scanned: int

    def to_context(self) -> dict[str, str]:
        """The report as the string map a worker log record's ``context`` holds."""
        return {key: str(value) for key, value in asdict(self).items()}

    @staticmethod
    def from_context(context: dict[str, Any]) -> ScanReport:
        values: dict[str, Any] = {}
        for f in fields(ScanReport):
            raw = context[f.name]
            values[f.name] = raw if f.name == "table_uri" else int(raw)
        return ScanReport(**values)


def emit(report: ScanReport) -> None:
    """Log ``report`` from the planner so that :func:`scan_reports` can find it."""
    message = "deltaflow scan of %s v%d: %d of %d files (skipped %d by partition, %d by stats)"
    args = (
        report.table_uri,
        report.version,
        report.files_scanned,
        report.files_in_snapshot,
        report.skipped_by_partition,
        report.skipped_by_stats,
    )
    extra = {"context": report.to_context()}
    if _CAPTURE_ENV not in os.environ:
        log.info(message, *args, extra=extra)
        return
    with _captured():
        # The user asked Spark to collect worker logs; a root logger left at its
        # WARNING default would drop the report, so only an explicit level set
        # on deltaflow.scan itself can silence it.
        if log.level == logging.NOTSET or log.isEnabledFor(logging.INFO):
            record = log.makeRecord(
                log.name, logging.INFO, __file__, 0, message, args, None, extra=extra
            )
            log.handle(record)


@contextlib.contextmanager
def _captured() -> Iterator[None]:
    """Route records to Spark's worker-log capture, opening it if Spark did not.

    Spark opens the capture around ``pushFilters`` and ``partitions()`` when a
    query has filters, but calls ``partitions()`` outside it when there are
    none (pyspark.sql.worker.plan_data_source_read); without this, unfiltered
    scans would be missing from the reports.
    """
    try:
        from pyspark.logger.worker_io import JSONFormatterWithMarker, capture_outputs
    except ImportError:  # pyspark before 4.1: no worker-log capture at all
        yield
        return
    if any(isinstance(h.formatter, JSONFormatterWithMarker) for h in logging.getLogger().handlers):
        yield
        return
    with capture_outputs():
        yield


def scan_reports(spark: SparkSession, table_uri: str | None = None) -> list[ScanReport]:
    """The scan reports of this session's Delta reads, oldest first.

    Scans by the connector (the JVM) are always reported. Scans by the Python data
    source (object stores, change feeds, ``deltaflow.read.nativeScan=false``) are
    reported through Spark's Python worker logs, which need
    ``spark.sql.pyspark.worker.logging.enabled=true`` before the queries run.
    ``table_uri`` (a path or URI) keeps only that table's scans. A report counts files
    after partition pruning and stats skipping; Spark still filters the rows of every
    file read.
    """
    from deltaflow.table import _uri

    timed = jvm_scan_reports(spark)
    if (spark.conf.get(WORKER_LOGGING_CONF, "false") or "").lower() == "true":
        timed.extend(_worker_scan_reports(spark))
    reports = [report for _, report in sorted(timed, key=lambda pair: pair[0])]
    if table_uri is not None:
        wanted = _uri.normalize_uri(table_uri)
        reports = [r for r in reports if r.table_uri == wanted]
    return reports


def jvm_scan_reports(spark: SparkSession) -> list[tuple[float, ScanReport]]:
    """(epoch seconds, report) of the connector's scans kept in the driver JVM."""
    try:
        text = spark._jvm.io.deltaflow.spark.ScanReports.json()  # type: ignore[attr-defined]
    except Exception:  # Spark Connect, or a session without the connector
        return []
    names = [f.name for f in fields(ScanReport)]
    return [
        (float(item.get("ts", 0)) / 1000, ScanReport(**{n: item[n] for n in names}))
        for item in json.loads(text)
    ]


def _worker_scan_reports(spark: SparkSession) -> list[tuple[float, ScanReport]]:
    from pyspark.sql import functions as sf

    logs = spark.tvf.python_worker_logs().where(sf.col("logger") == LOGGER_NAME)
    rows = logs.orderBy("ts").select("ts", "context").collect()
    return [(row["ts"].timestamp(), ScanReport.from_context(row["context"])) for row in rows]
