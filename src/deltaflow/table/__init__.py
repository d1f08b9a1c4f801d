"""The Delta protocol layer: snapshots, file skipping, statistics and commits on delta-rs."""

from deltaflow.table._snapshot import FileEntry, Snapshot, load_snapshot, table_exists

__all__ = ["FileEntry", "Snapshot", "load_snapshot", "table_exists"]
