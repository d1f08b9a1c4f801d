"""A materialized view's source and target as their Delta logs tell it: which changes a
range of the source's versions holds (and whether they can be read cheaply), whether the
view's table moved since its last refresh, and sizes for the cost model.

Nothing here runs a Spark job except :func:`plain_change_rows`, which only builds one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from deltaflow.pipelines._mv_plan import Issue

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def table_bytes(uri: str) -> int:
    from deltaflow.table._snapshot import load_snapshot

    return sum(f.size for f in load_snapshot(uri).files(stats=False))


def change_feed_issue(uri: str, start: int, end: int) -> Issue | tuple[int, int, bool]:
    """Why the source's change feed cannot give versions ``start``..``end``, or the
    bytes of its change files and of the source, and whether Spark's Parquet reader can
    read those files as they are (:func:`plain_change_rows`)."""
    from deltaflow.table import _cdf
    from deltaflow.table._log import read_commit
    from deltaflow.table._snapshot import load_snapshot
    from deltaflow.table.errors import (
        ChangeDataFilesMissingError,
        ChangeDataNotRecordedError,
        VersionNotFoundError,
    )

    snapshot = load_snapshot(uri, version=end)
    schema = json.dumps(snapshot.schema, sort_keys=True)
    for version in range(start, end + 1):
        for _, action in read_commit(uri, version) or ():
            meta = action.get("metaData")
            if meta and json.dumps(json.loads(meta["schemaString"]), sort_keys=True) != schema:
                return Issue(
                    "SOURCE_SCHEMA_CHANGED", f"the source's schema changed at version {version}"
                )
    try:
        files = _cdf.plan_changes(snapshot, _cdf.ChangeRange(start, end))
        _cdf.check_files_exist(uri, files)
    except ChangeDataNotRecordedError:
        return Issue(
            "CDF_NOT_ENABLED",
            f"the source's change data feed was not enabled for all of versions {start} to"
            f" {end} (set delta.enableChangeDataFeed = true on it)",
        )
    except (ChangeDataFilesMissingError, VersionNotFoundError) as error:
        return Issue(
            "CHANGE_DATA_UNAVAILABLE",
            "the source's changes since the last refresh are gone (VACUUM or log"
            f" cleanup): {error}",
        )
    source_bytes = sum(f.size for f in snapshot.files(stats=False))
    plain = (
        uri.startswith("file:")
        and not snapshot.partition_columns
        and snapshot.column_mapping_mode == "none"
        and all(f.selection == _cdf.RowSelection() for f in files)
    )
    return sum(f.size for f in files), source_bytes, plain


def plain_change_rows(spark: SparkSession, uri: str, start: int, end: int) -> DataFrame:
    """The change rows of versions ``start`` to ``end``, read by Spark's
    Parquet reader straight from the files the table layer plans (change files as they
    are, added / removed data files as inserts / deletes). Only for what needs no more:
    local files, no partition columns, no column mapping, no deletion vectors (checked
    while planning); the change feed reader does the rest, row by row in Python."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from deltaflow.table import _cdf, _schema
    from deltaflow.table._snapshot import load_snapshot

    snapshot = load_snapshot(uri, version=end)
    files = _cdf.plan_changes(snapshot, _cdf.ChangeRange(start, end))
    schema = StructType.fromJson(_schema.logical_schema(snapshot.schema))
    columns = [F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in schema.fields]
    parts: list[DataFrame] = []
    for kind, change_type in (("cdc", None), ("add", "insert"), ("remove", "delete")):
        paths = [_cdf.file_uri(uri, f.path) for f in files if f.kind == kind]
        if not paths:
            continue
        df = spark.read.parquet(*paths)
        kind_column = F.col(_cdf.CHANGE_TYPE) if change_type is None else F.lit(change_type)
        parts.append(df.select(*columns, kind_column.alias(_cdf.CHANGE_TYPE)))
    if not parts:
        return spark.createDataFrame([], schema.add(_cdf.CHANGE_TYPE, "string"))
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.unionByName(part)
    return rows


def data_changed_since(uri: str, version: int) -> int | None:
    """The first version after ``version`` that changed the table's data or metadata
    (compaction, ``dataChange=false``, does not count); None if there is none."""
    from deltaflow.table._log import read_commit

    latest = latest_version(uri)
    if latest < version:
        return latest
    for v in range(version + 1, latest + 1):
        for _, action in read_commit(uri, v) or ():
            if "metaData" in action or "protocol" in action:
                return v
            for kind in ("add", "remove", "cdc"):
                if kind in action and action[kind].get("dataChange", True):
                    return v
    return None


def latest_version(uri: str) -> int:
    from deltaflow.table._snapshot import load_snapshot

    return load_snapshot(uri, check_readable=False).version
