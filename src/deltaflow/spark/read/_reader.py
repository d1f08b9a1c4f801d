"""Batch reads: plan a snapshot's files into Spark tasks and stream them as Arrow.

Planning (``pushFilters``, ``partitions``) runs once in a Python worker on the
driver; ``read`` runs in executors, one call per task, and yields Arrow record
batches shaped exactly like the table's Spark schema.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from deltaflow.spark._compat import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from deltaflow.spark.read import _scan_report
from deltaflow.spark.read._scan_report import ScanReport
from deltaflow.table import _arrow, _generated_pruning, _pruning, _schema, _uri
from deltaflow.table._snapshot import Snapshot

# Spark's own defaults for file scans (spark.sql.files.maxPartitionBytes / openCostInBytes):
# a task reads up to 128 MiB, and each file costs as much as 4 MiB of data to open.
MAX_PARTITION_BYTES = 128 * 1024 * 1024
OPEN_COST_BYTES = 4 * 1024 * 1024
# Spark 4.1 to 4.3 keep the read plan made during filter pushdown on the data source
# object that every query of one DataFrame shares (PythonScanBuilder calls
# ds.setReadInfo), and reuse it for any later query on that DataFrame without a pushable
# filter: `df.where("p = 'x'").count()` followed by `df.count()` would read only the
# files pruned for p = 'x', silently dropping rows. Newer Spark keeps the plan per scan.
# Until then, file skipping stays off: wrong results are worse than slow ones.
FILE_SKIPPING_SAFE = int(pyspark.__version__.split(".")[0]) >= 5
# Rows per Arrow batch handed to Spark: large batches amortise the per-batch cost of
# the Python -> JVM transfer; 64k rows of a wide table stay well under 100 MB.
BATCH_ROWS = 65536


@dataclass(frozen=True)
class FileTask:
    uri: str
    size: int
    partition_values: dict[str, Any]
    deleted_rows: np.ndarray | None = None
    # When set, only these rows are read (change data feed: rows two DVs differ in).
    kept_rows: np.ndarray | None = None


class FilePartition(InputPartition):
    """The files one Spark task reads."""

    def __init__(self, index: int, files: list[FileTask]) -> None:
        super().__init__(index)
        self.index = index
        self.files = files


def to_predicate(f: Filter) -> _pruning.Predicate | None:
    """The table layer's form of a pushed Spark filter; None when it cannot help skipping."""
    simple: dict[type, _pruning.Op] = {
        EqualTo: "=",
        EqualNullSafe: "<=>",
        GreaterThan: ">",
        GreaterThanOrEqual: ">=",
        LessThan: "<",
        LessThanOrEqual: "<=",
    }
    for cls, op in simple.items():
        if type(f) is cls:
            return _pruning.Comparison(op, tuple(f.attribute), f.value)  # type: ignore[attr-defined]
    if isinstance(f, In):
        return _pruning.Comparison("in", tuple(f.attribute), tuple(f.value))
    if isinstance(f, IsNull):
        return _pruning.Comparison("is_null", tuple(f.attribute))
    if isinstance(f, IsNotNull):
        return _pruning.Comparison("is_not_null", tuple(f.attribute))
    if isinstance(f, StringStartsWith):
        return _pruning.Comparison("starts_with", tuple(f.attribute), f.value)
    if isinstance(f, Not):
        child = to_predicate(f.child)
        return _pruning.Negation(child) if isinstance(child, _pruning.Comparison) else None
    return None


class DeltaBatchReader(DataSourceReader):
    def __init__(
        self, snapshot: Snapshot, schema: StructType, file_skipping: bool | None = None
    ) -> None:
        self.snapshot = snapshot
        self.schema_json = schema.jsonValue()
        self.file_skipping = FILE_SKIPPING_SAFE if file_skipping is None else file_skipping
        self.predicates: list[_pruning.Predicate] = []
        self.report: ScanReport | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            predicate = to_predicate(f) if self.file_skipping else None
            if predicate is not None:
                self.predicates.append(predicate)
            # Skipping is per file, never per row: Spark still evaluates every filter.
            yield f

    def partitions(self) -> Sequence[InputPartition]:
        tasks, self.report = plan_scan(self.snapshot, self.predicates)
        _scan_report.emit(self.report)
        groups = bin_pack(tasks, os.cpu_count() or 2)
        return [FilePartition(i, group) for i, group in enumerate(groups)] or [FilePartition(0, [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        layout = ReadLayout.build(self.snapshot, StructType.fromJson(self.schema_json))
        yield from read_tasks(self.snapshot.uri, partition.files, layout)


def read_tasks(
    table_uri: str, tasks: Sequence[FileTask], layout: ReadLayout
) -> Iterator[pa.RecordBatch]:
    """The batches of ``tasks``' files, in a Python worker on an executor. An object store
    failing a read reaches the driver as a typed :class:`ObjectStoreError` (retryable when
    the store did not answer), not as the AWS SDK's text."""
    from deltaflow.errors import RemoteDeltaflowError
    from deltaflow.table._object_store import object_store_error

    try:
        for task in tasks:
            yield from read_file(task, layout)
    except OSError as exc:
        error = object_store_error(table_uri, exc, "read a data file of")
        if error is None:
            raise
        raise RemoteDeltaflowError(error) from exc


def plan_scan(
    snapshot: Snapshot, predicates: Sequence[_pruning.Predicate]
) -> tuple[list[FileTask], ScanReport]:
    """The files a scan must read, with each file's deleted rows, and a report."""
    derived = _generated_pruning.derived_predicates(
        snapshot.schema, snapshot.partition_columns, predicates
    )
    pruned = _pruning.prune_files(
        snapshot.files(), [*predicates, *derived], snapshot.partition_columns
    )
    deleted = snapshot.deleted_rows() if pruned.files else {}
    tasks = [
        FileTask(
            uri=_uri.join(snapshot.uri, entry.path),
            size=entry.size,
            partition_values=entry.partition_values,
            deleted_rows=deleted.get(entry.path),
        )
        for entry in pruned.files
    ]
    report = ScanReport(
        table_uri=snapshot.uri,
        version=snapshot.version,
        files_in_snapshot=pruned.files_in_snapshot,
        files_scanned=len(tasks),
        skipped_by_partition=pruned.skipped_by_partition,
        skipped_by_stats=pruned.skipped_by_stats,
        bytes_scanned=sum(t.size for t in tasks),
    )
    return tasks, report


class _Sized(Protocol):
    @property
    def size(self) -> int: ...


_Task = TypeVar("_Task", bound=_Sized)


def bin_pack(tasks: list[_Task], parallelism: int) -> list[list[_Task]]:
    """Group files into tasks the way Spark's FilePartition.getFilePartitions does."""
    total = sum(t.size + OPEN_COST_BYTES for t in tasks)
    target = min(MAX_PARTITION_BYTES, max(OPEN_COST_BYTES, total // max(parallelism, 1)))
    groups: list[list[_Task]] = []
    current: list[_Task] = []
    current_size = 0
    for task in sorted(tasks, key=lambda t: t.size, reverse=True):
        if current and current_size + task.size > target:
            groups.append(current)
            current, current_size = [], 0
        current.append(task)
        current_size += task.size + OPEN_COST_BYTES
    if current:
        groups.append(current)
    return groups


@dataclass(frozen=True)
class ReadLayout:
    """How a file's columns map to the output: physical names, target Arrow types, partitions."""

    target: pa.Schema
    physical: pa.Schema
    data_columns: tuple[int, ...]  # output positions stored in files
    partition_columns: dict[int, str]  # output position -> partition column name

    @staticmethod
    def build(snapshot: Snapshot, schema: StructType) -> ReadLayout:
        from deltaflow.spark._compat import to_arrow_schema

        target = to_arrow_schema(schema)
        physical_json = _schema.physical_schema(snapshot.schema)
        physical_by_logical = {
            logical["name"].lower(): phys
            for logical, phys in zip(
                snapshot.schema["fields"], physical_json["fields"], strict=True
            )
        }
        physical_fields = []
        for f in schema.fields:
            phys = physical_by_logical.get(f.name.lower())
            physical_fields.append(
                {**f.jsonValue(), "name": phys["name"], "type": phys["type"]}
                if phys
                else f.jsonValue()
            )
        physical = to_arrow_schema(
            StructType.fromJson({"type": "struct", "fields": physical_fields})
        )
        partitions = {c.lower(): c for c in snapshot.partition_columns}
        partition_positions = {
            i: partitions[f.name.lower()]
            for i, f in enumerate(schema.fields)
            if f.name.lower() in partitions
        }
        data = tuple(i for i in range(len(schema.fields)) if i not in partition_positions)
        return ReadLayout(target, physical, data, partition_positions)


def read_file(task: FileTask, layout: ReadLayout) -> Iterator[pa.RecordBatch]:
    fs, path = _uri.filesystem(task.uri)
    with fs.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle, coerce_int96_timestamp_unit="us")
        available = set(parquet.schema_arrow.names)
        wanted = [layout.physical.field(i).name for i in layout.data_columns]
        present = [name for name in wanted if name in available]
        keep = _keep_mask(task.deleted_rows, parquet.metadata.num_rows, task.kept_rows)
        offset = 0
        batches = parquet.iter_batches(batch_size=BATCH_ROWS, columns=present, use_threads=False)
        for batch in batches:
            rows = batch.num_rows
            if keep is not None:
                mask = keep[offset : offset + rows]
                offset += rows
                if not mask.all():
                    batch = batch.filter(pa.array(mask))
            yield _shape(batch, task, layout)


def _keep_mask(
    deleted: np.ndarray | None, num_rows: int, kept: np.ndarray | None = None
) -> np.ndarray | None:
    if kept is not None:
        only = np.zeros(num_rows, dtype=bool)
        only[kept[kept < num_rows]] = True
        return only
    if deleted is None or len(deleted) == 0:
        return None
    keep = np.ones(num_rows, dtype=bool)
    keep[deleted[deleted < num_rows]] = False
    return keep


def _shape(batch: pa.RecordBatch, task: FileTask, layout: ReadLayout) -> pa.RecordBatch:
    rows = batch.num_rows
    names = batch.schema.names
    columns: list[pa.Array] = []
    for i, target_field in enumerate(layout.target):
        if i in layout.partition_columns:
            value = task.partition_values.get(layout.partition_columns[i])
            columns.append(_arrow.constant_array(value, target_field.type, rows))
            continue
        physical_field = layout.physical.field(i)
        name = physical_field.name
        array = batch.column(names.index(name)) if name in names else None
        columns.append(_arrow.conform(array, physical_field.type, target_field.type, rows))
    return pa.RecordBatch.from_arrays(columns, schema=layout.target)
