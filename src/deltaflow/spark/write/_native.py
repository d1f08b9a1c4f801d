"""The JVM fast path for batch writes: Spark's own Parquet writer, one Delta commit.

The Python source moves every row from the JVM to a Python worker as Arrow and
encodes Parquet there. When nothing about a write needs Python (no column
mapping, no replaceWhere, no row checks, partition values Spark writes into
directory names exactly), Spark's Parquet writer does the same work in the JVM;
deltaflow then only lists the files, reads their footers and commits.

How one write runs, all driven from the driver (the connector's ``write.plan`` /
``write.commit`` bridge operations; ``stage_native`` for DML's change-data writer):

1. ``df`` is cast and reordered to the table schema and written with
   ``df.write.mode("append").partitionBy(...).parquet(<root>/_delta_staging/<uuid>)``.
   The staging directory is private to this job: Spark's committer keeps its
   ``_temporary`` there (two jobs committing into one directory delete each
   other's ``_temporary``), and the job's committed files are exactly what the
   directory holds afterwards, whatever other writers do meanwhile.
2. Each file's footer gives its stats JSON (:mod:`deltaflow.table._footer_stats`)
   and its directory its partition values; the file is then moved to the place
   the Python path would have written it: ``<col>=<value>/.../part-…-<jobid>-…``
   under the table root. Tables look the same whichever path wrote them, so every
   reader (delta-rs, Polars, our JVM scan's partition-directory check) sees
   ordinary Hive-style paths. On local and HDFS storage a move is a rename.
3. One commit through :func:`deltaflow.table._commit.commit` (app transaction
   checked again there, ``userMetadata``, conflict checks), then the staging
   directory is deleted.

Delivery: nothing is visible before step 3. If the job, a footer read, a move or
the commit fails, the moved files and the staging directory are deleted before
the error propagates. A crash of the driver can leave files that no commit
references: moved ones carry the job id in their names and VACUUM removes them;
a ``_delta_staging/<uuid>/`` directory older than any running job can be
deleted by hand (VACUUM skips ``_``-prefixed directories).

String partition values that Spark cannot tell apart in a directory name (``""``,
the literal ``__HIVE_DEFAULT_PARTITION__`` and null all become
``__HIVE_DEFAULT_PARTITION__``) are kept apart by prefixing ``\\x01`` in the
staged directory names only: values starting with ``\\x01``, and those two, get
one more ``\\x01``, which is stripped when the directory is decoded (Spark escapes
the character as ``%01``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from deltaflow.spark._options import JVM_PATH_MODES, jvm_path_mode
from deltaflow.spark.read._native import (
    NATIVE_PARTITION_TYPES,
    Fallback,
    hadoop_opens,
    unescape_path_name,
)
from deltaflow.spark.write import _direct, _files
from deltaflow.spark.write._plan import WritePlan, arrow_schema
from deltaflow.table import _commit, _partitions, _uri
from deltaflow.table._footer_stats import footer_stats
from deltaflow.table._snapshot import Snapshot, load_snapshot
from deltaflow.table.errors import CorruptTableError

log = logging.getLogger("deltaflow.write")

NATIVE_WRITE_CONF = "deltaflow.write.nativeWrite"
NATIVE_WRITE_MODES = JVM_PATH_MODES
STAGING_DIR = "_delta_staging"
# Codecs Spark and every Delta reader decode alike. Spark's "lz4" is Hadoop-framed
# LZ4, which pyarrow-based readers reject; other codecs take the Python path.
NATIVE_CODECS = frozenset({"snappy", "gzip", "zstd", "none", "uncompressed"})
# Table properties whose meaning this path does not implement (the Python path decides).
_UNHANDLED_PROPERTIES = (
    "delta.columnMapping.mode",
    "delta.dataSkippingStatsColumns",
    "delta.randomizeFilePrefixes",
    "delta.enableRowTracking",
    "delta.minReaderVersion",
    "delta.minWriterVersion",
)
_UNHANDLED_PREFIXES = ("delta.constraints.", "delta.feature.")
# Generated and identity columns are computed by the connector before the write
# (spark/write/_generated.py), so their metadata needs no fallback.
_UNHANDLED_FIELD_METADATA = ("delta.invariants",)
_ESCAPE = "\x01"
# Footer reads and moves are I/O bound: a few threads hide object-store latency.
IO_THREADS = 8


@dataclass(frozen=True)
class NativeWrite:
    """What the JVM write needs: the table columns in order and the staged layout."""

    # (table column, its Delta type, the input column it comes from, whether to cast)
    columns: tuple[tuple[str, dict[str, Any] | str, str | None, bool], ...]
    partition_columns: tuple[str, ...]
    escaped_string_partitions: tuple[str, ...]
    codec: str
    has_timestamps: bool


@dataclass(frozen=True)
class StagedFile:
    relative: str  # inside the staging directory
    size: int


def native_write_mode(value: str | None) -> str:
    return jvm_path_mode(NATIVE_WRITE_CONF, value, "turns the JVM write path off")


def plan_native_write(
    plan: WritePlan,
    incoming: dict[str, Any],
    conf: Callable[[str, str], str | None],
    current: Snapshot | None = None,
) -> NativeWrite | Fallback:
    """The JVM write of ``incoming`` (Spark schema JSON) under ``plan``, or why not.
    ``current``: the snapshot ``plan`` was made from, if the caller has it."""
    if native_write_mode(conf(NATIVE_WRITE_CONF, "auto")) == "false":
        return Fallback(f"{NATIVE_WRITE_CONF}=false")
    if not hadoop_opens(plan.table_uri):
        return Fallback("a store Spark's Hadoop layer does not open")
    if plan.skip or plan.replace_where is not None:
        return Fallback("replaceWhere" if plan.replace_where else "skipped write")
    if plan.mode not in ("append", "overwrite"):
        return Fallback(f"mode {plan.mode!r}")
    if plan.column_mapping:
        return Fallback("column mapping")
    codec = plan.options.compression.lower()
    if codec not in NATIVE_CODECS:
        return Fallback(f"compression {codec!r}")
    if (conf("spark.sql.parquet.writeLegacyFormat", "false") or "").lower() == "true":
        return Fallback("spark.sql.parquet.writeLegacyFormat=true")
    configuration: dict[str, str | None] = dict(plan.configuration)
    if plan.read_version is not None and not plan.replace_table:
        if current is None or current.version != plan.read_version:
            current = load_snapshot(plan.table_uri, version=plan.read_version)
        configuration.update(current.configuration)
    for key, value in configuration.items():
        if key == "delta.columnMapping.mode" and (value or "none").lower() == "none":
            continue
        if key in _UNHANDLED_PROPERTIES or key.startswith(_UNHANDLED_PREFIXES):
            return Fallback(f"table property {key!r}")
    return _plan_columns(plan, incoming, codec)


def _plan_columns(plan: WritePlan, incoming: dict[str, Any], codec: str) -> NativeWrite | Fallback:
    by_name = {f["name"].lower(): f for f in incoming["fields"]}
    partitions = {c.lower() for c in plan.partition_columns}
    columns = []
    has_timestamps = False
    for f in plan.schema["fields"]:
        metadata = f.get("metadata") or {}
        if any(key in metadata for key in _UNHANDLED_FIELD_METADATA):
            return Fallback(f"column {f['name']!r} has invariants")
        source = by_name.get(f["name"].lower())
        if f["name"].lower() in partitions and f["type"] not in NATIVE_PARTITION_TYPES:
            return Fallback(f"partition column {f['name']!r} of type {f['type']!r}")
        if not _all_nullable(f["type"]):
            return Fallback(f"column {f['name']!r} has NOT NULL nested fields")
        if not f.get("nullable", True) and (source is None or source.get("nullable", True)):
            # Spark guarantees non-null input columns itself; others need the row check.
            return Fallback(f"NOT NULL column {f['name']!r}")
        if (
            source is not None
            and isinstance(f["type"], dict)
            and _without_nullability(source["type"]) != _without_nullability(f["type"])
        ):
            # Spark casts structs by position; the Python path matches children by name.
            return Fallback(f"nested column {f['name']!r} differs from the table's type")
        has_timestamps |= "timestamp" in str(f["type"])
        cast = source is None or source["type"] != f["type"]
        columns.append((f["name"], f["type"], source["name"] if source else None, cast))
    if len(partitions) >= len(columns):
        return Fallback("every column is a partition column")
    escaped = tuple(
        f["name"]
        for f in plan.schema["fields"]
        if f["name"].lower() in partitions and f["type"] == "string"
    )
    return NativeWrite(
        columns=tuple(columns),
        partition_columns=plan.partition_columns,
        escaped_string_partitions=escaped,
        codec=codec,
        has_timestamps=has_timestamps,
    )


def _all_nullable(t: Any) -> bool:
    if isinstance(t, str):
        return True
    if t["type"] == "struct":
        return all(f.get("nullable", True) and _all_nullable(f["type"]) for f in t["fields"])
    if t["type"] == "array":
        return bool(t.get("containsNull", True)) and _all_nullable(t["elementType"])
    if t["type"] == "map":
        return (
            bool(t.get("valueContainsNull", True))
            and _all_nullable(t["keyType"])
            and _all_nullable(t["valueType"])
        )
    return True


def _without_nullability(t: Any) -> Any:
    if isinstance(t, str):
        return t
    if t["type"] == "struct":
        return [(f["name"], _without_nullability(f["type"])) for f in t["fields"]]
    if t["type"] == "array":
        return ("array", _without_nullability(t["elementType"]))
    if t["type"] == "map":
        return ("map", _without_nullability(t["keyType"]), _without_nullability(t["valueType"]))
    return t


def stage_native(
    df: Any, plan: WritePlan, native: NativeWrite, job_id: str | None = None
) -> list[_commit.AddedFile]:
    """Write ``df`` with Spark's Parquet writer and move the files into the table, with
    stats from their footers: the adds for the caller to commit (or delete, on failure).

    Nothing is committed. On failure the moved files are deleted before the error
    propagates; the staging directory is always deleted.
    """
    job_id = job_id or uuid.uuid4().hex[:8]
    setting = {_direct.DIRECT_WRITE_CONF: df.sparkSession.conf.get(_direct.DIRECT_WRITE_CONF, None)}
    if _direct.writes_direct(plan.table_uri, setting):
        return _write_direct(df, plan, native, job_id)
    staging_uri = _uri.join(plan.table_uri, f"{STAGING_DIR}/{job_id}-{uuid.uuid4().hex}")
    started = time.perf_counter()
    try:
        _run_spark_job(_shaped(df, native), plan, native, staging_uri)
    except BaseException:
        delete_staging(staging_uri)
        raise
    log.info(
        "deltaflow staged files for %s with Spark's Parquet writer; job %.0f ms",
        plan.table_uri,
        (time.perf_counter() - started) * 1000,
    )
    return collect_staged(plan, native, staging_uri, job_id)


def _write_direct(
    df: Any, plan: WritePlan, native: NativeWrite, job_id: str
) -> list[_commit.AddedFile]:
    """``df`` written at final names under the table root by the connector's
    ``DirectWrite`` (write/_direct.py), with stats from the footers read in place."""
    shaped = _shaped(df, native)
    max_rows = plan.options.max_records_per_file or _files.DEFAULT_MAX_ROWS_PER_FILE
    started = time.perf_counter()
    answer = shaped.sparkSession._jvm.org.apache.spark.sql.deltaflow.DirectWrite.writeForPython(
        shaped._jdf,
        plan.table_uri,
        job_id,
        json.dumps(list(native.partition_columns)),
        native.codec,
        str(max_rows),
        native.has_timestamps,
    )
    files = [(str(f["path"]), int(f["size"])) for f in json.loads(answer)]
    log.info(
        "deltaflow wrote %d files directly into %s with Spark's Parquet writer; job %.0f ms",
        len(files),
        plan.table_uri,
        (time.perf_counter() - started) * 1000,
    )
    return _direct.collect_direct(
        plan, files, lambda rel: _staged_partition_values(rel, native, plan.table_uri)
    )


def collect_staged(
    plan: WritePlan, native: NativeWrite, staging_uri: str, job_id: str
) -> list[_commit.AddedFile]:
    """The files Spark's writer left in ``staging_uri``, moved into the table with stats
    from their footers: the adds for the caller to commit (or delete, on failure).

    On failure the moved files are deleted before the error propagates; the staging
    directory is always deleted (here, not later: a removal deferred past the return was
    paid by the next commit's fsync, which carries it in ext4's journal commit;
    docs/notes/rtm-commit.md).
    """
    fs, staging = _uri.filesystem(staging_uri)
    moved: list[_commit.AddedFile] = []
    done = False
    started = time.perf_counter()
    try:
        staged = _list_staged(fs, staging)
        moved.extend(_collect_files(fs, staging, staged, plan, native, job_id))
        log.info(
            "deltaflow moved %d staged files into %s; footers and moves %.0f ms",
            len(moved),
            plan.table_uri,
            (time.perf_counter() - started) * 1000,
        )
        done = True
        return moved
    finally:
        if not done:
            _files.delete_files(plan.table_uri, moved)
        _delete_dir(fs, staging)


def delete_staging(staging_uri: str) -> None:
    """Delete a write's staging directory and whatever Spark left in it."""
    fs, staging = _uri.filesystem(staging_uri)
    _delete_dir(fs, staging)


def delete_stale_staging(table_uri: str, retention_hours: float) -> list[str]:
    """Delete the staging directories of writes that died before their commit (a killed
    driver or bridge leaves ``<table>/_delta_staging/<job>``): those where nothing was
    written for longer than ``retention_hours``. A live write keeps adding files, so a
    directory is judged by its newest entry, never by its name. VACUUM calls this (delta-rs
    skips ``_``-prefixed directories). Returns the URIs deleted."""
    fs, root = _uri.filesystem(_uri.join(table_uri, STAGING_DIR))
    cutoff_ns = time.time_ns() - int(retention_hours * 3600 * 1e9)
    top = pafs.FileSelector(root, allow_not_found=True, recursive=False)
    deleted = []
    for entry in fs.get_file_info(top):
        if entry.base_name.startswith("_"):
            # Lease files (table/_compaction_lease.py, _dml_lease.py) look after themselves;
            # deleting a held one could let two compactions run at once.
            continue
        if _newest_mtime_ns(fs, entry) < cutoff_ns:
            if entry.type == pafs.FileType.Directory:
                _delete_dir(fs, entry.path)
            else:
                fs.delete_file(entry.path)
            deleted.append(_uri.join(table_uri, f"{STAGING_DIR}/{entry.base_name}"))
    if deleted:
        log.info("VACUUM of %s deleted %d stale staging directories", table_uri, len(deleted))
    return deleted


def _newest_mtime_ns(fs: pafs.FileSystem, entry: pafs.FileInfo) -> int:
    newest = entry.mtime_ns or 0
    if entry.type == pafs.FileType.Directory:
        inside = pafs.FileSelector(entry.path, allow_not_found=True, recursive=True)
        newest = max([newest, *(i.mtime_ns or 0 for i in fs.get_file_info(inside))])
    return newest


def _shaped(df: Any, native: NativeWrite) -> Any:
    """``df`` as the table's columns, in order, with staged-directory escaping applied."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    escaped = set(native.escaped_string_partitions)
    types = StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": True, "metadata": {}}
                for n, t, _, _ in native.columns
            ],
        }
    )
    exprs = []
    for (name, _, source, cast), target in zip(native.columns, types.fields, strict=True):
        column = F.col(_quote(source)) if source is not None else F.lit(None)
        if cast:
            column = column.cast(target.dataType)
        if name in escaped:
            ambiguous = (
                (column == "") | (column == _partitions.HIVE_NULL) | column.startswith(_ESCAPE)
            )
            column = F.when(ambiguous, F.concat(F.lit(_ESCAPE), column)).otherwise(column)
        exprs.append(column.alias(name))
    return df.select(*exprs)


def rows_in(adds: list[_commit.AddedFile]) -> int:
    """The rows the files hold, from their stats (footer stats always count records)."""
    return sum(int(json.loads(a.stats or "{}").get("numRecords", 0)) for a in adds)


def _run_spark_job(df: Any, plan: WritePlan, native: NativeWrite, staging_uri: str) -> None:
    # Spark writes timestamps as INT96 by default: no footer stats, and a legacy
    # encoding. The setting is read from the session when the job is planned.
    conf_key = "spark.sql.parquet.outputTimestampType"
    conf = df.sparkSession.conf
    previous = conf.get(conf_key, None) if native.has_timestamps else None
    if native.has_timestamps:
        conf.set(conf_key, "TIMESTAMP_MICROS")
    try:
        writer = df.write.format("parquet").mode("append")
        if native.partition_columns:
            writer = writer.partitionBy(*native.partition_columns)
        max_rows = plan.options.max_records_per_file or _files.DEFAULT_MAX_ROWS_PER_FILE
        writer.option("compression", native.codec).option("maxRecordsPerFile", max_rows).save(
            staging_uri
        )
    finally:
        if native.has_timestamps:
            if previous is None:
                conf.unset(conf_key)
            else:
                conf.set(conf_key, previous)


def _list_staged(fs: pafs.FileSystem, staging: str) -> list[StagedFile]:
    selector = pafs.FileSelector(staging, recursive=True, allow_not_found=True)
    prefix = staging.rstrip("/") + "/"
    out = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or info.base_name.startswith(("_", ".")):
            continue  # _SUCCESS, .crc checksums
        if info.path.endswith(".parquet"):
            out.append(StagedFile(relative=info.path[len(prefix) :], size=int(info.size or 0)))
    return sorted(out, key=lambda s: s.relative)


def _collect_files(
    fs: pafs.FileSystem,
    staging: str,
    staged: list[StagedFile],
    plan: WritePlan,
    native: NativeWrite,
    job_id: str,
) -> list[_commit.AddedFile]:
    """Stats from each footer, then the file moved into the table: the adds to commit."""
    data_schema = _data_schema(plan)
    _, root = _uri.filesystem(plan.table_uri)

    def one(numbered: tuple[int, StagedFile]) -> _commit.AddedFile | None:
        number, item = numbered
        source = staging.rstrip("/") + "/" + item.relative
        metadata = pq.read_metadata(source, filesystem=fs)
        if metadata.num_rows == 0:
            return None  # Spark writes a schema-only file for an empty input; Delta needs none
        stats = footer_stats(metadata, data_schema, plan.num_indexed_cols)
        values = _staged_partition_values(item.relative, native, plan.table_uri)
        directory = _partitions.partition_dir(list(plan.partition_columns), values)
        # part-<split>-<job>-<task>-<uuid>: the Python path's names, so the job id
        # marks every file of the job (delete_job_files, VACUUM of orphans).
        split = item.relative.rsplit("/", 1)[-1].split("-")[1]
        name = f"part-{number:05d}-{job_id}-s{split}-{uuid.uuid4()}-c000.{native.codec}.parquet"
        relative = f"{directory}/{name}" if directory else name
        target = root.rstrip("/") + "/" + relative
        if directory:
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        fs.move(source, target)
        return _commit.AddedFile(
            path=relative,
            size=item.size,
            partition_values=values,
            modification_time=int(time.time() * 1000),
            stats=stats,
        )

    if len(staged) == 1:
        # A real-time roll's one file: a pool's thread start and join would cost more
        # than the file's own work. Nothing is moved when ``one`` raises before its move.
        single = one((0, staged[0]))
        return [single] if single is not None else []
    added: list[_commit.AddedFile] = []
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=min(IO_THREADS, max(len(staged), 1))) as pool:
        futures = [pool.submit(one, item) for item in enumerate(staged)]
        for future in futures:
            try:
                result = future.result()
            except BaseException as exc:
                errors.append(exc)
                continue
            if result is not None:
                added.append(result)
    if errors:
        # The caller deletes what was moved; hand it the full list first.
        _files.delete_files(plan.table_uri, added)
        raise errors[0]
    return added


# The data columns' Arrow schema of recent plans, by the identity of their schema dict (kept
# in the entry, so the id cannot be reused while cached): a real-time sink collects a roll
# every few milliseconds with one plan, and converting the schema costs ~0.1 ms each time.
_data_schemas: dict[int, tuple[Any, tuple[str, ...], pa.Schema]] = {}
_data_schemas_lock = threading.Lock()


def _data_schema(plan: WritePlan) -> pa.Schema:
    """The Arrow schema of the files' columns (partition columns left out), table order."""
    key = id(plan.schema)
    with _data_schemas_lock:
        cached = _data_schemas.get(key)
    if cached is not None and cached[0] is plan.schema and cached[1] == plan.partition_columns:
        return cached[2]
    partitions = {c.lower() for c in plan.partition_columns}
    full_schema = arrow_schema(plan.schema)
    data = pa.schema([f for f in full_schema if f.name.lower() not in partitions])
    with _data_schemas_lock:
        _data_schemas[key] = (plan.schema, tuple(plan.partition_columns), data)
        while len(_data_schemas) > 16:
            _data_schemas.pop(next(iter(_data_schemas)))
    return data


def _staged_partition_values(
    relative: str, native: NativeWrite, table_uri: str
) -> dict[str, str | None]:
    directories = relative.split("/")[:-1]
    if len(directories) != len(native.partition_columns):
        raise CorruptTableError(
            f"Spark's writer staged {relative!r}, which is not in one directory per partition"
            f" column {list(native.partition_columns)}. Nothing was committed; run the write"
            " again, and report this with the Spark version if it repeats.",
            table_uri=table_uri,
            path=relative,
        )
    escaped = set(native.escaped_string_partitions)
    values: dict[str, str | None] = {}
    for directory, column in zip(directories, native.partition_columns, strict=True):
        _, _, encoded = directory.partition("=")
        if encoded == _partitions.HIVE_NULL:
            values[column] = None
            continue
        value = unescape_path_name(encoded)
        if column in escaped and value.startswith(_ESCAPE):
            value = value[len(_ESCAPE) :]
        values[column] = value
    return values


def _delete_dir(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("could not delete the staging directory %s", path)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
