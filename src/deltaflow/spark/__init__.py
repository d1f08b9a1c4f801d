"""The Spark layer: sessions, the ``delta`` data source and the DeltaTable API."""

from deltaflow.spark._scan_report import ScanReport, scan_reports
from deltaflow.spark._session import register, session

__all__ = ["ScanReport", "register", "scan_reports", "session"]
