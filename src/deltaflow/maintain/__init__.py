"""``deltaflow maintain``: a service that keeps the Delta tables under some roots healthy.

Per table and per its own properties: small files compacted (clustered tables
clustered incrementally), deletion vectors purged past a threshold, a checkpoint when one
is due, expired log entries deleted, VACUUM with the table's retention. Each decision is
logged with its reason and every commit it makes is marked in the table's history
(``operationParameters.auto`` and ``deltaflow.maintain`` in commitInfo). See
docs/sql.md, "Maintenance service". No Spark session is needed.
"""

from __future__ import annotations

from deltaflow.maintain._actions import MARKER_KEY, MaintainOptions
from deltaflow.maintain._discovery import find_tables
from deltaflow.maintain._service import (
    ActionReport,
    PassReport,
    maintain_table,
    run_pass,
    run_service,
)
from deltaflow.maintain.errors import MaintainError, MaintainRootError, MaintenanceFailedError

__all__ = [
    "MARKER_KEY",
    "ActionReport",
    "MaintainError",
    "MaintainOptions",
    "MaintainRootError",
    "MaintenanceFailedError",
    "PassReport",
    "find_tables",
    "maintain_table",
    "run_pass",
    "run_service",
]
