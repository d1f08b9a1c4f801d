"""Commits to tables delta-rs 1.6 cannot write, on deltaflow's log writer: one path.

delta-rs 1.6 reads tables whose protocol has a writer feature of
:data:`~deltaflow.table._protocol.DELTA_RS_UNWRITABLE_FEATURES` (``identityColumns``,
``clustering``, ``domainMetadata``, ``typeWidening``) but refuses to commit to them.
Every commit to such a table, or that gives a table one of them, and every DML commit
with a read set, is written here through :mod:`deltaflow.table._log_commit` (conflict
checks, put-if-absent):

* **create** (``read_version`` None): version 0 with protocol, metadata, domains and the
  first files (CTAS, ``writeTo().create``, ``CREATE TABLE``), and every creation of a
  column-mapped table (delta-rs 1.6 refuses to create one);
* **replace** (``replace_table``): ``CREATE OR REPLACE TABLE``: new metadata, a remove of
  every live file, history kept;
* **writes**: appends, overwrites (removes of every live file), mergeSchema /
  overwriteSchema (the metadata rides the data's commit, new partition columns too), DML
  (its read set, ``cdc``);
* **restore**: :func:`restore`, RESTORE's adds and removes.

What a feature adds to a commit comes from a hook in the feature's module, a function
``(request, draft) -> draft`` run on every commit: identity columns move their high water
marks (:func:`deltaflow.table._generated_log.add_high_water_marks`), clustering writes the
``delta.clustering`` domain and asks for its features
(:func:`deltaflow.table._clustered_commit.add_clustering`). The protocol is computed once,
after the hooks, from the features the resulting metadata uses plus those the hooks ask for.

Local (POSIX) tables only, like every commit of the log writer; elsewhere the commit is
refused with :class:`UnsupportedFeatureError` naming the feature and what to do instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.table import _clustered_commit, _clustering, _generated_log, _log_commit
from deltaflow.table._protocol import (
    DELTA_RS_UNWRITABLE_FEATURES,
    Protocol,
    features_in_use,
    new_table_base,
)
from deltaflow.table._snapshot import Snapshot, catch_up, load_snapshot, snapshot_of_table
from deltaflow.table.errors import UnsupportedFeatureError

if TYPE_CHECKING:
    from deltaflow.table._commit import CommitRequest, CommitResult

# What to do instead, per feature, when the log writer cannot commit (object stores).
_ALTERNATIVES = {
    "identityColumns": "write the key column's values yourself instead of GENERATED ... AS"
    " IDENTITY",
    "clustering": "drop CLUSTER BY (partition the table or OPTIMIZE ... ZORDER BY instead)",
    "domainMetadata": "drop CLUSTER BY (partition the table or OPTIMIZE ... ZORDER BY instead)",
    "typeWidening": "rewrite the table without delta.enableTypeWidening (CREATE OR REPLACE"
    " TABLE ... AS SELECT with a cast)",
    "typeWidening-preview": "rewrite the table without delta.enableTypeWidening (CREATE OR"
    " REPLACE TABLE ... AS SELECT with a cast)",
}
# delta-rs's names for features in "Unsupported table features required: [...]".
_DELTA_RS_NAMES = {
    "IdentityColumns": "identityColumns",
    "ClusteredTable": "clustering",
    "DomainMetadata": "domainMetadata",
}
_UNSUPPORTED = re.compile(r"unsupported table features required:?\s*\[([^\]]*)\]", re.I)


@dataclasses.dataclass(frozen=True)
class Draft:
    """The table a commit leaves, as the hooks shape it."""

    uri: str
    label: str  # how errors name the table (its name, else its location)
    schema: dict[str, Any]
    configuration: dict[str, str]
    partition_columns: tuple[str, ...]
    current: Snapshot | None  # None: the commit creates the table
    features: frozenset[str] = frozenset()  # features hooks need beyond what metadata uses
    domains: tuple[dict[str, Any], ...] = ()
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)


Hook = Callable[["CommitRequest", Draft], Draft]
HOOKS: tuple[Hook, ...] = (_generated_log.add_high_water_marks, _clustered_commit.add_clustering)


def needs_log_writer(request: CommitRequest) -> bool:
    """Whether creating the table of ``request`` gives it a feature delta-rs cannot write."""
    features = features_needed(request.schema, request.configuration)
    # delta-rs 1.6 refuses to create (or replace into) a column-mapped table ("Column
    # mapping is not supported for write operation 'CREATE TABLE with column mapping
    # metadata'").
    return (
        request.clustering_columns is not None
        or bool(features & DELTA_RS_UNWRITABLE_FEATURES)
        or ("columnMapping" in features and (request.read_version is None or request.replace_table))
    )


def commit_write(
    request: CommitRequest, *, name: str | None = None, label: str | None = None
) -> CommitResult:
    """Commit ``request`` (create, replace, append, overwrite, DML) as one commit."""
    from deltaflow.table._commit import CommitResult, request_committed, rolls_committed

    current = None
    kept = request.table
    head = request.head
    if head is not None and request.read_version == head.version:
        # A writer's log head (a real-time sink's): metadata and app transactions without
        # a delta-rs table; the log commit moves it over the versions it learns.
        current = head.snapshot()
        if request.txn_from and rolls_committed(head.txn, request):
            return CommitResult(None, True, 0)
        kept = None
    elif (
        kept is not None
        and request.read_version is not None
        and kept.version() == request.read_version
    ):
        # A caller's open table at the read version (a stream sink's): no log load.
        current = snapshot_of_table(kept, request.table_uri)
        # Real-time rolls must continue the log's app transactions (micro-batches were
        # checked when planned: plan.skip).
        if request.txn_from and request_committed(kept, request):
            return CommitResult(None, True, 0)
    elif request.read_version is not None:
        current = load_snapshot(
            request.table_uri,
            version=request.read_version,
            storage_options=request.storage_options,
        )
        # Only an app transaction needs the delta-rs table (a second log load otherwise).
        if request_committed(current.delta_table, request):
            return CommitResult(None, True, 0)
    draft = _first_draft(request, current, label or request.table_uri)
    for hook in HOOKS:
        draft = hook(request, draft)
    protocol = protocol_of(draft)
    require_conditional_put(draft.uri, protocol, request.operation)
    if current is None:
        version = _write_version_zero(request, draft, protocol, name)
        return CommitResult(version, False, len(request.adds), dict(draft.configuration))
    version = _commit_change(request, draft, protocol, name)
    if kept is not None:
        # The caller's table moves on past this commit, as after a delta-rs commit.
        with contextlib.suppress(Exception):
            catch_up(kept, request.table_uri)
    return CommitResult(version, False, len(request.adds), dict(draft.configuration))


def protocol_of(draft: Draft) -> Protocol:
    """The lowest protocol for the draft's metadata and the features its hooks asked for."""
    used = features_needed(draft.schema, draft.configuration)
    if draft.current is not None:
        base = Protocol.of(draft.current)
    else:
        base = new_table_base(draft.configuration, draft.schema)
    return base.with_features(used | draft.features, used)


def features_needed(schema: Mapping[str, Any], configuration: Mapping[str, Any]) -> frozenset[str]:
    """The features a table's metadata uses, deletion vectors and timestamp_ntz included."""
    used = set(features_in_use(dict(configuration), dict(schema)))
    lowered = {k.lower(): str(v).lower() for k, v in configuration.items()}
    if lowered.get("delta.enabledeletionvectors") == "true":
        used.add("deletionVectors")
    if "timestamp_ntz" in json.dumps(dict(schema)):
        used.add("timestampNtz")
    return frozenset(used)


def require_conditional_put(uri: str, protocol: Protocol, operation: str) -> None:
    """Refuse a log-writer commit on a store without put-if-absent, naming the feature
    that needs the log writer."""
    from deltaflow.table import _conditional_put

    if _conditional_put.supported(uri):
        return
    blocking = sorted(protocol.delta_rs_unwritable) or ["logCommit"]
    scheme = uri.split("://", 1)[0]
    why = (
        "deltaflow's own log writer commits with a conditional put (put-if-absent), which"
        f" {scheme}:// does not offer. Use a local, S3, GCS or Azure table"
    )
    raise unsupported(uri, blocking, operation, why)


def require_mapped_create(uri: str, label: str) -> None:
    """Refuse, before anything is written, to create a column-mapped table where the log
    writer cannot commit (delta-rs 1.6 refuses to create one itself)."""
    from deltaflow.table import _conditional_put

    if _conditional_put.supported(uri):
        return
    raise UnsupportedFeatureError(
        f"Creating column-mapped table {label}: only deltaflow's own log writer writes"
        " column mapping (delta-rs 1.6 refuses to), and it commits with a conditional put"
        f" (put-if-absent), which {uri.split('://', 1)[0]}:// does not offer. Create the"
        " table on a local, S3, GCS or Azure location, or without delta.columnMapping.mode.",
        table_uri=uri,
        feature="columnMapping",
    )


def unsupported(
    uri: str, features: Sequence[str], operation: str, why: str
) -> UnsupportedFeatureError:
    """The typed error for a commit neither delta-rs nor deltaflow's log writer makes."""
    instead = "; or ".join(dict.fromkeys(_ALTERNATIVES[f] for f in features if f in _ALTERNATIVES))
    return UnsupportedFeatureError(
        f"{operation} on {uri}: the table uses {', '.join(features)}, which delta-rs 1.6"
        f" cannot commit, and {why}, or"
        f" {instead or 'create the table without these features'}.",
        table_uri=uri,
        feature=features[0],
    )


def from_delta_rs(exc: Exception, uri: str, operation: str) -> UnsupportedFeatureError | None:
    """delta-rs's "Unsupported table features required" as a typed error (else None)."""
    found = _UNSUPPORTED.search(str(exc))
    if found is None:
        return None
    names = [n.strip() for n in found.group(1).split(",") if n.strip()]
    features = [_DELTA_RS_NAMES.get(n, n[:1].lower() + n[1:]) for n in names] or ["unknown"]
    why = f"deltaflow's own log writer does not write {operation} commits yet. Run it on a table"
    return unsupported(uri, features, operation, why + " without them")


def remove_all(uri: str, snapshot: Snapshot) -> list[dict[str, Any]]:
    """Removes of every live file of ``snapshot``, deletion vectors included."""
    files = snapshot.files(stats=False)
    adds = _log_commit.add_actions_of(uri, snapshot.version, [f.path for f in files])
    out = []
    for entry in files:
        add = adds.get(entry.path, {})
        out.append(remove_action(add, entry.path, entry.size))
    return out


def restore(
    snapshot: Snapshot, target: Snapshot, parameters: Mapping[str, Any], metrics: Mapping[str, str]
) -> int:
    """RESTORE of ``snapshot`` to ``target``'s files (and metadata, keeping identity high
    water marks: values handed out since must not be handed out again); its version."""
    uri = snapshot.uri
    require_conditional_put(uri, Protocol.of(snapshot), "RESTORE")
    now_adds = _log_commit.add_actions_of(uri, snapshot.version, _paths(snapshot))
    then_adds = _log_commit.add_actions_of(uri, target.version, _paths(target))
    now_keys = {_file_key(a) for a in now_adds.values()}
    then_keys = {_file_key(a) for a in then_adds.values()}
    removes = [
        remove_action(a, path, int(a.get("size", 0)))
        for path, a in now_adds.items()
        if _file_key(a) not in then_keys
    ]
    modified = int(time.time() * 1000)
    adds = [
        {**a, "dataChange": True, "modificationTime": modified}
        for a in then_adds.values()
        if _file_key(a) not in now_keys
    ]
    metadata = None
    schema = _generated_log.keep_high_water_marks(target.schema, snapshot.schema)
    if (schema, target.configuration, target.partition_columns) != (
        snapshot.schema,
        snapshot.configuration,
        snapshot.partition_columns,
    ):
        metadata = _metadata(snapshot, schema, target, None)
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=uri,
            read_version=snapshot.version,
            operation="RESTORE",
            operation_parameters=dict(parameters),
            operation_metrics=dict(metrics),
            adds=adds,
            removes=removes,
            metadata=metadata,
            domain_metadata=_clustered_commit.restored_domains(uri, snapshot, target),
            read=_log_commit.ReadSet(files=frozenset(now_adds), whole_table=True),
            partitioned=bool(snapshot.partition_columns),
            checkpoint_interval=_log_commit.checkpoint_interval(snapshot.configuration),
        )
    )


# ---- the pieces ------------------------------------------------------------------------------


def _first_draft(request: CommitRequest, current: Snapshot | None, label: str) -> Draft:
    if current is None or request.replace_table:
        return Draft(
            uri=request.table_uri,
            label=label,
            schema=dict(request.schema),
            configuration=dict(request.configuration),
            partition_columns=tuple(request.partition_columns),
            current=current,
        )
    configuration = {k: v for k, v in current.configuration.items() if v is not None}
    configuration.update(request.configuration)
    return Draft(
        uri=request.table_uri,
        label=label,
        schema=_schema_after(request, current.schema),
        configuration=configuration,
        partition_columns=(
            tuple(request.partition_columns)
            if request.replace_partitioning
            else current.partition_columns
        ),
        current=current,
    )


def _schema_after(request: CommitRequest, schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a write leaves. ``request.schema`` is Spark's view of the table (without
    field metadata: identity keys, column mapping), so the table's own fields are kept
    where the request has the same column, and only a new shape changes the schema."""
    if request.new_columns:  # mergeSchema: new top-level columns at the end
        return {**schema, "fields": [*schema["fields"], *request.new_columns]}
    if _shape(request.schema) == _shape(schema):
        return schema
    old = {f["name"].lower(): f for f in schema.get("fields", [])}
    fields = []
    for f in request.schema.get("fields", []):
        before = old.get(f["name"].lower())
        if before is not None and _bare(before["type"]) == _bare(f["type"]):
            f = {**before, "nullable": f.get("nullable", True)}
        fields.append(f)
    return {**request.schema, "fields": fields}


def _shape(schema: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    return [
        (f["name"], _bare(f["type"]), bool(f.get("nullable", True)))
        for f in schema.get("fields", [])
    ]


def _bare(value: Any) -> Any:
    """A type's JSON without field metadata (nested fields carry it too)."""
    if isinstance(value, dict):
        return {k: _bare(v) for k, v in value.items() if k != "metadata"}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


def _write_version_zero(
    request: CommitRequest, draft: Draft, protocol: Protocol, name: str | None
) -> int:
    from deltaflow.table._commit_info import WRITE_OPERATIONS, write_metrics

    info = dict(request.commit_info)
    given = info.pop("operationParameters", None)
    parameters = {
        **(
            given
            or {
                "partitionBy": json.dumps(list(draft.partition_columns)),
                "description": request.description,
                "properties": json.dumps(draft.configuration),
            }
        ),
        **draft.parameters,
    }
    metrics = info.pop("operationMetrics", None)
    if metrics is None and request.operation in WRITE_OPERATIONS:
        metrics = write_metrics(request)
    for kept in ("readVersion", "isBlindAppend"):
        info.pop(kept, None)
    if request.user_metadata is not None:
        info["userMetadata"] = request.user_metadata
    transaction = None
    if request.app_id is not None and request.app_version is not None:
        transaction = (request.app_id, request.app_version)
    return _clustering.write_version_zero(
        draft.uri,
        metadata=_clustering.metadata_action(
            schema=draft.schema,
            partition_columns=draft.partition_columns,
            configuration=draft.configuration,
            name=name,
            description=request.description,
        ),
        protocol=protocol,
        domains=draft.domains,
        adds=[a.to_log_action() for a in request.adds],
        operation=request.operation,
        parameters=parameters,
        metrics=metrics,
        extra_info=info,
        app_transaction=transaction,
    )


def _commit_change(
    request: CommitRequest, draft: Draft, protocol: Protocol, name: str | None
) -> int:
    current = draft.current
    assert current is not None and request.read_version is not None
    whole = request.mode == "overwrite" or request.replace_table
    removes = (
        remove_all(draft.uri, current) if whole else [r.to_log_action() for r in request.removes]
    )
    metadata = None
    if request.replace_table or (draft.schema, draft.configuration, draft.partition_columns) != (
        current.schema,
        {k: v for k, v in current.configuration.items() if v is not None},
        current.partition_columns,
    ):
        metadata = _metadata(current, draft.schema, draft, name if request.replace_table else None)
        if request.replace_table or request.description is not None:
            metadata["description"] = request.description
    before = Protocol.of(current)
    info = dict(request.commit_info)
    parameters = info.pop("operationParameters", None) or {
        "mode": "Overwrite" if request.mode == "overwrite" else "Append",
        "partitionBy": json.dumps(list(draft.partition_columns)),
    }
    parameters = {**parameters, **draft.parameters}
    metrics = info.pop("operationMetrics", None)
    if metrics is None:
        from deltaflow.table._commit_info import WRITE_OPERATIONS, write_metrics

        metrics = write_metrics(request) if request.operation in WRITE_OPERATIONS else {}
    info.pop("readVersion", None)
    info.pop("isBlindAppend", None)
    if request.user_metadata is not None:
        info["userMetadata"] = request.user_metadata
    # As delta-spark's: only adds and nothing read, whatever the metadata (a mergeSchema
    # append is blind too). A winner's metadata change still conflicts with it.
    blind = not whole and not removes and not draft.domains
    read = request.read or _log_commit.ReadSet(
        files=frozenset(r["path"] for r in removes), blind_append=blind, whole_table=whole
    )
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=draft.uri,
            read_version=request.read_version,
            operation=(
                "CREATE OR REPLACE TABLE"
                if request.replace_table and "REPLACE" not in request.operation
                else request.operation
            ),
            operation_parameters=parameters,
            operation_metrics=metrics,
            adds=[a.to_log_action() for a in request.adds],
            removes=removes,
            cdc=[c.to_cdc_action() for c in request.cdc],
            metadata=metadata,
            protocol=protocol.to_action() if protocol != before else None,
            domain_metadata=draft.domains,
            app_id=request.app_id,
            app_version=request.app_version,
            more_transactions=request.more_transactions,
            read=read,
            partitioned=bool(draft.partition_columns),
            extra_commit_info=info,
            checkpoint_interval=_log_commit.checkpoint_interval(draft.configuration),
            on_version=request.head.apply if request.head is not None else None,
        )
    )


def _metadata(
    current: Snapshot, schema: Mapping[str, Any], new: Draft | Snapshot, name: str | None
) -> dict[str, Any]:
    """A ``metaData`` action keeping the table's id, name and creation time."""
    meta = current.delta_table.metadata()
    configuration = {k: v for k, v in new.configuration.items() if v is not None}
    return _clustering.metadata_action(
        schema=dict(schema),
        partition_columns=new.partition_columns,
        configuration=configuration,
        name=name or meta.name,
        description=meta.description,
        table_id=meta.id,
        created_time=meta.created_time,
    )


def _paths(snapshot: Snapshot) -> list[str]:
    return [f.path for f in snapshot.files(stats=False)]


def _file_key(add: Mapping[str, Any]) -> tuple[str, str]:
    """A logical file: its path and deletion vector (protocol: both name the file)."""
    dv = add.get("deletionVector")
    return str(add["path"]), json.dumps(dv, sort_keys=True) if dv else ""


def remove_action(
    add: Mapping[str, Any], path: str, size: int, *, data_change: bool = True
) -> dict[str, Any]:
    """The ``remove`` of a live file, repeating what its ``add`` says that names the
    logical file (deletion vector) or that readers keep (partition values, tags)."""
    action: dict[str, Any] = {
        "path": path,
        "dataChange": data_change,
        "extendedFileMetadata": True,
        "partitionValues": dict(add.get("partitionValues") or {}),
        "size": size,
    }
    if add.get("deletionVector"):
        action["deletionVector"] = add["deletionVector"]
    if add.get("tags"):
        action["tags"] = add["tags"]
    return action
