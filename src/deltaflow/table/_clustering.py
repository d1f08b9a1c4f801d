"""Liquid clustering's log side: clustering columns as the ``delta.clustering`` domain.

A clustered table (PROTOCOL.md "Clustered Table") lists the writer features
``clustering`` and ``domainMetadata`` (writer version 7) and keeps its clustering
columns in a ``domainMetadata`` action, domain ``delta.clustering``, configuration
``{"clusteringColumns": [["a"], ["b", "c"]]}`` (paths of physical names, as delta-spark
writes them). Files that OPTIMIZE clustered carry ``clusteringProvider: "liquid"``
(:mod:`deltaflow.table._cluster_optimize`).

delta-rs 1.6 reads such tables but refuses to commit to them ("Unsupported table
features required: [ClusteredTable, DomainMetadata]"), so every commit to a clustered
table goes through deltaflow's log writer (:mod:`deltaflow.table._log_commit`), and
creating one writes version 0 here. Domains are carried by the snapshot (delta-rs keeps
them in its checkpoints), so only a change of the columns is ever written again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _log_commit, _schema, _stats, _uri
from deltaflow.table._protocol import Protocol, features_in_use
from deltaflow.table.errors import TableAlreadyExistsError

DOMAIN = "delta.clustering"
PROVIDER = "liquid"
FEATURES = frozenset({"clustering", "domainMetadata"})
# delta-spark's limit (DELTA_CLUSTER_BY_INVALID_NUM_COLUMNS): beyond four columns the
# curve gives each one too few bits to cluster anything.
MAX_COLUMNS = 4
_UNCLUSTERABLE = ("struct", "array", "map", "variant", "boolean", "binary")

ColumnPath = tuple[str, ...]


def is_clustered(writer_features: Sequence[str]) -> bool:
    return "clustering" in writer_features


def domain_action(physical: Sequence[ColumnPath]) -> dict[str, Any]:
    """The ``domainMetadata`` action recording ``physical`` clustering columns."""
    configuration = {"clusteringColumns": [list(p) for p in physical]}
    return {
        "domain": DOMAIN,
        "configuration": json.dumps(configuration, separators=(",", ":")),
        "removed": False,
    }


def parse_column(name: str) -> ColumnPath:
    """``a.b`` or ``a.`b.c``` as a path of names."""
    parts: list[str] = []
    current, quoted, i = "", False, 0
    while i < len(name):
        ch = name[i]
        if ch == "`":
            if quoted and name[i + 1 : i + 2] == "`":
                current += "`"
                i += 1
            else:
                quoted = not quoted
        elif ch == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
        i += 1
    parts.append(current)
    return tuple(p.strip() for p in parts)


def resolve_columns(
    schema: Mapping[str, Any],
    configuration: Mapping[str, str | None],
    requested: Sequence[str | Sequence[str]],
    *,
    label: str,
    uri: str,
    partition_columns: Sequence[str] = (),
) -> list[ColumnPath]:
    """``requested`` clustering columns as physical paths, checked as delta-spark does:
    existing, at most :data:`MAX_COLUMNS`, no duplicates, of a type with min/max stats,
    among the columns stats are collected for, and not on a partitioned table."""
    if partition_columns and requested:
        raise InvalidOptionError(
            f"CLUSTER BY on {label}: a Delta table cannot be both partitioned (by"
            f" {', '.join(partition_columns)}) and clustered. Drop PARTITIONED BY /"
            " partitionBy, or cluster a table that is not partitioned.",
            option="clusterBy",
        )
    if len(requested) > MAX_COLUMNS:
        raise InvalidOptionError(
            f"CLUSTER BY on {label} names {len(requested)} columns; at most {MAX_COLUMNS}"
            " clustering columns are allowed. Keep the columns queries filter on most.",
            option="clusterBy",
        )
    indexed = _schema.leaf_columns(dict(schema), _stats.num_indexed_cols(dict(configuration)))
    indexed_lower = {tuple(p.lower() for p in path) for path in indexed}
    seen: set[ColumnPath] = set()
    out: list[ColumnPath] = []
    for item in requested:
        path = parse_column(item) if isinstance(item, str) else tuple(item)
        logical, physical, type_json = _find(schema, path, label, uri)
        key = tuple(p.lower() for p in logical)
        if key in seen:
            raise InvalidOptionError(
                f"CLUSTER BY on {label} names {'.'.join(logical)} twice.", option="clusterBy"
            )
        seen.add(key)
        kind = type_json if isinstance(type_json, str) else str(type_json.get("type"))
        if kind in _UNCLUSTERABLE:
            raise InvalidOptionError(
                f"CLUSTER BY on {label}: column {'.'.join(logical)} is of type {kind}, which"
                " has no min/max statistics to skip files by. Cluster by numeric, string,"
                " date or timestamp columns.",
                option="clusterBy",
            )
        if key not in indexed_lower:
            raise InvalidOptionError(
                f"CLUSTER BY on {label}: column {'.'.join(logical)} is not among the first"
                " delta.dataSkippingNumIndexedCols columns, so files carry no statistics"
                " for it. Move it forward or raise delta.dataSkippingNumIndexedCols.",
                option="clusterBy",
            )
        out.append(physical)
    return out


def _find(
    schema: Mapping[str, Any], path: ColumnPath, label: str, uri: str
) -> tuple[ColumnPath, ColumnPath, Any]:
    fields: list[dict[str, Any]] = list(schema.get("fields", []))
    logical: list[str] = []
    physical: list[str] = []
    type_json: Any = None
    for depth, part in enumerate(path):
        found = next((f for f in fields if f["name"].lower() == part.lower()), None)
        if found is None:
            names = ", ".join(".".join(p) for p in _schema.leaf_columns(dict(schema)))
            raise InvalidOptionError(
                f"CLUSTER BY on {label}: there is no column {'.'.join(path)} (columns: {names}).",
                option="clusterBy",
                valid=tuple(".".join(p) for p in _schema.leaf_columns(dict(schema))),
            )
        logical.append(found["name"])
        physical.append(found.get("metadata", {}).get(_schema.PHYSICAL_NAME_KEY, found["name"]))
        type_json = found["type"]
        if depth < len(path) - 1:
            if not (isinstance(type_json, dict) and type_json.get("type") == "struct"):
                raise InvalidOptionError(
                    f"CLUSTER BY on {label}: {'.'.join(logical)} is not a struct.",
                    option="clusterBy",
                )
            fields = type_json["fields"]
    return tuple(logical), tuple(physical), type_json


def logical_names(schema: Mapping[str, Any], physical: Sequence[ColumnPath]) -> list[str]:
    """Physical clustering paths as dotted logical names (DESCRIBE DETAIL's form)."""
    out = []
    for path in physical:
        fields: list[dict[str, Any]] = list(schema.get("fields", []))
        names: list[str] = []
        for part in path:
            found = next(
                (
                    f
                    for f in fields
                    if f.get("metadata", {}).get(_schema.PHYSICAL_NAME_KEY, f["name"]) == part
                ),
                None,
            )
            if found is None:  # a column dropped since: show the stored name
                names.append(part)
                fields = []
                continue
            names.append(found["name"])
            t = found["type"]
            fields = t["fields"] if isinstance(t, dict) and t.get("type") == "struct" else []
        out.append(".".join(names))
    return out


# ---- reading the domain ------------------------------------------------------------------


def read_domains(uri: str, version: int | None = None) -> dict[str, dict[str, Any]]:
    """The live (not removed) metadata domains of the table at ``version`` (latest when
    None): the newest checkpoint at or before it, then the JSON commits after it."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = _uri.filesystem(uri)
    log_dir = f"{root.rstrip('/')}/_delta_log"
    infos = fs.get_file_info(pafs.FileSelector(log_dir))
    commits: list[int] = []
    checkpoints: dict[int, list[str]] = {}
    for info in infos:
        name = info.base_name
        if not name[:20].isdigit():
            continue
        v = int(name[:20])
        if version is not None and v > version:
            continue
        if name.endswith(".json") and len(name) == 25:
            commits.append(v)
        elif ".checkpoint" in name and name.endswith(".parquet"):
            checkpoints.setdefault(v, []).append(info.path)
    domains: dict[str, dict[str, Any]] = {}
    floor = -1
    if checkpoints:
        floor = max(checkpoints)
        for path in sorted(checkpoints[floor]):
            with fs.open_input_file(path) as handle:
                table = pq.read_table(handle)
            if "domainMetadata" not in table.column_names:
                continue
            for row in table.column("domainMetadata").to_pylist():
                if row:
                    domains[row["domain"]] = row
    for v in sorted(c for c in commits if c > floor):
        with fs.open_input_stream(f"{log_dir}/{v:020d}.json") as handle:
            text = handle.read().decode("utf-8")
        for line in text.splitlines():
            if '"domainMetadata"' not in line:
                continue
            action = json.loads(line).get("domainMetadata")
            if action:
                domains[action["domain"]] = action
    return {k: v for k, v in domains.items() if not v.get("removed")}


def physical_columns(uri: str, version: int | None = None) -> list[ColumnPath]:
    """The clustering columns the ``delta.clustering`` domain records ([] when none)."""
    action = read_domains(uri, version).get(DOMAIN)
    if action is None:
        return []
    columns = json.loads(action.get("configuration") or "{}").get("clusteringColumns") or []
    # PROTOCOL.md's example lists plain names; delta-spark writes paths. Read both.
    return [tuple(c) if isinstance(c, list) else parse_column(str(c)) for c in columns]


def clustering_columns(
    uri: str, schema: Mapping[str, Any], writer_features: Sequence[str], version: int | None = None
) -> list[str]:
    """A table's clustering columns as logical dotted names ([] when not clustered)."""
    if not is_clustered(writer_features):
        return []
    return logical_names(schema, physical_columns(uri, version))


# ---- creating and replacing clustered tables ----------------------------------------------


def new_protocol(
    configuration: Mapping[str, str | None], schema: Mapping[str, Any], current: Protocol | None
) -> Protocol:
    """The protocol of a clustered table: the features its metadata uses plus
    ``clustering`` and ``domainMetadata`` (writer version 7)."""
    base = current or Protocol(1, 2)
    used = features_in_use(configuration, schema)
    if not current:
        base = base.with_features(used & {"columnMapping", "changeDataFeed", "checkConstraints"})
    return base.with_features(FEATURES, used)


def metadata_action(
    *,
    schema: Mapping[str, Any],
    partition_columns: Sequence[str],
    configuration: Mapping[str, str],
    name: str | None = None,
    description: str | None = None,
    table_id: str | None = None,
    created_time: int | None = None,
) -> dict[str, Any]:
    action: dict[str, Any] = {
        "id": table_id or str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema, separators=(",", ":")),
        "partitionColumns": list(partition_columns),
        "configuration": dict(configuration),
        "createdTime": created_time if created_time is not None else int(time.time() * 1000),
    }
    if name:
        action["name"] = name
    if description is not None:
        action["description"] = description
    return action


def write_version_zero(
    uri: str,
    *,
    metadata: Mapping[str, Any],
    protocol: Protocol,
    domains: Sequence[Mapping[str, Any]],
    adds: Sequence[Mapping[str, Any]] = (),
    operation: str = "CREATE TABLE",
    parameters: Mapping[str, Any] | None = None,
    metrics: Mapping[str, str] | None = None,
    extra_info: Mapping[str, Any] | None = None,
    app_transaction: tuple[str, int] | None = None,
) -> int:
    """Create the table at ``uri`` as version 0 (protocol, metadata, domains, files, and
    the writer's app transaction ``(appId, version)`` when it has one).
    :class:`TableAlreadyExistsError` if another writer created it first."""
    log_dir = _log_commit.log_location(uri, f"Creating the table ({operation})")
    now = int(time.time() * 1000)
    info = {
        "timestamp": now,
        "operation": operation,
        "operationParameters": dict(parameters or {}),
        "isolationLevel": _log_commit.ISOLATION_LEVEL,
        "isBlindAppend": True,
        "operationMetrics": dict(metrics or {"numFiles": str(len(adds))}),
        "engineInfo": _log_commit.engine_info(),
        "txnId": str(uuid.uuid4()),
        **dict(extra_info or {}),
    }
    transaction = (
        [{"txn": {"appId": app_transaction[0], "version": app_transaction[1], "lastUpdated": now}}]
        if app_transaction is not None
        else []
    )
    actions: list[dict[str, Any]] = [
        {"commitInfo": info},
        {"protocol": protocol.to_action()},
        {"metaData": dict(metadata)},
        *transaction,
        *({"domainMetadata": dict(d)} for d in domains),
        *({"add": dict(a)} for a in adds),
    ]
    payload = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
    if not _log_commit.put_version(log_dir, 0, payload.encode("utf-8")):
        raise TableAlreadyExistsError(
            f"A Delta table was created at {uri} by another writer while this one created it."
            " Retry: the statement will then see the existing table.",
            table_uri=uri,
        )
    return 0


def refuse_object_store(uri: str, label: str) -> None:
    """Clustered tables are committed by deltaflow's log writer: refuse a store where it
    has no conditional put."""
    _log_commit.require_conditional_put(uri, f"CLUSTER BY on {label}")
