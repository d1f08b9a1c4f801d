"""``CREATE TABLE t SHALLOW CLONE s``: a new table whose first commit adds the source's
files where they are, by absolute URI (delta-spark's shallow clone).

Version 0 of the clone holds the source version's protocol, its metadata under a new table
id (the clone's ``TBLPROPERTIES`` over the source's configuration), its metadata domains
(clustering columns) and every live ``add`` with its path made absolute; a deletion vector
stored beside the source (``u``) is named by its absolute path (``p``). Nothing is copied:
the clone reads the source's files until its own writes replace them, and VACUUM of the
clone never deletes them (they are not under its root). VACUUM of the *source* may,
which is why delta-spark says a shallow clone depends on its source's retention.

``CREATE OR REPLACE TABLE t SHALLOW CLONE s`` over an existing ``t`` (``replace``) is, as in
delta-spark 4.4, allowed only when ``t`` holds no live file (DELETE FROM or TRUNCATE it
first; delta-spark: DELTA_UNSUPPORTED_NON_EMPTY_CLONE): one CLONE commit on ``t``'s log that
adds the source's files and puts the source's schema, partitioning and configuration in
new metadata under ``t``'s table id, its protocol only ever upgraded. As delta-spark, the
metadata keeps the source's creation time, and the commit is not a blind append.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlparse

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _clustering, _log_commit, _log_write, _uri
from deltaflow.table._deletion_vectors import DeletionVectorDescriptor
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import Snapshot, load_snapshot, table_exists
from deltaflow.table.errors import CorruptTableError, TableAlreadyExistsError

Row = tuple[Any, ...]

# delta-spark's CLONE operationMetrics, in the order of the statement's output row.
CLONE_METRICS = (
    "sourceTableSize",
    "sourceNumOfFiles",
    "numRemovedFiles",
    "numCopiedFiles",
    "removedFilesSize",
    "copiedFilesSize",
)


def shallow_clone(
    source_uri: str,
    target_uri: str,
    *,
    version: int | None = None,
    timestamp: str | None = None,
    properties: Mapping[str, str] | None = None,
    source_name: str | None = None,
    replace: bool = False,
) -> list[Row]:
    """Create ``target_uri`` as a shallow clone of ``source_uri`` (its latest version, or
    ``version`` / the latest at or before ``timestamp``); the statement's one output row.
    ``source_name``: how the statement named the source, for the commit's parameters;
    ``replace``: an empty table at ``target_uri`` becomes the clone (CREATE OR REPLACE)."""
    if version is not None and timestamp is not None:
        raise InvalidOptionError(
            f"SHALLOW CLONE of {source_uri}: give VERSION AS OF or TIMESTAMP AS OF, not both.",
            option="version",
        )
    target = None
    if table_exists(target_uri):
        if not replace:
            raise TableAlreadyExistsError(
                f"Cannot clone into {target_uri}: a Delta table is there already. Clone into a"
                " new location, use CREATE OR REPLACE TABLE ... SHALLOW CLONE, or drop that"
                " table first.",
                table_uri=target_uri,
            )
        target = _empty_target(target_uri)
    source = load_snapshot(source_uri, version=version, timestamp=timestamp)
    files = source.files(stats=False)
    actions = _log_commit.add_actions_of(source.uri, source.version, [f.path for f in files])
    missing = [f.path for f in files if f.path not in actions]
    if missing:
        raise CorruptTableError(
            f"SHALLOW CLONE of {source.uri}: the log of version {source.version} lists no add"
            f" action for {len(missing)} live file(s), e.g. {missing[0]}. Nothing was written.",
            table_uri=source.uri,
            path=missing[0],
        )
    root = _root(source.uri)
    adds = [_absolute(actions[f.path], root) for f in files]
    size = sum(f.size for f in files)
    row: Row = (size, len(files), 0, 0, 0, 0)
    configuration = {k: v for k, v in source.configuration.items() if v is not None}
    configuration.update(properties or {})
    # delta-spark's CLONE parameters (4.4 records these two).
    parameters = {"source": source_name or source.uri, "sourceVersion": source.version}
    metrics = {k: str(v) for k, v in zip(CLONE_METRICS, row, strict=True)}
    if target is not None:
        _commit_replacement(target, source, adds, configuration, parameters, metrics)
        return [row]
    created = _log_commit.create_table(
        target_uri,
        schema=source.schema,
        partition_columns=source.partition_columns,
        configuration=configuration,
        protocol=Protocol.of(source).to_action(),
        adds=adds,
        description=source.description,
        domains=_domains(source),
        operation="CLONE",
        operation_parameters=parameters,
        operation_metrics=metrics,
        created_time=source.delta_table.metadata().created_time,
        # delta-spark also records readVersion -1 here, which delta-rs 1.6 cannot read
        # (its history() fails on the whole table): left out.
        extra_commit_info={"isBlindAppend": False},
    )
    if not created:
        raise TableAlreadyExistsError(
            f"Cannot clone into {target_uri}: another writer created a table there meanwhile.",
            table_uri=target_uri,
        )
    return [row]


def _empty_target(uri: str) -> Snapshot:
    """The table a CREATE OR REPLACE ... SHALLOW CLONE replaces, refused (as delta-spark
    4.4 refuses it) while it has live files."""
    target = load_snapshot(uri)
    live = target.files(stats=False)
    if live:
        raise TableAlreadyExistsError(
            f"Cannot replace {uri} by a shallow clone: the table holds {len(live)} live"
            " file(s), and only an empty table can be replaced by a clone (delta-spark:"
            " DELTA_UNSUPPORTED_NON_EMPTY_CLONE). Empty it first (DELETE FROM the table, or"
            " TRUNCATE TABLE), or drop it, then clone again.",
            table_uri=uri,
        )
    return target


def _commit_replacement(
    target: Snapshot,
    source: Snapshot,
    adds: list[dict[str, Any]],
    configuration: dict[str, str],
    parameters: Mapping[str, Any],
    metrics: Mapping[str, str],
) -> int:
    """The CLONE commit that turns the empty ``target`` into a clone of ``source``."""
    protocol = Protocol.of(target).with_features(
        Protocol.of(source).features,
        _log_write.features_needed(source.schema, configuration),
    )
    _log_write.require_conditional_put(target.uri, protocol, "CREATE OR REPLACE ... CLONE")
    meta = target.delta_table.metadata()
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=target.uri,
            read_version=target.version,
            operation="CLONE",
            operation_parameters=parameters,
            operation_metrics=metrics,
            adds=adds,
            metadata=_clustering.metadata_action(
                schema=source.schema,
                partition_columns=source.partition_columns,
                configuration=configuration,
                name=meta.name,
                description=source.description,
                table_id=meta.id,
                created_time=source.delta_table.metadata().created_time,
            ),
            protocol=protocol.to_action() if protocol != Protocol.of(target) else None,
            domain_metadata=_domains(source),
            read=_log_commit.ReadSet(whole_table=True),
            partitioned=bool(source.partition_columns),
            checkpoint_interval=_log_commit.checkpoint_interval(configuration),
        )
    )


def _root(uri: str) -> str:
    """The source's root as a URI data file paths can follow (percent-encoded, as the
    log's relative paths are)."""
    parsed = urlparse(uri)
    path = quote(parsed.path.rstrip("/"), safe="/")
    if not parsed.netloc and parsed.scheme == "file":
        return f"file://{path}"
    return f"{parsed.scheme}://{parsed.netloc}{path}"


def _absolute(add: Mapping[str, Any], root: str) -> dict[str, Any]:
    out = dict(add)
    if not _uri.is_absolute(str(add["path"])):
        out["path"] = f"{root}/{add['path']}"
    dv = add.get("deletionVector")
    if dv:
        descriptor = DeletionVectorDescriptor.from_json(dv)
        if descriptor.storage_type == "u":
            absolute = descriptor.absolute_path(root)
            out["deletionVector"] = {**dv, "storageType": "p", "pathOrInlineDv": absolute}
    return out


def _domains(source: Snapshot) -> list[dict[str, Any]]:
    """The source's live metadata domains (clustering columns, ...), as they are."""
    return list(_clustering.read_domains(source.uri, source.version).values())
