"""Writes to tables delta-rs 1.6 cannot commit to (clustered tables), on the log writer.

:func:`deltaflow.table._commit.commit` hands a request here when the table lists a
writer feature of :data:`~deltaflow.table._protocol.DELTA_RS_UNWRITABLE_FEATURES`, or
when the write declares ``CLUSTER BY`` (CTAS, RTAS, ``writeTo().clusterBy``). The
commit is the one delta-rs would have written (adds; removes of every live file for an
overwrite; new metadata when the schema changes), plus the clustering domain and the
protocol upgrade when the write declares clustering, with delta-spark's conflict rules
(blind appends never conflict; an overwrite conflicts with any concurrent change).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from deltalake import DeltaTable

from deltaflow.table import _clustering, _log_commit, _uri
from deltaflow.table._commit import CommitRequest, CommitResult, already_committed
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import load_snapshot

log = logging.getLogger(__name__)


def create_with_files(request: CommitRequest) -> CommitResult:
    """Version 0 of a clustered table with its first files (CTAS, ``writeTo().create``)."""
    label = request.table_uri
    _clustering.refuse_object_store(request.table_uri, label)
    columns = _clustering.resolve_columns(
        request.schema,
        request.configuration,
        request.clustering_columns or (),
        label=label,
        uri=request.table_uri,
        partition_columns=request.partition_columns,
    )
    metadata = _clustering.metadata_action(
        schema=request.schema,
        partition_columns=request.partition_columns,
        configuration=request.configuration,
        description=request.description,
    )
    version = _clustering.write_version_zero(
        request.table_uri,
        metadata=metadata,
        protocol=_clustering.new_protocol(request.configuration, request.schema, None),
        domains=[_clustering.domain_action(columns)],
        adds=[a.to_log_action() for a in request.adds],
        operation="CREATE TABLE AS SELECT",
        parameters={"clusterBy": json.dumps([".".join(c) for c in columns])},
    )
    return CommitResult(version, False, len(request.adds))


def commit_write(request: CommitRequest, table: DeltaTable) -> CommitResult:
    """An append or overwrite of an existing table, on deltaflow's log writer."""
    assert request.read_version is not None
    if already_committed(table, request.app_id, request.app_version):
        log.info("skipping commit to %s: app transaction already recorded", request.table_uri)
        return CommitResult(None, True, 0)
    snapshot = load_snapshot(request.table_uri, version=request.read_version)
    removes = [r.to_log_action() for r in request.removes]
    if request.mode == "overwrite":
        removes = _remove_all(request.table_uri, snapshot.version, snapshot.files(stats=False))
    metadata = None
    if _shape(request.schema) != _shape(snapshot.schema):
        metadata = metadata_with_schema(request)
    protocol = None
    domains: list[dict[str, Any]] = []
    current = Protocol(
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        frozenset(snapshot.reader_features),
        frozenset(snapshot.writer_features),
    )
    if request.clustering_columns is not None:
        label = request.table_uri
        _clustering.refuse_object_store(request.table_uri, label)
        schema = request.schema if metadata is not None else snapshot.schema
        columns = _clustering.resolve_columns(
            schema,
            {k: v for k, v in snapshot.configuration.items() if v is not None},
            request.clustering_columns,
            label=label,
            uri=request.table_uri,
            partition_columns=snapshot.partition_columns,
        )
        if columns != _clustering.physical_columns(request.table_uri, snapshot.version):
            domains.append(_clustering.domain_action(columns))
        upgraded = _clustering.new_protocol(snapshot.configuration, schema, current)
        if upgraded != current:
            protocol = upgraded.to_action()
    info = dict(request.commit_info)
    parameters = info.pop("operationParameters", None) or {
        "mode": "Overwrite" if request.mode == "overwrite" else "Append"
    }
    metrics = info.pop("operationMetrics", {})
    info.pop("readVersion", None)
    info.pop("isBlindAppend", None)
    if request.user_metadata is not None:
        info["userMetadata"] = request.user_metadata
    blind = request.mode == "append" and not removes and metadata is None and not domains
    version = _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=request.table_uri,
            read_version=request.read_version,
            operation=request.operation,
            operation_parameters=parameters,
            operation_metrics=metrics,
            adds=[a.to_log_action() for a in request.adds],
            removes=removes,
            metadata=metadata,
            protocol=protocol,
            domain_metadata=domains,
            app_id=request.app_id,
            app_version=request.app_version,
            read=_log_commit.ReadSet(
                files=frozenset(r["path"] for r in removes),
                blind_append=blind,
                whole_table=request.mode == "overwrite",
            ),
            partitioned=bool(request.partition_columns),
            extra_commit_info=info,
            checkpoint_interval=_log_commit.checkpoint_interval(
                {k: v for k, v in snapshot.configuration.items()}
            ),
        )
    )
    return CommitResult(version, False, len(request.adds))


def metadata_with_schema(request: CommitRequest) -> dict[str, Any]:
    """The table's current ``metaData`` with the request's schema (mergeSchema,
    overwriteSchema) and, for a commit that sets them, its configuration and comment."""
    current = DeltaTable(_uri.delta_rs_uri(request.table_uri)).metadata()
    configuration = dict(current.configuration)
    configuration.update(request.configuration)
    return _clustering.metadata_action(
        schema=request.schema,
        partition_columns=list(current.partition_columns),
        configuration=configuration,
        name=current.name,
        description=request.description if request.description is not None else current.description,
        table_id=current.id,
        created_time=current.created_time,
    )


def _shape(schema: dict[str, Any]) -> list[tuple[str, str, bool]]:
    return [
        (f["name"], json.dumps(f["type"], sort_keys=True), bool(f.get("nullable", True)))
        for f in schema.get("fields", [])
    ]


def _remove_all(uri: str, version: int, files: list[Any]) -> list[dict[str, Any]]:
    """Removes of every live file at ``version``, deletion vectors included."""
    adds = _log_commit.add_actions_of(uri, version, [f.path for f in files])
    now = int(time.time() * 1000)
    out = []
    for entry in files:
        add = adds.get(entry.path, {})
        action: dict[str, Any] = {
            "path": entry.path,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": dict(add.get("partitionValues") or {}),
            "size": entry.size,
        }
        if add.get("deletionVector"):
            action["deletionVector"] = add["deletionVector"]
        out.append(action)
    return out


def create_or_replace_table(
    uri: str,
    *,
    schema: dict[str, Any],
    partition_columns: tuple[str, ...],
    configuration: dict[str, str],
    name: str | None,
    description: str | None,
    clustering_columns: tuple[str, ...],
    label: str,
    replace: bool,
) -> int:
    """The log side of CREATE [OR REPLACE] TABLE for a clustered table (or a replace of
    one): version 0, or one commit with the new metadata, protocol and domain that
    removes every live file (history kept, as delta-rs's replace does)."""
    _clustering.refuse_object_store(uri, label)
    columns = _clustering.resolve_columns(
        schema,
        configuration,
        clustering_columns,
        label=label,
        uri=uri,
        partition_columns=partition_columns,
    )
    parameters = {"clusterBy": json.dumps([".".join(c) for c in columns])}
    if not replace:
        return _clustering.write_version_zero(
            uri,
            metadata=_clustering.metadata_action(
                schema=schema,
                partition_columns=partition_columns,
                configuration=configuration,
                name=name,
                description=description,
            ),
            protocol=_clustering.new_protocol(configuration, schema, None),
            domains=[_clustering.domain_action(columns)],
            parameters=parameters,
        )
    snapshot = load_snapshot(uri)
    current = Protocol(
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        frozenset(snapshot.reader_features),
        frozenset(snapshot.writer_features),
    )
    protocol = _clustering.new_protocol(configuration, schema, current)
    old = snapshot.delta_table.metadata()
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=snapshot.uri,
            read_version=snapshot.version,
            operation="CREATE OR REPLACE TABLE",
            operation_parameters=parameters,
            removes=_remove_all(snapshot.uri, snapshot.version, snapshot.files(stats=False)),
            metadata=_clustering.metadata_action(
                schema=schema,
                partition_columns=partition_columns,
                configuration=configuration,
                name=name,
                description=description,
                table_id=old.id,
            ),
            protocol=protocol.to_action() if protocol != current else None,
            domain_metadata=[_clustering.domain_action(columns)],
            read=_log_commit.ReadSet(whole_table=True),
            partitioned=bool(partition_columns),
            checkpoint_interval=_log_commit.checkpoint_interval(dict(configuration)),
        )
    )
