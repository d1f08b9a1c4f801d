"""Direct writes: the JVM's tasks write each file at its final name under the table root.

On object stores a staged write costs up to three copies per file (Hadoop's task and job
commit renames, then the brain's move into the table), each a COPY + DELETE on S3A. A
direct write has none: the connector's ``DirectWrite`` commit protocol
(``jvm/.../deltaflow/DirectWrite.scala``) names every file
``<partition dirs>/part-<split>-<job>-s<split>-<uuid>-c<n>.<codec>.parquet`` (the job id
marks each file, as the staged path's names do), each task reports its files with their
sizes, and ``write.commit`` receives that list: :func:`collect_direct` reads each footer
in place for stats and builds the adds, without a move.

Delivery: nothing is visible to a Delta reader before the commit. A failed job deletes
the files its tasks reported (the protocol's ``abortJob``, a stream's abort); a commit
that fails or is skipped deletes exactly the listed files (the caller). Files whose
report never reached the driver (a lost executor, a killed driver) are orphans that no
commit references and that carry the job id: VACUUM removes them once past retention.

``deltaflow.write.directWrite``: ``auto`` (default: object stores Hadoop opens, e.g.
``s3a://``), ``true`` (also local disk and HDFS, where a rename is cheap; for tests), or
``false`` (always stage).

String partition values Spark cannot tell apart in a directory name (``""``, the literal
``__HIVE_DEFAULT_PARTITION__``, values starting with ``\\x01``) keep the ``\\x01`` mark
the connector adds (write/_native.py) in their directory names (``k=%01``): the staged path
renamed them to ``k=__HIVE_DEFAULT_PARTITION__``. Readers take partition values from the
log, which has the value without the mark; DML's check of Hive-decodable directories
(read/_native.py) sends such files to the Python scan either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.read._native import HADOOP_SCHEMES, hadoop_opens
from deltaflow.spark.write import _files
from deltaflow.spark.write._plan import WritePlan, arrow_schema
from deltaflow.table import _commit, _uri
from deltaflow.table._footer_stats import footer_stats
from deltaflow.table.errors import CorruptTableError

DIRECT_WRITE_CONF = "deltaflow.write.directWrite"
DIRECT_WRITE_MODES = ("auto", "true", "false")
IO_THREADS = 8


def direct_write_mode(value: str | None) -> str:
    """The ``deltaflow.write.directWrite`` setting, checked."""
    mode = (value or "auto").strip().lower()
    if mode not in DIRECT_WRITE_MODES:
        raise InvalidOptionError(
            f"Spark conf '{DIRECT_WRITE_CONF}' must be one of {', '.join(DIRECT_WRITE_MODES)},"
            f" not {value!r}: spark.conf.set('{DIRECT_WRITE_CONF}', 'false') keeps every JVM"
            " write staged (_delta_staging), 'true' writes final names on every store.",
            option=DIRECT_WRITE_CONF,
            valid=DIRECT_WRITE_MODES,
        )
    return mode


def writes_direct(uri: str, conf: Mapping[str, str | None]) -> bool:
    """Whether the JVM write of a table at ``uri`` writes final names (see the module doc)."""
    mode = direct_write_mode(conf.get(DIRECT_WRITE_CONF))
    if mode == "false" or not hadoop_opens(uri):
        return False
    return mode == "true" or urlparse(uri).scheme.lower() not in HADOOP_SCHEMES


def reported_files(args: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``write.commit``'s ``files``: (path relative to the table root, size) per file."""
    return [(str(f["path"]), int(f["size"])) for f in args.get("files") or []]


def collect_direct(
    plan: WritePlan,
    files: list[tuple[str, int]],
    partition_values: Callable[[str], dict[str, str | None]],
) -> list[_commit.AddedFile]:
    """The adds for ``files`` (written in place under the table root), stats from their
    footers; ``partition_values`` decodes a file's relative path. A file without rows
    (Spark writes one schema-only file for an empty input) is deleted, not added.

    On failure every listed file is deleted before the error propagates: none was
    committed.
    """
    full_schema = arrow_schema(plan.schema)
    partitions = {c.lower() for c in plan.partition_columns}
    data_schema = pa.schema([f for f in full_schema if f.name.lower() not in partitions])
    fs, root = _uri.filesystem(plan.table_uri)
    now = int(time.time() * 1000)

    def one(item: tuple[str, int]) -> _commit.AddedFile | None:
        relative, size = item
        metadata = pq.read_metadata(root.rstrip("/") + "/" + relative, filesystem=fs)
        if metadata.num_rows == 0:
            _files.delete_files(plan.table_uri, [_unlisted(relative, size)])
            return None
        return _commit.AddedFile(
            path=relative,
            size=size,
            partition_values=partition_values(relative),
            modification_time=now,
            stats=footer_stats(metadata, data_schema, plan.num_indexed_cols),
        )

    try:
        with ThreadPoolExecutor(max_workers=min(IO_THREADS, max(len(files), 1))) as pool:
            added = [a for a in pool.map(one, files) if a is not None]
    except BaseException:
        delete_reported(plan.table_uri, files)
        raise
    if len({a.path for a in added}) != len(added):
        delete_reported(plan.table_uri, files)
        raise CorruptTableError(
            f"The tasks of a write into {plan.table_uri} reported one file twice. Nothing"
            " was committed; run the write again, and report this with the Spark version.",
            table_uri=plan.table_uri,
            path=next(a.path for a in added if sum(b.path == a.path for b in added) > 1),
        )
    return added


def delete_reported(table_uri: str, files: list[tuple[str, int]]) -> None:
    """Delete the reported files of a direct write that is not committed."""
    _files.delete_files(table_uri, [_unlisted(path, size) for path, size in files])


def _unlisted(relative: str, size: int) -> _commit.AddedFile:
    return _commit.AddedFile(
        path=relative, size=size, partition_values={}, modification_time=0, stats="{}"
    )
