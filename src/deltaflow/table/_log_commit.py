"""A Delta commit writer for what delta-rs's Python API cannot express.

delta-rs 1.6 commits ``add`` / ``remove`` actions only, and its ``remove`` has no
``deletionVector``. DML needs both more: ``cdc`` actions (change data feed) and
removes of files that carry deletion vectors. This module writes the log entry
itself, on local tables and object stores alike:

* **Atomic put-if-absent.** ``<version:020>.json`` is created only if absent
  (:mod:`deltaflow.table._conditional_put`): on a local path a temporary file hard-linked
  to the name, on S3 / GCS / Azure a PUT with ``If-None-Match: *``, the request delta-rs
  commits with. Exactly one writer wins a version, and readers never see a partial file.
* **Conflicts by delta-spark's rules (WriteSerializable), without a listing.** The first
  attempt takes ``read_version + 1``; a lost race reads the versions written since by
  name, checks each against what this transaction read and removed
  (:func:`check_conflict`) and retries at the next free version, at most
  :data:`MAX_ATTEMPTS` times. ``_delta_log`` is never listed on the commit path.
* **Checkpoints and expired log cleanup** through :mod:`deltaflow.table._log_upkeep`
  when the new version is a multiple of ``delta.checkpointInterval`` (default 10,
  delta-spark's), the same versions whichever commit path wrote the table.

A store without a conditional put (e.g. ``hdfs://``) gets a typed
:class:`~deltaflow.table.errors.UnsupportedFeatureError` naming the operation.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import pyarrow.fs as pafs

from deltaflow import _step_times
from deltaflow.table import _conditional_put, _log, _log_upkeep, _uri
from deltaflow.table.errors import (
    ConcurrentWriteError,
    CorruptTableError,
)

log = logging.getLogger(__name__)

# Each lost race means another commit landed and was checked; 15 covers bursts of
# concurrent writers without hiding a livelock (same bound as the delta-rs path).
MAX_ATTEMPTS = 15
# delta-rs's default; delta-spark's is 10. Chosen so both commit paths agree.
DEFAULT_CHECKPOINT_INTERVAL = _log_upkeep.DEFAULT_CHECKPOINT_INTERVAL
ISOLATION_LEVEL = "WriteSerializable"

_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
# java.net.URI keeps these in a path unescaped; Spark and delta-rs write log paths so.
_PATH_SAFE = "/!'()*,;:$&+=@"

PartitionPredicate = Callable[[Mapping[str, str | None]], bool]


def engine_info() -> str:
    from deltaflow import __version__

    return f"deltaflow/{__version__}"


def encode_path(relative: str) -> str:
    """A relative file path as the log stores it (URI-encoded)."""
    return quote(relative, safe=_PATH_SAFE)


@dataclass(frozen=True)
class ReadSet:
    """What a transaction read, for conflict detection (delta-spark's readFiles/readPredicates).

    ``files``: log paths of the files it read. ``partition_predicate``: True for the
    raw ``partitionValues`` of an added file it would have read; None means any
    partition. ``blind_append``: it read nothing (never conflicts on appends).
    """

    files: frozenset[str] = frozenset()
    partition_predicate: PartitionPredicate | None = None
    blind_append: bool = False
    whole_table: bool = False  # read every file unfiltered: any concurrent remove conflicts


@dataclass(frozen=True)
class LogCommitRequest:
    """One commit: actions as the protocol's JSON objects, plus what the transaction read."""

    table_uri: str
    read_version: int
    operation: str
    operation_parameters: Mapping[str, Any] = field(default_factory=dict)
    operation_metrics: Mapping[str, str] = field(default_factory=dict)
    adds: Sequence[Mapping[str, Any]] = ()
    removes: Sequence[Mapping[str, Any]] = ()
    cdc: Sequence[Mapping[str, Any]] = ()
    metadata: Mapping[str, Any] | None = None
    protocol: Mapping[str, Any] | None = None  # a protocol upgrade, committed with metadata
    # domainMetadata actions (e.g. delta.clustering); two commits writing one domain conflict.
    domain_metadata: Sequence[Mapping[str, Any]] = ()
    app_id: str | None = None
    app_version: int | None = None
    more_transactions: Sequence[tuple[str, int]] = ()  # further txn actions, (app id, version)
    read: ReadSet = field(default_factory=ReadSet)
    partitioned: bool = True
    extra_commit_info: Mapping[str, Any] = field(default_factory=dict)
    # Versions this transaction wrote itself before (e.g. a schema change): not conflicts.
    own_versions: frozenset[int] = frozenset()
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    # Told every version this commit learns, in order: each winner read by name after a
    # lost put (before its conflict check) and then its own, with their actions (a
    # writer's log head moves on from them, :mod:`deltaflow.table._log_head`). Must not
    # raise: it runs after the put too.
    on_version: Callable[[int, Sequence[Mapping[str, Any]]], None] | None = field(
        default=None, compare=False
    )


@dataclass(frozen=True)
class Conflict:
    kind: str
    version: int
    detail: str


def commit(request: LogCommitRequest) -> int:
    """Write ``request`` as the next version; the version it got. Raises
    :class:`ConcurrentWriteError` on a conflict, nothing written.

    Nothing is listed: the first attempt takes ``read_version + 1`` by put-if-absent. A
    lost race reads the versions written since by name (``N+1, N+2, ...`` until one is
    absent), checks each for conflicts and tries the next free one. So a commit costs
    the same on a log of ten versions as on one of millions, and on an object store it is
    GETs and a conditional PUT, never a LIST.
    """
    log_dir = log_location(request.table_uri)
    checked = request.read_version  # every version up to here is checked (or ours)
    ours = _ours(request)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        if attempt > 1:
            with _step_times.step("conflict scan"):
                checked = _check_written_since(request, log_dir, checked, ours, attempt)
        target = checked + 1
        actions = _actions(request, target)
        if put_version(log_dir, target, _encode(actions)):
            if request.on_version is not None:
                request.on_version(target, actions)
            log.info(
                "committed %s to %s as version %d (read %d, attempt %d)",
                request.operation,
                request.table_uri,
                target,
                request.read_version,
                attempt,
            )
            with _step_times.step("upkeep"):
                _log_upkeep.after_commit(
                    request.table_uri,
                    target,
                    checkpoint_interval=request.checkpoint_interval,
                )
            return target
        log.info(
            "version %d of %s was taken by another writer; checking it and retrying",
            target,
            request.table_uri,
        )
    raise ConcurrentWriteError(
        f"Commit of {request.operation} to {request.table_uri} lost the race for a version"
        f" {MAX_ATTEMPTS} times in a row. Nothing was committed; retry the operation.",
        table_uri=request.table_uri,
        kind="ConcurrentTransaction",
        read_version=request.read_version,
        attempts=MAX_ATTEMPTS,
    )


def _check_written_since(
    request: LogCommitRequest, log_dir: str, checked: int, ours: _Ours, attempt: int
) -> int:
    """Conflict-check every version after ``checked``, read by name until one is absent;
    the newest version checked."""
    while (actions := read_actions_if_present(log_dir, checked + 1)) is not None:
        checked += 1
        if request.on_version is not None:
            request.on_version(checked, actions)
        if checked in request.own_versions:
            continue
        found = check_conflict(actions, checked, ours)
        if found is not None:
            raise _conflict_error(request, found, attempt)
    return checked


@dataclass(frozen=True)
class _Ours:
    read: ReadSet
    removed: frozenset[str]
    app_ids: frozenset[str]
    metadata_changed: bool
    partitioned: bool
    domains: frozenset[str] = frozenset()


def _ours(request: LogCommitRequest) -> _Ours:
    return _Ours(
        read=request.read,
        removed=frozenset(unquote(r["path"]) for r in request.removes),
        app_ids=frozenset(
            ([request.app_id] if request.app_id is not None else [])
            + [app_id for app_id, _ in request.more_transactions]
        ),
        metadata_changed=request.metadata is not None or request.protocol is not None,
        partitioned=request.partitioned,
        domains=frozenset(str(d["domain"]) for d in request.domain_metadata),
    )


def check_conflict(
    actions: Sequence[Mapping[str, Any]], version: int, ours: _Ours
) -> Conflict | None:
    """delta-spark's ConflictChecker (WriteSerializable) for one winning commit."""
    info: Mapping[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    operation = info.get("operation", "unknown")
    if any("protocol" in a for a in actions):
        return Conflict("ProtocolChanged", version, f"{operation} changed the protocol")
    if any("metaData" in a for a in actions):
        return Conflict("MetadataChanged", version, f"{operation} changed the table metadata")
    for action in actions:
        domain = (action.get("domainMetadata") or {}).get("domain")
        if domain is not None and domain in ours.domains:
            return Conflict("MetadataChanged", version, f"{operation} changed domain {domain}")
    for action in actions:
        txn = action.get("txn")
        if txn is not None and txn.get("appId") in ours.app_ids:
            return Conflict(
                "ConcurrentTransaction", version, f"app transaction {txn.get('appId')} advanced"
            )
    if not ours.read.blind_append:
        blind = is_blind_append(info, actions)
        for action in actions:
            add = action.get("add")
            if add is None:
                continue
            # WriteSerializable: blind appends and dataChange=false rewrites (OPTIMIZE)
            # are ordered after this transaction; other new data it should have read.
            counts = ours.metadata_changed or (not blind and add.get("dataChange", True))
            if counts and _in_read_partitions(add, ours):
                return Conflict(
                    "ConcurrentAppend",
                    version,
                    f"{operation} added {add['path']}, which this operation would have read",
                )
    removed = [unquote(a["remove"]["path"]) for a in actions if "remove" in a]
    read_files = {unquote(p) for p in ours.read.files}
    for path in removed:
        if path in read_files:
            return Conflict(
                "ConcurrentDeleteRead", version, f"{operation} removed {path}, which this read"
            )
    if removed and ours.read.whole_table:
        return Conflict(
            "ConcurrentDeleteRead", version, f"{operation} removed files of a table this read whole"
        )
    for path in removed:
        if path in ours.removed:
            return Conflict("ConcurrentDeleteDelete", version, f"{operation} also removed {path}")
    return None


def is_blind_append(info: Mapping[str, Any], actions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a commit only appended without reading the table.

    delta-spark records ``isBlindAppend``; delta-rs does not, and marks an append by
    ``operationParameters.mode`` (``outputMode`` for streaming) ``Append``.
    """
    recorded = info.get("isBlindAppend")
    if recorded is not None:
        return bool(recorded)
    if any("remove" in a for a in actions) or "readVersion" in info:
        return False
    parameters = info.get("operationParameters") or {}
    mode = parameters.get("mode") or parameters.get("outputMode")
    return info.get("operation") in _APPEND_OPERATIONS and str(mode).lower() == "append"


_APPEND_OPERATIONS = ("WRITE", "STREAMING UPDATE", "CREATE TABLE")


def _in_read_partitions(add: Mapping[str, Any], ours: _Ours) -> bool:
    predicate = ours.read.partition_predicate
    if predicate is None or not ours.partitioned:
        return True
    try:
        return bool(predicate(add.get("partitionValues") or {}))
    except Exception:  # a value we cannot evaluate: assume it was read (conservative)
        return True


def _conflict_error(
    request: LogCommitRequest, found: Conflict, attempt: int
) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"{request.operation} on {request.table_uri} conflicted with version {found.version}"
        f" ({found.kind}): {found.detail}. Nothing was committed; retry the operation on the"
        " current version of the table.",
        table_uri=request.table_uri,
        kind=found.kind,
        read_version=request.read_version,
        attempts=attempt,
    )


def _encode(actions: Sequence[Mapping[str, Any]]) -> bytes:
    text = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
    return text.encode("utf-8")


def _actions(request: LogCommitRequest, version: int) -> list[dict[str, Any]]:
    """The actions of ``request`` committed as ``version``."""
    now_ms = int(time.time() * 1000)
    is_blind = request.read.blind_append and not request.removes
    info: dict[str, Any] = {
        "timestamp": now_ms,
        "operation": request.operation,
        "operationParameters": dict(request.operation_parameters),
        "readVersion": request.read_version,
        "isolationLevel": ISOLATION_LEVEL,
        "isBlindAppend": is_blind,
        "operationMetrics": dict(request.operation_metrics),
        "engineInfo": engine_info(),
        "txnId": str(uuid.uuid4()),
    }
    info.update(request.extra_commit_info)
    actions: list[dict[str, Any]] = [{"commitInfo": info}]
    if request.protocol is not None:
        actions.append({"protocol": dict(request.protocol)})
    if request.metadata is not None:
        actions.append({"metaData": dict(request.metadata)})
    actions.extend({"domainMetadata": dict(d)} for d in request.domain_metadata)
    if request.app_id is not None and request.app_version is not None:
        actions.append(
            {
                "txn": {
                    "appId": request.app_id,
                    "version": request.app_version,
                    "lastUpdated": now_ms,
                }
            }
        )
    actions.extend(
        {"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}}
        for app_id, version in request.more_transactions
    )
    actions.extend({"add": dict(a)} for a in request.adds)
    actions.extend({"remove": {"deletionTimestamp": now_ms, **r}} for r in request.removes)
    actions.extend({"cdc": dict(c)} for c in request.cdc)
    return actions


def create_table(
    table_uri: str,
    *,
    schema: Mapping[str, Any],
    partition_columns: Sequence[str],
    configuration: Mapping[str, str],
    protocol: Mapping[str, Any],
    adds: Sequence[Mapping[str, Any]] = (),
    name: str | None = None,
    description: str | None = None,
    operation: str = "CREATE TABLE",
    operation_parameters: Mapping[str, Any] | None = None,
    operation_metrics: Mapping[str, str] | None = None,
    domains: Sequence[Mapping[str, Any]] = (),
    created_time: int | None = None,
    extra_commit_info: Mapping[str, Any] | None = None,
) -> bool:
    """Write version 0 of a new local table with exactly ``protocol``; False when a
    version 0 exists already (nothing written). ``created_time``: the metadata's (now
    when None); ``extra_commit_info``: commitInfo fields over the defaults.

    Used where delta-rs would write a protocol listing features the table does not use
    (:func:`deltaflow.table._protocol.protocol_for_new_table`).
    """
    log_dir = log_location(table_uri, "Creating a table with deletion vectors enabled")
    now_ms = int(time.time() * 1000)
    # The operation's own parameters; CREATE TABLE's (the default) name the partitioning.
    parameters = (
        dict(operation_parameters)
        if operation_parameters is not None
        else {"partitionBy": json.dumps(list(partition_columns))}
    )
    info = {
        "timestamp": now_ms,
        "operation": operation,
        "operationParameters": parameters,
        "isolationLevel": ISOLATION_LEVEL,
        "isBlindAppend": True,
        "operationMetrics": dict(operation_metrics or {"numFiles": str(len(adds))}),
        "engineInfo": engine_info(),
        "txnId": str(uuid.uuid4()),
        **(extra_commit_info or {}),
    }
    metadata = {
        "id": str(uuid.uuid4()),
        "name": name,
        "description": description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(dict(schema), separators=(",", ":")),
        "partitionColumns": list(partition_columns),
        "configuration": dict(configuration),
        "createdTime": now_ms if created_time is None else created_time,
    }
    actions: list[dict[str, Any]] = [
        {"commitInfo": info},
        {"protocol": dict(protocol)},
        {"metaData": metadata},
    ]
    actions.extend({"domainMetadata": dict(d)} for d in domains)
    actions.extend({"add": dict(a)} for a in adds)
    text = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
    return put_version(log_dir, 0, text.encode("utf-8"))


def put_version(log_dir: str, version: int, payload: bytes) -> bool:
    # False means the version is taken: the caller re-checks the winner and retries.
    return _conditional_put.put_if_absent(_uri.join(log_dir, f"{version:020d}.json"), payload)


def checkpoint_interval(configuration: Mapping[str, str | None]) -> int:
    return _log_upkeep.checkpoint_interval(configuration)


def require_conditional_put(table_uri: str, why: str) -> None:
    """Refuse ``why`` (an operation) on a store where this writer cannot commit safely."""
    if not _conditional_put.supported(table_uri):
        raise _conditional_put.unsupported(table_uri, f"{why} on")


def log_location(table_uri: str, why: str = "This commit") -> str:
    """The table's ``_delta_log``: a plain path for local tables (created if missing), a
    URI on object stores (where folders need no creating)."""
    require_conditional_put(table_uri, why)
    if _uri.is_local(table_uri):
        log_dir = os.path.join(_uri.local_path(table_uri), "_delta_log")
        os.makedirs(log_dir, exist_ok=True)
        return log_dir
    return _uri.join(table_uri, "_delta_log")


def _list_names(log_dir: str) -> list[str]:
    if _uri.is_local(log_dir):
        return os.listdir(log_dir)
    fs, path = _uri.filesystem(log_dir)
    entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return [e.base_name for e in entries]


def latest_version(log_dir: str) -> int:
    versions = [int(m.group(1)) for n in _list_names(log_dir) if (m := _COMMIT_NAME.match(n))]
    if versions:
        return max(versions)
    last = _log.last_checkpoint(_uri.normalize_uri(log_dir.rstrip("/").rsplit("/", 1)[0]))
    if last is None:
        raise CorruptTableError(f"{log_dir} holds no commit", table_uri=log_dir, path=log_dir)
    return last


def read_actions(log_dir: str, version: int) -> list[dict[str, Any]]:
    actions = read_actions_if_present(log_dir, version)
    if actions is None:
        raise CorruptTableError(
            f"Commit {version} is missing from {log_dir} (log cleanup ran while this"
            " operation was in flight?). Retry the operation.",
            table_uri=log_dir,
            path=_uri.join(log_dir, f"{version:020d}.json"),
        )
    return actions


def read_actions_if_present(log_dir: str, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version`` read by its name (a GET on object stores, never a
    listing); None when no such commit exists."""
    path = _uri.join(log_dir, f"{version:020d}.json")
    try:
        if _uri.is_local(path):
            with open(_uri.local_path(path), "rb") as local:
                data = local.read()
        else:
            fs, inner = _uri.filesystem(path)
            with fs.open_input_stream(inner) as f:
                data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if "does not exist" in str(exc) or "not found" in str(exc).lower():
            return None  # some pyarrow stores report a missing key as a plain OSError
        raise
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def add_actions_of(table_uri: str, version: int, paths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The ``add`` actions live at ``version`` for ``paths`` (log form), read from the log.

    delta-rs does not expose ``deletionVector`` of adds; a remove must repeat it. The
    newest JSON commits are read first (a file that got a DV was re-added recently),
    then the newest checkpoint at or before ``version``.
    """
    log_dir = log_location(table_uri)
    wanted = {unquote(p): p for p in paths}
    found: dict[str, dict[str, Any]] = {}
    checkpoint = newest_checkpoint(log_dir, version)
    floor = checkpoint[0] if checkpoint else -1
    for v in range(version, floor, -1):
        if not wanted:
            break
        try:
            actions = read_actions(log_dir, v)
        except CorruptTableError:
            break
        for action in actions:
            add = action.get("add")
            if add is not None and unquote(add["path"]) in wanted:
                found[wanted.pop(unquote(add["path"]))] = add
    if wanted and checkpoint is not None:
        found.update(_adds_from_checkpoint(checkpoint[1], wanted))
    return found


def newest_checkpoint(log_dir: str, version: int) -> tuple[int, list[str]] | None:
    by_version: dict[int, list[str]] = {}
    for name in _list_names(log_dir):
        if ".checkpoint" in name and name.endswith(".parquet") and name[:20].isdigit():
            v = int(name[:20])
            if v <= version:
                by_version.setdefault(v, []).append(_uri.join(log_dir, name))
    if not by_version:
        return None
    best = max(by_version)
    return best, sorted(by_version[best])


def checkpoint_parts(files: list[str]) -> list[str]:
    """A checkpoint's files and, for a v2 checkpoint, the sidecar files that hold its
    file actions."""
    parts = list(files)
    for path in files:
        table = read_parquet(path)
        if "sidecar" in table.column_names:
            folder = path.rsplit("/", 1)[0]
            for row in table.column("sidecar").to_pylist():
                if row:
                    parts.append(_uri.join(folder, f"_sidecars/{row['path']}"))
    return parts


def _adds_from_checkpoint(files: list[str], wanted: dict[str, str]) -> dict[str, dict[str, Any]]:

    found: dict[str, dict[str, Any]] = {}
    for path in checkpoint_parts(files):
        table = read_parquet(path, columns=["add"])
        for add in table.column("add").to_pylist():
            if add and unquote(add["path"]) in wanted:
                clean = {k: v for k, v in add.items() if v is not None}
                for key in ("partitionValues", "tags"):
                    if isinstance(clean.get(key), list):  # parquet maps come back as pairs
                        clean[key] = dict(clean[key])
                found[wanted.pop(unquote(add["path"]))] = clean
    return found


def read_parquet(path: str, columns: list[str] | None = None) -> Any:
    import pyarrow.parquet as pq

    fs, inner = _uri.filesystem(path)
    return pq.read_table(inner, columns=columns, filesystem=fs)
