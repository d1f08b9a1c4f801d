"""``DESCRIBE HISTORY`` and ``DESCRIBE DETAIL`` of a Delta table, as rows (tuples in the
order of :data:`HISTORY_SCHEMA` / :data:`DETAIL_SCHEMA`, delta-spark's output), for the
SQL commands (through the bridge) and ``deltaflow.DeltaTable``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.commands._maintenance import Row
from deltaflow.spark.dml._delete_update import OPERATION_KEY
from deltaflow.table import _clustering
from deltaflow.table._snapshot import Snapshot, load_snapshot

# The output schemas of delta-spark's commands (the JVM commands declare the same ones;
# tests/spark/test_sql_commands.py checks that they agree).
HISTORY_SCHEMA = (
    "version bigint, timestamp timestamp, userId string, userName string, operation string,"
    " operationParameters map<string,string>,"
    " job struct<jobId:string,jobName:string,jobRunId:string,runId:string,jobOwnerId:string,"
    "triggerType:string>,"
    " notebook struct<notebookId:string>, clusterId string, readVersion bigint,"
    " isolationLevel string, isBlindAppend boolean, operationMetrics map<string,string>,"
    " userMetadata string, engineInfo string"
)


DETAIL_SCHEMA = (
    "format string, id string, name string, description string, location string,"
    " createdAt timestamp, lastModified timestamp, partitionColumns array<string>,"
    " clusteringColumns array<string>, numFiles bigint, sizeInBytes bigint,"
    " properties map<string,string>, minReaderVersion int, minWriterVersion int,"
    " tableFeatures array<string>"
)


def history(uri: str, limit: int | None = None) -> list[Row]:
    """The table's commits, newest first (``DESCRIBE HISTORY``)."""
    if limit is not None and limit < 1:
        raise InvalidOptionError(
            f"DESCRIBE HISTORY of {uri}: LIMIT must be at least 1, got {limit}.",
            option="limit",
        )
    rows = [_history_row(c, uri) for c in load_snapshot(uri).history(limit)]
    rows.sort(key=lambda r: r[0], reverse=True)
    return rows


def detail(uri: str, name: str | None = None) -> list[Row]:
    """One row describing the table (``DESCRIBE DETAIL``); ``name`` is its catalog name."""
    snapshot = load_snapshot(uri)
    metadata = snapshot.delta_table.metadata()
    files = snapshot.files(stats=False)
    last = snapshot.history(1)
    row: Row = (
        "delta",
        metadata.id,
        name if name is not None else metadata.name,
        metadata.description,
        snapshot.uri,
        _timestamp(metadata.created_time),
        _timestamp(last[0]["timestamp"]) if last else None,
        list(snapshot.partition_columns),
        _clustering.clustering_columns(
            snapshot.uri, snapshot.schema, snapshot.writer_features, snapshot.version
        ),
        len(files),
        sum(f.size for f in files),
        {k: v for k, v in snapshot.configuration.items() if v is not None},
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        _table_features(snapshot),
    )
    return [row]


def _history_row(commit: dict[str, Any], uri: str) -> Row:
    from deltaflow.spark.dml import _merge_native

    operation = commit.get(OPERATION_KEY) or commit.get("operation")
    # A MERGE delta-rs committed (the small-source route): delta-spark's names.
    parameters = _merge_native.history_parameters(commit)
    metrics = _merge_native.history_metrics(commit, uri)
    return (
        commit.get("version"),
        _timestamp(commit.get("timestamp")),
        commit.get("userId"),
        commit.get("userName"),
        operation,
        _string_map(parameters if parameters is not None else commit.get("operationParameters")),
        None,
        None,
        commit.get("clusterId"),
        commit.get("readVersion"),
        commit.get("isolationLevel"),
        commit.get("isBlindAppend"),
        _string_map(metrics if metrics is not None else commit.get("operationMetrics")),
        commit.get("userMetadata"),
        commit.get("engineInfo"),
    )


def _string_map(values: Any) -> dict[str, str | None] | None:
    """A commit's JSON values as DESCRIBE HISTORY's strings; a null stays null (as in
    delta-spark, e.g. CREATE TABLE's ``description`` without a comment)."""
    if not isinstance(values, dict):
        return None
    return {k: v if isinstance(v, str) or v is None else json.dumps(v) for k, v in values.items()}


def _timestamp(ms: Any) -> dt.datetime | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.timezone.utc)


def _table_features(snapshot: Snapshot) -> list[str]:
    """DESCRIBE DETAIL's tableFeatures: the features listed or implied by legacy versions."""
    from deltaflow.table._protocol import Protocol

    protocol = Protocol(
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        frozenset(snapshot.reader_features),
        frozenset(snapshot.writer_features),
    )
    return sorted(protocol.features)
