"""What each bridge operation does (see :mod:`deltaflow.spark.bridge._server` for the interface).

Everything here runs in the brain process the JVM connector started, on the driver:
no Spark session, no pyspark DataFrame. The Delta rules are the table layer's and the
planning functions the Python data source uses; this module only translates between
them and the JSON the JVM sends.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from deltalake import DeltaTable

from deltaflow.spark._options import (
    CHECKED_CONSTRAINTS_OPTION,
    IDENTITY_GENERATED_OPTION,
    READ_MARKER_OPTION,
    SAVE_MODE_OPTION,
    STREAM_READ_OPTIONS,
    parse_read_options,
    parse_stream_options,
    parse_write_options,
)
from deltaflow.spark.bridge import _snapshots
from deltaflow.spark.errors import BridgeError
from deltaflow.spark.read._native import NATIVE_SCAN_CONF, hadoop_opens, native_scan_mode
from deltaflow.spark.stream._writer import commit_batch
from deltaflow.spark.write import _files, _generated
from deltaflow.spark.write._direct import collect_direct, reported_files, writes_direct
from deltaflow.spark.write._native import (
    _ESCAPE,
    STAGING_DIR,
    NativeWrite,
    _staged_partition_values,
    collect_staged,
    plan_native_write,
    rows_in,
)
from deltaflow.spark.write._plan import WritePlan
from deltaflow.spark.write._plan import plan_write as plan_table_write
from deltaflow.spark.write._writer import commit_request
from deltaflow.table import (
    _commit,
    _constraints,
    _generated_pruning,
    _partitions,
    _pruning,
    _schema,
    _uri,
)
from deltaflow.table._snapshot import (
    Snapshot,
    catch_up,
    open_latest,
    snapshot_of_table,
    table_exists,
    table_not_found,
)
from deltaflow.table.errors import (
    SchemaMismatchError,
    TableNotFoundError,
    UnsupportedFeatureError,
)

# Reader features the JVM scan does not implement yet. (typeWidening it does: Spark's
# Parquet reader promotes int -> long / double, float -> double and widens decimals.)
_PYTHON_READ_FEATURES: frozenset[str] = frozenset()
_EMPTY_SCHEMA: dict[str, Any] = {"type": "struct", "fields": []}


def options_of(args: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (args.get("options") or {}).items()}


def _get(options: dict[str, str], key: str) -> str | None:
    lowered = key.lower()
    return next((v for k, v in options.items() if k.lower() == lowered), None)


def _path(options: dict[str, str], operation: str) -> str:
    path = _get(options, "path")
    if not path:
        raise BridgeError(
            "format('delta') needs a table location: .load('/path/to/table') or"
            " .save('/path/to/table').",
            operation=operation,
        )
    return _uri.normalize_uri(path)


def table_path(args: dict[str, Any], operation: str) -> str:
    """The table location an operation's ``options`` name, normalized."""
    return _path(options_of(args), operation)


def load_table(args: dict[str, Any]) -> dict[str, Any]:
    """``table.load``: lenient about options, since Spark asks for the table of a write
    too (with the write's options); the scan checks read options strictly.

    A missing table answers ``exists: false`` (a write creates it), except for a read the
    classic reader marked (:data:`READ_MARKER_OPTION`): that raises ``TableNotFoundError``
    here, in ``load()``, as delta-spark does."""
    options = options_of(args)
    uri = _path(options, "table.load")
    if any(k.lower() in _STREAM_ONLY for k in options):
        # A stream's options fail where the stream is defined (readStream...load()), not
        # in the query's thread after start().
        parse_stream_options({**options, "path": uri})
    conf = args.get("conf") or {}
    version = _get(options, "versionAsOf")
    timestamp = _get(options, "timestampAsOf")
    route, reason = _route(uri, options, conf)
    read = parse_read_options({k: v for k, v in options.items() if k.lower() in _TIME_TRAVEL})
    travel = version is not None or timestamp is not None
    must_exist = travel or (_get(options, READ_MARKER_OPTION) or "").lower() == "true"
    try:
        # One log load, no existence check before it (on an object store: a LIST fewer);
        # no log at all is no table, and any other failure asks, as the check did.
        snapshot = _snapshots.snapshot(
            uri, version=read.version_as_of, timestamp=read.timestamp_as_of
        )
    except TableNotFoundError:
        if must_exist:
            raise
        return _answer(uri, -1, False, _EMPTY_SCHEMA, _EMPTY_SCHEMA, (), route, reason)
    except Exception as exc:
        if travel or table_exists(uri):
            raise
        if must_exist:
            raise table_not_found(uri) from exc
        return _answer(uri, -1, False, _EMPTY_SCHEMA, _EMPTY_SCHEMA, (), route, reason)
    features = _PYTHON_READ_FEATURES.intersection(snapshot.reader_features)
    if route == "jvm" and features:
        route, reason = "python", f"reader feature {sorted(features)[0]!r}"
    elif reason == _FEED_REASON and features:
        reason = f"{_FEED_REASON}, reader feature {sorted(features)[0]!r}"
    if route == "python" and _schema.holds_type(snapshot.schema, "variant"):
        raise UnsupportedFeatureError(
            f"Table {snapshot.uri} has VARIANT columns, which only deltaflow's connector reads,"
            f" and this read needs the Python data source ({reason}). Read it without that"
            " (VARIANT tables on object stores and their change feed are not supported yet).",
            table_uri=snapshot.uri,
            feature="variantType",
        )
    return _answer(
        snapshot.uri,
        snapshot.version,
        True,
        _schema.read_schema(snapshot.schema),
        _schema.physical_schema(snapshot.schema),
        snapshot.partition_columns,
        route,
        reason,
        snapshot,
    )


_STREAM_ONLY = frozenset(k.lower() for k in STREAM_READ_OPTIONS if k not in ("readChangeFeed",))
_TIME_TRAVEL = frozenset({"path", "versionasof", "timestampasof"})


_FEED_REASON = "change data feed"


def _route(uri: str, options: dict[str, str], conf: dict[str, str]) -> tuple[str, str]:
    scheme = urlparse(uri).scheme
    if not hadoop_opens(uri):
        return "python", f"{scheme}:// is not a filesystem Spark's Hadoop layer opens here"
    for key in ("readChangeFeed", "readChangeData"):
        if (_get(options, key) or "").lower() == "true":
            native = native_scan_mode(conf.get(NATIVE_SCAN_CONF)) != "false"
            return "python", _FEED_REASON if native else f"{_FEED_REASON}, {NATIVE_SCAN_CONF}=false"
    if native_scan_mode(conf.get(NATIVE_SCAN_CONF)) == "false":
        return "python", f"{NATIVE_SCAN_CONF}=false"
    return "jvm", ""


def _answer(
    uri: str,
    version: int,
    exists: bool,
    logical: dict[str, Any],
    physical: dict[str, Any],
    partition_columns: tuple[str, ...],
    route: str,
    reason: str,
    snapshot: Snapshot | None = None,
) -> dict[str, Any]:
    """What the connector's ``TableInfo`` holds: the table as this read sees it."""
    return {
        "uri": uri,
        "version": version,
        "exists": exists,
        "schema": logical,
        "physicalSchema": physical,
        "partitionColumns": list(partition_columns),
        "deletionVectors": snapshot is not None and snapshot.has_deletion_vectors_enabled,
        "route": route,
        "routeReason": reason,
        # Python only for the feed: the connector's real-time reader can read it.
        "jvmChangeFeed": route == "python" and reason == _FEED_REASON,
        "configuration": {
            k: v for k, v in (snapshot.configuration if snapshot else {}).items() if v is not None
        },
        "description": snapshot.description if snapshot else None,
        "protocol": _protocol_properties(snapshot) if snapshot else {},
    }


def _protocol_properties(snapshot: Snapshot) -> dict[str, str]:
    """The protocol as delta-spark's ``SHOW TBLPROPERTIES`` lists it."""
    out = {
        "delta.minReaderVersion": str(snapshot.min_reader_version),
        "delta.minWriterVersion": str(snapshot.min_writer_version),
    }
    for feature in sorted({*snapshot.reader_features, *snapshot.writer_features}):
        out[f"delta.feature.{feature}"] = "supported"
    return out


def plan_scan(args: dict[str, Any]) -> dict[str, Any]:
    """``scan.plan``: the snapshot's files left after pruning, with deleted rows."""
    options = options_of(args)
    if options:
        # Typed errors for misspelt or invalid read options; a catalog table's scan
        # options do not name its location, the table does.
        parse_read_options({**options, "path": str(args["uri"])})
    version = args.get("version")
    snapshot = _snapshots.snapshot(
        str(args["uri"]), version=None if version is None else int(version)
    )
    _check_columns(snapshot, args.get("columns") or [])
    predicates = [p for p in (to_predicate(f) for f in args.get("filters") or []) if p]
    predicates += _generated_pruning.derived_predicates(
        snapshot.schema, snapshot.partition_columns, predicates
    )
    pruned = _pruning.prune_files(snapshot.files(), predicates, snapshot.partition_columns)
    deleted = snapshot.deleted_rows() if pruned.files else {}
    files = [
        file_item(
            _location(snapshot.uri, entry.path),
            entry.size,
            entry.partition_values,
            deleted.get(entry.path),
            modification_time=entry.modification_time,
        )
        for entry in pruned.files
    ]
    return {
        "version": snapshot.version,
        "files": files,
        "report": {
            "table_uri": snapshot.uri,
            "version": snapshot.version,
            "files_in_snapshot": pruned.files_in_snapshot,
            "files_scanned": len(files),
            "skipped_by_partition": pruned.skipped_by_partition,
            "skipped_by_stats": pruned.skipped_by_stats,
            "bytes_scanned": sum(f["size"] for f in files),
        },
    }


def _location(table_uri: str, log_path: str) -> str:
    """A data file's absolute, percent-decoded location (what Hadoop's ``Path(String)``
    takes) from its path in the log (URI-encoded, relative or absolute)."""
    return _uri.join(table_uri, unquote(log_path))


def file_item(
    location: str,
    size: int,
    partition_values: dict[str, Any],
    deleted: Any = None,
    *,
    modification_time: int | None = None,
) -> dict[str, Any]:
    """One planned file as the connector reads it (``ScanFile`` on the JVM side);
    ``modification_time`` (ms) is its ``_metadata.file_modification_time``."""
    item: dict[str, Any] = {
        "location": location,
        "size": size,
        "partitionValues": {
            k: _partitions.serialize_partition_value(v) for k, v in partition_values.items()
        },
    }
    if deleted is not None and len(deleted):
        item["deleted"] = [int(i) for i in deleted]
    if modification_time is not None:
        item["modificationTime"] = int(modification_time)
    return item


def _check_columns(snapshot: Snapshot, columns: list[str]) -> None:
    """Refuse to read a table that lost columns since the DataFrame was made (delta-spark
    refuses too); columns added since are left out of the DataFrame, as there."""
    present = {f["name"].lower() for f in snapshot.schema["fields"]}
    missing = tuple(c for c in columns if c.lower() not in present)
    if missing:
        raise SchemaMismatchError(
            f"The schema of the Delta table {snapshot.uri} changed since this DataFrame was"
            f" made: version {snapshot.version} has no column {', '.join(missing)}. Read the"
            " table again (spark.read.format('delta').load(...)) to see its new schema.",
            table_uri=snapshot.uri,
            columns=missing,
        )


def to_predicate(node: dict[str, Any]) -> _pruning.Predicate | None:
    """A pushed filter in the connector's JSON form as the table layer's predicate."""
    op = node.get("op")
    if op in ("or", "and"):
        children = tuple(to_predicate(child) for child in node["children"])
        if any(child is None for child in children):
            return None
        kind = _pruning.AnyOf if op == "or" else _pruning.AllOf
        return kind(tuple(c for c in children if c is not None))
    if op == "not":
        child = to_predicate(node["child"])
        return _pruning.Negation(child) if isinstance(child, _pruning.Comparison) else None
    column = tuple(node["column"])
    if op in ("is_null", "is_not_null"):
        return _pruning.Comparison(op, column)
    if op == "in":
        return _pruning.Comparison("in", column, tuple(_value(v) for v in node["value"]))
    if op in ("=", "<=>", ">", ">=", "<", "<=", "starts_with"):
        return _pruning.Comparison(op, column, _value(node["value"]))
    return None


def _value(value: Any) -> Any:
    if isinstance(value, dict):
        if "date" in value:
            return dt.date.fromisoformat(value["date"])
        if "timestamp_us" in value:
            epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
            return epoch + dt.timedelta(microseconds=int(value["timestamp_us"]))
        if "decimal" in value:
            return decimal.Decimal(value["decimal"])
    return value


@dataclass(frozen=True)
class _PendingWrite:
    plan: WritePlan
    native: NativeWrite
    staging_uri: str
    job_id: str
    # A sink's micro-batch: (app id, batch id, the query's id), the app id being the query
    # id unless the stream writes under another identity (a pipeline flow's).
    stream: tuple[str, int, str] | None = None
    table: DeltaTable | None = None  # the sink's table, as the plan saw it
    direct: bool = False  # tasks write final names; write.commit lists them (write/_direct.py)


_pending: dict[str, _PendingWrite] = {}
_pending_lock = threading.Lock()

# A streaming sink's table, per (table, query): loaded once, then moved on with
# update_incremental() each batch. A fresh load per batch reads every commit since the
# last checkpoint (~30 ms at 90 of them, growing); a query's batches run one at a time,
# so its entry is never used by two calls at once. The oldest entries go past the cap.
_SINK_TABLES_KEPT = 64
_sink_tables: OrderedDict[tuple[str, str], DeltaTable] = OrderedDict()
_sink_tables_lock = threading.Lock()


def _sink_table(uri: str, query_id: str) -> DeltaTable | None:
    """The sink's table now (None if there is none yet)."""
    key = (uri, query_id)
    with _sink_tables_lock:
        table = _sink_tables.pop(key, None)
    if table is None:
        if not table_exists(uri):
            return None
        table = open_latest(uri)
    else:
        catch_up(table, uri)
    with _sink_tables_lock:
        _sink_tables[key] = table
        while len(_sink_tables) > _SINK_TABLES_KEPT:
            _sink_tables.popitem(last=False)
    return table


def plan_write(args: dict[str, Any], *, current: Snapshot | None = None) -> dict[str, Any]:
    """``write.plan``: decide the write (typed errors here, before any job runs).
    ``current``: the table as the caller keeps it (a real-time sink's log head); else a
    stream's kept table, or a load."""
    options = options_of(args)
    mode = str(args["mode"])
    incoming = json.loads(args["schema"]) if isinstance(args["schema"], str) else args["schema"]
    conf = {str(k): str(v) for k, v in (args.get("conf") or {}).items()}
    write_options = parse_write_options(options)
    uri = _uri.normalize_uri(write_options.path)
    stream = args.get("stream")
    batch = (
        (
            str(stream["queryId"]),
            int(stream["batchId"]),
            str(stream.get("streamQueryId") or stream["queryId"]),
        )
        if stream
        else None
    )
    table = None
    if current is None:
        table = _sink_table(uri, batch[0]) if batch else None
        current = snapshot_of_table(table, uri) if table is not None else None
    plan = plan_table_write(uri, incoming, mode, write_options, current)
    if plan.skip:
        return {"route": "skip"}
    # Generated / identity values the data lacks are added by the connector first; the
    # rest of the plan sees the data as it will be then.
    generate, incoming = _generated.connector_projection(
        uri, plan.log_schema or plan.schema, incoming
    )
    native = plan_native_write(plan, incoming, lambda key, default: conf.get(key, default), current)
    checked: dict[str, Any] = {"checks": row_guard(plan, incoming)} if plan.checks else {}
    if generate:
        checked["generate"] = generate
    if plan.optimize_write:
        checked["optimizeWrite"] = optimized_write(plan, incoming)
    if not hadoop_opens(uri) or not isinstance(native, NativeWrite):
        delegate = {k: v for k, v in options.items() if k != "__partition_columns"}
        if write_options.partition_by:
            delegate["partitionBy"] = ",".join(write_options.partition_by)
        delegate[SAVE_MODE_OPTION] = mode
        if plan.checks:
            delegate[CHECKED_CONSTRAINTS_OPTION] = _constraints.fingerprint(plan.checks)
        if plan.identity_generated:
            delegate[IDENTITY_GENERATED_OPTION] = ",".join(plan.identity_generated)
        return {"route": "python", "tableUri": uri, "delegateOptions": delegate, **checked}
    job_id = uuid.uuid4().hex[:8]
    # A real-time roll names the directory its task already wrote (see RealTimeCommits).
    direct = not args.get("staging") and writes_direct(uri, conf)
    staging = (
        ""
        if direct
        else str(
            args.get("staging") or _uri.join(uri, f"{STAGING_DIR}/{job_id}-{uuid.uuid4().hex}")
        )
    )
    handle = uuid.uuid4().hex
    with _pending_lock:
        _pending[handle] = _PendingWrite(plan, native, staging, job_id, batch, table, direct)
    return {
        "route": "jvm",
        "handle": handle,
        "tableUri": uri,
        "staging": staging,
        "direct": direct,
        "jobId": job_id,
        "columns": [
            {"name": name, "type": dtype, "source": source, "cast": cast}
            for name, dtype, source, cast in native.columns
        ],
        "partitionColumns": list(native.partition_columns),
        "escapedPartitions": list(native.escaped_string_partitions),
        "escapeMark": _ESCAPE,
        "hiveNull": _partitions.HIVE_NULL,
        "codec": native.codec,
        "hasTimestamps": native.has_timestamps,
        "maxRecordsPerFile": plan.options.max_records_per_file or _files.DEFAULT_MAX_ROWS_PER_FILE,
        **checked,
    }


def optimized_write(plan: WritePlan, incoming: dict[str, Any]) -> dict[str, Any]:
    """How the connector shuffles an optimized write: by the table's partition columns
    (as the data names them), into tasks of about ``binSize`` bytes."""
    names = {f["name"].lower(): f["name"] for f in incoming["fields"]}
    columns = [names[c.lower()] for c in plan.partition_columns if c.lower() in names]
    return {"columns": columns, "binSize": plan.options.optimize_write_bin_size}


_VALUES_SLOT = "\u0000values\u0000"


def row_guard(plan: WritePlan, incoming: dict[str, Any]) -> dict[str, Any]:
    """How the connector checks a write's rows against the table's constraints: two
    projections of the written DataFrame (``widen`` adds the table columns a check needs
    and the data lacks, as nulls; ``guarded`` raises on the first violating row, see
    :func:`deltaflow.table._constraints.guard_sql`), and the typed error of each check,
    ``{values}`` standing for the violating row's values."""
    names = [f["name"] for f in incoming["fields"]]
    present = {n.lower() for n in names}
    table = {f["name"].lower(): f for f in _schema.logical_schema(plan.schema)["fields"]}
    needed = {c.lower() for check in plan.checks for c in check.columns}
    needed |= {check.name.split(".")[0].lower() for check in plan.checks if check.kind == "notNull"}
    missing = [
        f"CAST(NULL AS {_schema.type_to_string(table[c]['type'])})"
        f" AS {_constraints.quote([table[c]['name']])}"
        for c in sorted(needed - present)
        if c in table
    ]
    quoted = [_constraints.quote([n]) for n in names]
    guarded = [f"{_constraints.guard_sql(plan.checks, names[0])} AS {quoted[0]}", *quoted[1:]]
    violations = []
    for check in plan.checks:
        error = _constraints.violation(plan.table_uri, check, _VALUES_SLOT)
        fields = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in error._fields.items()
            if v is not None
        }
        violations.append(
            {"message": error.message.replace(_VALUES_SLOT, "{values}"), "fields": fields}
        )
    return {"widen": quoted + missing, "guarded": guarded, "violations": violations}


def _take(handle: str) -> _PendingWrite | None:
    with _pending_lock:
        return _pending.pop(handle, None)


take_pending = _take  # for the real-time sink's commits (bridge/_realtime.py)


def commit_write(args: dict[str, Any]) -> dict[str, Any]:
    """``write.commit``: footers, moves (none for a direct write: its ``files`` are in
    place), one commit; the staging directory is removed, an uncommitted direct write's
    files are deleted."""
    pending = _take(str(args["handle"]))
    if pending is None:
        raise BridgeError(
            "write.commit for an unknown write: the Python side restarted since the write"
            " was planned. Nothing was committed; run the write again.",
            operation="write.commit",
        )
    if pending.direct:
        native = pending.native
        moved = collect_direct(
            pending.plan,
            reported_files(args),
            lambda rel: _staged_partition_values(rel, native, pending.plan.table_uri),
        )
    else:
        moved = collect_staged(pending.plan, pending.native, pending.staging_uri, pending.job_id)
    if pending.stream is not None:
        app_id, batch_id, query_id = pending.stream
        done = False
        try:
            result = commit_batch(
                pending.plan,
                moved,
                query_id=query_id,
                app_id=app_id,
                batch_id=batch_id,
                num_rows=rows_in(moved),
                table=pending.table,
            )
            done = not result.skipped or not pending.direct
            return {"version": result.version, "files": len(moved), "skipped": result.skipped}
        finally:
            _snapshots.forget(pending.plan.table_uri)  # the next read loads the new version
            if not done and pending.direct:
                _files.delete_files(pending.plan.table_uri, moved)
    overrides: dict[str, Any] = {"table": pending.table} if pending.table is not None else {}
    committed = False
    try:
        result = _commit.commit(commit_request(pending.plan, moved, **overrides))
        committed = not result.skipped
        return {"version": result.version, "files": len(moved), "skipped": result.skipped}
    finally:
        _snapshots.forget(pending.plan.table_uri)  # the next read loads the new version
        if not committed:
            _files.delete_files(pending.plan.table_uri, moved)


def abort_write(args: dict[str, Any]) -> dict[str, Any]:
    """``write.abort``: delete the staging directory of a write that failed (a direct
    write's files were deleted by the connector)."""
    pending = _take(str(args["handle"]))
    if pending is not None and not pending.direct:
        from deltaflow.spark.write._native import delete_staging

        delete_staging(pending.staging_uri)
    return {}
