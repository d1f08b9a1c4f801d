"""The log side of identity columns: creating such a table and committing writes to it.

delta-rs 1.6 neither gives a new table the ``identityColumns`` protocol (writer version
6) nor commits to a table that has it, so deltaflow writes these commits itself:

- **create**: version 0 (``protocol`` + ``metaData``) written once, put-if-absent; a
  replace is one commit of deltaflow's log writer (new ``metaData``, a ``remove`` of every
  live file);
- **writes**: one commit of ``_log_commit`` holding the added files and, when the write
  handed out identity values, a ``metaData`` whose schema carries the new
  ``delta.identity.highWaterMark`` (the highest value written for a positive step, the
  lowest for a negative one, from the files' stats), as delta-spark does. A metadata
  change conflicts with every concurrent commit that changes metadata too, so two
  writers that both generate identity values cannot both commit (the later one fails
  with ``ConcurrentWriteError(kind="MetadataChanged")``): values stay unique.

Local (POSIX) tables only, like every commit of deltaflow's log writer.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow._atomic import put_if_absent
from deltaflow.table import _generated, _log_commit, _protocol, _uri
from deltaflow.table.errors import TableAlreadyExistsError

if TYPE_CHECKING:
    from deltaflow.table._commit import CommitRequest, CommitResult


def create_identity_table(
    uri: str,
    schema: Mapping[str, Any],
    *,
    partition_columns: Sequence[str],
    name: str | None,
    description: str | None,
    configuration: Mapping[str, str],
    replace: bool,
) -> int:
    """Write the log of a new (or replacing) table with identity columns; its version."""
    _log_commit.require_local(uri, "Creating a table with identity columns")
    now_ms = int(time.time() * 1000)
    metadata = {
        "id": str(uuid.uuid4()),
        "name": name,
        "description": description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(dict(schema), separators=(",", ":")),
        "partitionColumns": list(partition_columns),
        "configuration": dict(configuration),
        "createdTime": now_ms,
    }
    protocol = _protocol_for(schema, configuration)
    log_dir = os.path.join(_uri.local_path(uri), "_delta_log")
    if not replace:
        os.makedirs(log_dir, exist_ok=True)
        info = {
            "timestamp": now_ms,
            "operation": "CREATE TABLE",
            "operationParameters": {
                "partitionBy": json.dumps(list(partition_columns)),
                "description": description,
                "properties": json.dumps(dict(configuration)),
            },
            "isBlindAppend": True,
            "engineInfo": _log_commit.engine_info(),
            "txnId": str(uuid.uuid4()),
        }
        lines = [{"commitInfo": info}, {"protocol": protocol.to_action()}, {"metaData": metadata}]
        payload = "\n".join(json.dumps(a, separators=(",", ":")) for a in lines) + "\n"
        if not put_if_absent(os.path.join(log_dir, f"{0:020d}.json"), payload.encode()):
            raise TableAlreadyExistsError(
                f"A Delta table was created at {uri} by another writer meanwhile.", table_uri=uri
            )
        return 0
    from deltaflow.table._snapshot import load_snapshot

    current = load_snapshot(uri)
    existing = _protocol.Protocol(
        current.delta_table.protocol().min_reader_version,
        current.delta_table.protocol().min_writer_version,
        frozenset(current.reader_features),
        frozenset(current.writer_features),
    )
    upgraded = existing.with_features(protocol.features, used=protocol.features)
    removes = [
        {
            "path": entry.path,
            "dataChange": True,
            "size": entry.size,
            "partitionValues": {k: _text(v) for k, v in entry.partition_values.items()},
        }
        for entry in current.files(stats=False)
    ]
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=uri,
            read_version=current.version,
            operation="CREATE OR REPLACE TABLE",
            metadata=metadata,
            protocol=upgraded.to_action() if upgraded != existing else None,
            removes=removes,
            read=_log_commit.ReadSet(whole_table=True),
            partitioned=bool(partition_columns),
        )
    )


def _protocol_for(
    schema: Mapping[str, Any], configuration: Mapping[str, str]
) -> _protocol.Protocol:
    used = set(_protocol.features_in_use(dict(configuration), dict(schema)))
    lowered = {k.lower(): str(v).lower() for k, v in configuration.items()}
    if lowered.get("delta.enabledeletionvectors") == "true":
        used.add("deletionVectors")
    if "timestamp_ntz" in json.dumps(dict(schema)):
        used.add("timestampNtz")
    return _protocol.Protocol(1, 1).with_features(used, used=used)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def commit_write(request: CommitRequest) -> CommitResult:
    """Commit a write (append or overwrite) to an existing table with identity columns:
    its files, and the identity columns' new high water marks in the same commit."""
    from deltaflow.table._commit import CommitResult, already_committed
    from deltaflow.table._snapshot import load_snapshot

    assert request.read_version is not None
    _log_commit.require_local(request.table_uri, "Writing a table with identity columns")
    snapshot = load_snapshot(request.table_uri, version=request.read_version)
    if already_committed(snapshot.delta_table, request.app_id, request.app_version):
        return CommitResult(None, True, 0)
    schema = dict(snapshot.schema)  # request.schema is Spark's view, identity keys left out
    if request.new_columns:
        schema = {**schema, "fields": [*schema["fields"], *request.new_columns]}
    marks = _generated.high_water_marks(
        _generated.identity_columns(snapshot.schema),
        request.identity_generated,
        (a.stats for a in request.adds),
    )
    metadata = None
    if marks or request.new_columns:
        metadata = _metadata_of(snapshot, _generated.with_high_water_marks(schema, marks))
    removes: list[dict[str, Any]] = [r.to_log_action() for r in request.removes]
    if request.mode == "overwrite":
        removes = [
            {
                "path": entry.path,
                "dataChange": True,
                "size": entry.size,
                "partitionValues": {k: _text(v) for k, v in entry.partition_values.items()},
            }
            for entry in snapshot.files(stats=False)
        ]
    info = dict(request.commit_info)
    parameters = info.pop("operationParameters", None) or {
        "mode": "Overwrite" if request.mode == "overwrite" else "Append",
        "partitionBy": json.dumps(list(request.partition_columns)),
    }
    metrics = info.pop("operationMetrics", {})
    info.pop("readVersion", None)
    info.pop("isBlindAppend", None)
    if request.user_metadata is not None:
        info["userMetadata"] = request.user_metadata
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
            app_id=request.app_id,
            app_version=request.app_version,
            read=request.read
            or _log_commit.ReadSet(
                blind_append=not removes and metadata is None, whole_table=bool(removes)
            ),
            partitioned=bool(request.partition_columns),
            extra_commit_info=info,
            checkpoint_interval=_log_commit.checkpoint_interval(snapshot.configuration),
        )
    )
    return CommitResult(version, False, len(request.adds))


def _metadata_of(snapshot: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    meta = snapshot.delta_table.metadata()
    return {
        "id": meta.id,
        "name": meta.name,
        "description": meta.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(dict(schema), separators=(",", ":")),
        "partitionColumns": list(meta.partition_columns),
        "configuration": dict(meta.configuration),
        "createdTime": meta.created_time,
    }
