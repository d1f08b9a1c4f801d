"""Small DELETE / UPDATE in one Spark job: the new files are written by the brain.

The general route runs two Spark jobs (count the matches per candidate file, then
rewrite the files with matches), and on ``local[2]`` each job's fixed cost is ~0.3 s:
most of what a one-row UPDATE on a small table waits for. When the candidate files are
small (at most :data:`MAX_BYTES_CONF` bytes of Parquet, default 16 MiB), one Spark job
computes every candidate row's new values with the same Spark expressions as the
general route's second job (so the same semantics: casts, NULLs, generated columns,
CHECK constraints), plus the row's file and whether the condition matched, and returns
them as Arrow. This process then counts per file, keeps the rows of the files the
general route would rewrite, and writes them with the Python writer (data files and
change data files). The commit, its metrics and its conflict rules are the general
route's.

``spark.deltaflow.dml.localRewriteMaxBytes=0`` turns the route off.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.dml import _changes, _target_scan
from deltaflow.table import _schema
from deltaflow.table._snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaflow.spark.write._plan import WritePlan

MAX_BYTES_CONF = "spark.deltaflow.dml.localRewriteMaxBytes"
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
# Whether the row's condition matched (a rewritten row's own column, next to FILE_INDEX).
MATCHED = "__deltaflow_matched"


def eligible(spark: SparkSession, snapshot: Snapshot, files: list[FileEntry]) -> bool:
    """Whether ``files`` are small enough for the one-job route, and the table's columns
    come back through ``toArrow()``: pyspark (4.0-4.3, pyarrow 26) fails to cast a VARIANT
    column holding a NULL (its Arrow struct has non-nullable children), so VARIANT tables
    keep the two jobs, whose writer is Spark's."""
    raw = spark.conf.get(MAX_BYTES_CONF, None)
    try:
        limit = DEFAULT_MAX_BYTES if raw is None else int(raw)
    except ValueError:
        raise InvalidOptionError(
            f"{MAX_BYTES_CONF}={raw!r} is not a number of bytes: set it to an integer"
            f" (0 turns the one-job DELETE/UPDATE route off; default {DEFAULT_MAX_BYTES}).",
            option=MAX_BYTES_CONF,
        ) from None
    return sum(f.size for f in files) <= limit and not _schema.holds_type(
        snapshot.schema, "variant"
    )


def counts(
    rows: pa.Table, scan: _target_scan.TargetScan, operation: str, *, changes: bool
) -> dict[int, _target_scan.FileCounts]:
    """Per candidate file index with rows: its rows and the rows the condition matched."""
    original = rows
    if changes and operation == "UPDATE":
        # A matched row comes three times (the new row, its pre- and post-image).
        original = rows.filter(pc.is_null(rows[_changes.CHANGE_TYPE]))
    grouped = (
        pa.table(
            {
                "key": original[_target_scan.FILE_INDEX],
                "m": pc.cast(original[MATCHED], pa.int64()),
            }
        )
        .group_by("key")
        .aggregate([("m", "count"), ("m", "sum")])
    )
    return {
        scan.index(key): _target_scan.FileCounts(int(total), int(matched or 0))
        for key, total, matched in zip(
            grouped["key"].to_pylist(),
            grouped["m_count"].to_pylist(),
            grouped["m_sum"].to_pylist(),
            strict=True,
        )
    }


def write(
    rows: pa.Table,
    scan: _target_scan.TargetScan,
    rewrite: Collection[int],
    operation: str,
    plan: WritePlan,
    *,
    changes: bool,
) -> _changes.Written:
    """The new data (and change data) files of the candidate files in ``rewrite``."""
    keys = (
        list(rewrite)
        if scan.keys is None
        else [key for key, index in scan.keys.items() if index in rewrite]
    )
    chosen = pc.is_in(rows[_target_scan.FILE_INDEX], value_set=pa.array(keys))
    if operation == "DELETE" and not changes:
        chosen = pc.and_(chosen, pc.invert(rows[MATCHED]))
    kept = rows.filter(chosen).drop_columns([_target_scan.FILE_INDEX, MATCHED])
    job_id = uuid.uuid4().hex[:8]
    return _changes.write_batches(kept.to_batches(), plan, changes=changes, job_id=job_id)
