"""The Spark layer: the ``delta`` data source, its JVM connector's brain and the DeltaTable API.

Subpackages: ``read`` (batch reads, scan reports, the change data feed), ``write``
(batch writes, ``replaceWhere``), ``stream`` (stream source and sink, progress), ``dml``
(``DeltaTable``: DELETE, UPDATE, MERGE, history), ``catalog`` (catalog tables, the table
builder) and ``bridge`` (the operations the JVM connector calls). Sessions are wired one
level up, in :mod:`deltaflow._session`, because they register ``ingest`` sources too.
"""

from deltaflow.spark.read._scan_report import ScanReport, scan_reports

__all__ = ["ScanReport", "scan_reports"]
