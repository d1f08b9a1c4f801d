"""When Spark's own Parquet scan reads a set of a snapshot's files exactly (DML's scans).

(Batch reads go through the connector's DSv2 scan, which handles everything below
itself; DELETE / UPDATE / MERGE still build their candidate scans with
``spark.read.parquet`` and use these rules.)

A Delta snapshot is a list of Parquet files plus rules for reading them. When no
rule needs Python (no deletion vectors, no column mapping, no type widening) and
every partition value can be recovered by Spark from the file's directory name,
``spark.read.parquet`` over the snapshot's files returns exactly the rows the
Python source would, without moving every row through a Python worker.

:func:`plan_native_scan` decides, on the driver, from the log alone (no file is
opened). Anything it cannot prove safe falls back, with the reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import unquote, urlparse

from deltaflow.spark._options import JVM_PATH_MODES, jvm_path_mode
from deltaflow.table import _partitions, _schema, _uri
from deltaflow.table._snapshot import FileEntry, Snapshot

NATIVE_SCAN_CONF = "deltaflow.read.nativeScan"
NATIVE_SCAN_MODES = JVM_PATH_MODES
# Spark stats every path it is given while building the DataFrame (a listing job once
# there are more than spark.sql.sources.parallelPartitionDiscovery.threshold paths);
# beyond this many files that planning cost outweighs the faster scan.
MAX_NATIVE_FILES = 20_000
# Partition column types Spark casts back from a directory name without loss.
# Timestamps (time zone and precision), decimals (scale), floats (formatting) and
# binary (encoding) may not round-trip, so those tables take the Python path.
NATIVE_PARTITION_TYPES = frozenset(
    {"string", "integer", "long", "short", "byte", "boolean", "date"}
)
# Features whose read semantics Spark's Parquet scan does not implement.
_PYTHON_ONLY_FEATURES = frozenset({"typeWidening", "typeWidening-preview"})
# Spark globs every path it is given; a glob character would read other files.
_GLOB_CHARS = frozenset("*?[]{}\\")


@dataclass(frozen=True)
class NativeScan:
    """What ``spark.read.parquet`` needs to read a snapshot: root, files, schema."""

    root: str
    file_uris: tuple[str, ...]
    schema: dict[str, Any]  # the logical Delta schema JSON (Spark's StructType JSON)
    partition_columns: tuple[str, ...]


@dataclass(frozen=True)
class Fallback:
    """Why a snapshot takes the Python path."""

    reason: str


# Schemes Spark's Hadoop layer opens from the pyspark wheel; other URIs (s3://, gs://,
# abfss://, ...: the wheel has no hadoop-aws) are read and written by the Python data path,
# unless the driver's Hadoop has a FileSystem for them (hadoop_object_stores).
HADOOP_SCHEMES = frozenset({"", "file", "hdfs", "viewfs"})
# Set by the driver JVM in the brain's environment (jvm/.../HadoopStores.scala): the
# object-store schemes its Hadoop opens (S3A on the class path: "s3a,s3"), comma-separated.
HADOOP_SCHEMES_VARIABLE = "DELTAFLOW_HADOOP_SCHEMES"
JVM_OBJECT_STORE_CONF = "spark.deltaflow.objectStore.jvmPath"


# Object-store schemes Hadoop connectors register (HadoopStores.scala's candidates).
OBJECT_STORE_SCHEMES = (
    "s3a", "s3", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cosn", "obs", "ofs",
)  # fmt: skip
# The driver Python's own answer (register() asks its session's JVM): DML from the Python
# API (DeltaTable.merge / update / delete) plans its target scan and rewrite in the driver
# Python, which the connector's variable does not reach.
_driver_object_stores: frozenset[str] = frozenset()


@cache
def hadoop_object_stores() -> frozenset[str] | None:
    """The object-store schemes the driver's Hadoop opens, in the brain: read once, from the
    one variable the connector sets when it starts it; None where it is not set (a driver
    Python: :func:`hadoop_opens` then uses what :func:`learn_driver_object_stores` found;
    executors, where nothing routes)."""
    listed = os.environ.get(HADOOP_SCHEMES_VARIABLE)
    if listed is None:
        return None
    return frozenset(s.strip().lower() for s in listed.split(",") if s.strip())


def learn_driver_object_stores(spark: Any) -> frozenset[str]:
    """Ask ``spark``'s JVM which object-store schemes its Hadoop opens, for this driver
    Python's routing (as HadoopStores.scala tells the brain; none when
    ``spark.deltaflow.objectStore.jvmPath=false``)."""
    global _driver_object_stores
    off = (spark.conf.get(JVM_OBJECT_STORE_CONF, "true") or "").strip().lower() == "false"
    if off:
        found: frozenset[str] = frozenset()
    else:
        from deltaflow.spark._hadoop_fs import _opens

        found = frozenset(s for s in OBJECT_STORE_SCHEMES if _opens(spark, s))
    _driver_object_stores = found
    return found


def hadoop_opens(uri: str) -> bool:
    """Whether Spark's own Parquet reader and writer can open files under ``uri``."""
    scheme = urlparse(uri).scheme.lower()
    listed = hadoop_object_stores()
    stores = _driver_object_stores if listed is None else listed
    return scheme in HADOOP_SCHEMES or scheme in stores


def native_scan_mode(value: str | None) -> str:
    return jvm_path_mode(NATIVE_SCAN_CONF, value, "turns the JVM read path off")


def plan_native_scan(
    snapshot: Snapshot, max_files: int = MAX_NATIVE_FILES
) -> NativeScan | Fallback:
    """The native scan of ``snapshot``, or why it must be read by the Python source."""
    return plan_native_files(snapshot, snapshot.files(), max_files)


def plan_native_files(
    snapshot: Snapshot,
    files: list[FileEntry],
    max_files: int = MAX_NATIVE_FILES,
    *,
    deletion_vectors: bool = False,
) -> NativeScan | Fallback:
    """The native scan of ``files`` (some of ``snapshot``'s), or why the Python path reads them.

    ``deletion_vectors``: the caller drops deleted rows itself (DML, by row index)."""
    if not hadoop_opens(snapshot.uri):
        return Fallback(f"{urlparse(snapshot.uri).scheme}:// is not opened by Spark's Hadoop layer")
    if snapshot.column_mapping_mode != "none":
        return Fallback(f"column mapping mode {snapshot.column_mapping_mode!r}")
    features = _PYTHON_ONLY_FEATURES.intersection(snapshot.reader_features)
    if features:
        return Fallback(f"reader feature {sorted(features)[0]!r}")
    types = {f["name"]: f["type"] for f in snapshot.schema["fields"]}
    for column in snapshot.partition_columns:
        if types.get(column) not in NATIVE_PARTITION_TYPES:
            return Fallback(f"partition column {column!r} of type {types.get(column)!r}")
    if len(files) > max_files:
        return Fallback(f"{len(files)} files (more than {max_files})")
    if snapshot.has_deletion_vectors_enabled and files and not deletion_vectors:
        deleted = snapshot.deleted_rows()
        with_dvs = sum(1 for f in files if len(deleted.get(f.path, ())))
        if with_dvs:
            return Fallback(f"{with_dvs} files with deletion vectors")
    uris = []
    for entry in files:
        # Log paths are URIs (protocol: "needs to be decoded to get the data file path");
        # Hadoop's Path takes the decoded path literally.
        relative = unquote(entry.path)
        problem = _path_problem(relative, snapshot.partition_columns, entry.partition_values)
        if problem:
            return Fallback(f"file {entry.path!r}: {problem}")
        uri = _uri.join(snapshot.uri, relative)
        if _GLOB_CHARS.intersection(uri):
            return Fallback(f"file {uri!r} has a glob character in its path")
        uris.append(uri)
    return NativeScan(
        root=snapshot.uri,
        file_uris=tuple(uris),
        schema=_schema.logical_schema(snapshot.schema),
        partition_columns=snapshot.partition_columns,
    )


def _path_problem(
    relative: str, partition_columns: tuple[str, ...], values: dict[str, Any]
) -> str | None:
    """Why Spark's partition discovery would not read ``values`` back from ``relative``."""
    if relative.startswith("/") or "://" in relative:
        return "not under the table root"
    directories = relative.split("/")[:-1]
    if len(directories) != len(partition_columns):
        return f"directories {directories} do not match partition columns {list(partition_columns)}"
    for directory, column in zip(directories, partition_columns, strict=True):
        name, sep, encoded = directory.partition("=")
        if not sep or unescape_path_name(name) != column:
            return f"directory {directory!r} is not named for partition column {column!r}"
        expected = _partitions.serialize_partition_value(values.get(column))
        if expected is None:
            if encoded != _partitions.HIVE_NULL:
                return f"null value of {column!r} stored as {encoded!r}"
            continue
        # Spark reads both of these back as null, the log means a value.
        if expected in ("", _partitions.HIVE_NULL):
            return f"value {expected!r} of {column!r} reads back as null"
        if unescape_path_name(encoded) != expected:
            return f"directory value {encoded!r} is not the log's {expected!r}"
    return None


def unescape_path_name(text: str) -> str:
    """Spark's ``ExternalCatalogUtils.unescapePathName``: ``%XX`` -> the character.

    Mirrors Java's ``Integer.parseInt(s, 16)`` on the two characters after ``%``,
    sign included (``%+1`` decodes, ``%-1`` does not), so that a directory name
    another writer escaped differently is judged as Spark will read it.
    """
    if "%" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        code = _java_hex(text[i + 1 : i + 3]) if text[i] == "%" else -1
        if code >= 0:
            out.append(chr(code))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_JAVA_HEX = re.compile(r"[+-]?[0-9a-fA-F]+")


def _java_hex(pair: str) -> int:
    if len(pair) != 2 or not _JAVA_HEX.fullmatch(pair):
        return -1
    return int(pair, 16)
