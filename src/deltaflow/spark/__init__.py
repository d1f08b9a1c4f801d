"""The Spark layer: sessions, the ``delta`` data source and the DeltaTable API."""

from deltaflow.spark._scan_report import ScanReport, scan_reports
from deltaflow.spark._session import configure, register, session, spark_conf

__all__ = ["ScanReport", "configure", "register", "scan_reports", "session", "spark_conf"]
