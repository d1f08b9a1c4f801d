"""Parquet files of one write: partition directories, rolling, stats, cleanup.

Used by tasks (the rows Spark hands them) and by the driver's commit (rows a
replaceWhere rewrite keeps). Every file name carries the job id so that an
aborted job's files can be found and deleted.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.types import StructType

from deltaflow.spark.write import _replace_where
from deltaflow.table import _arrow, _commit, _constraints, _partitions, _schema, _stats, _uri

if TYPE_CHECKING:
    from deltaflow.spark.write._plan import WritePlan
    from deltaflow.spark.write._writer import DeltaCommitMessage

log = logging.getLogger("deltaflow.write")

# Roll to a new file after this many rows when the user set no maxRecordsPerFile:
# keeps files near Spark's 128 MiB scan split for typical 50-200 byte rows.
DEFAULT_MAX_ROWS_PER_FILE = 2_000_000


def delete_job_files(table_uri: str, job_id: str) -> None:
    """Best effort: delete every data file named with ``job_id`` (never committed)."""
    import pyarrow.fs as pafs

    fs, root = _uri.filesystem(table_uri)
    marker = f"-{job_id}-"
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError:
        log.warning("could not list %s to clean up after an aborted write", table_uri)
        return
    for info in infos:
        if "_delta_log" in info.path or marker not in info.base_name:
            continue
        try:
            fs.delete_file(info.path)
        except OSError:
            log.warning("could not delete uncommitted file %s", info.path)


def delete_files(table_uri: str, files: list[_commit.AddedFile]) -> None:
    for added in files:
        fs, path = _uri.filesystem(_uri.join(table_uri, added.path))
        try:
            fs.delete_file(path)
        except OSError:
            log.warning("could not delete uncommitted file %s", added.path)


# Row groups of ~1M rows / 128 MiB: big enough to encode efficiently and for readers to
# skip by row-group stats, small enough that a task's buffer stays well under its memory.
ROW_GROUP_ROWS = 1_000_000
ROW_GROUP_BYTES = 128 * 1024 * 1024


class OpenFile:
    def __init__(
        self,
        fs: Any,
        relative: str,
        full_path: str,
        schema: pa.Schema,
        plan: WritePlan,
        partition_values: dict[str, str | None],
    ) -> None:
        self.relative = relative
        self.full_path = full_path
        self.stream = fs.open_output_stream(full_path)
        self.writer = pq.ParquetWriter(self.stream, schema, compression=plan.options.compression)
        self.stats = _stats.StatsAccumulator(plan.num_indexed_cols)
        self.partition_values = partition_values
        self.rows = 0
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        # Spark hands over ~10k-row Arrow batches; one row group each would encode ~3x
        # slower and make files ~25% larger (measured, docs/benchmarks.md), so batches
        # are gathered into row groups of up to ROW_GROUP_ROWS / ROW_GROUP_BYTES.
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._pending_bytes += batch.nbytes
        self.stats.add(batch)
        self.rows += batch.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS or self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            table = pa.Table.from_batches(self._pending)
            self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
            self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def close(self, fs: Any) -> _commit.AddedFile:
        self._flush()
        self.writer.close()
        self.stream.close()
        size = fs.get_file_info(self.full_path).size
        return _commit.AddedFile(
            path=self.relative,
            size=size,
            partition_values=self.partition_values,
            modification_time=int(time.time() * 1000),
            stats=self.stats.to_json(),
        )


class FileSetWriter:
    """Writes one task's rows: one open file per partition, rolled by row count."""

    def __init__(
        self, plan: WritePlan, *, job_id: str = "commit", check_rows: bool = False
    ) -> None:
        from deltaflow.spark._compat import to_arrow_schema

        self.plan = plan
        self.fs, self.root = _uri.filesystem(plan.table_uri)
        partitions = {c.lower() for c in plan.partition_columns}
        logical = StructType.fromJson(_schema.logical_schema(plan.schema))
        physical = StructType.fromJson(plan.physical_schema)
        self.logical_target = to_arrow_schema(logical)
        physical_arrow = to_arrow_schema(physical)
        data_positions = [
            i for i, f in enumerate(logical.fields) if f.name.lower() not in partitions
        ]
        self.data_positions = data_positions
        file_fields = [physical_arrow.field(i) for i in data_positions]
        if plan.column_mapping:
            delta_fields = plan.schema["fields"]
            file_fields = [
                _arrow.with_field_ids(f, delta_fields[i])
                for f, i in zip(file_fields, data_positions, strict=True)
            ]
        self.file_schema = pa.schema(file_fields)
        self.logical_data_types = [self.logical_target.field(i) for i in data_positions]
        self.max_rows = plan.options.max_records_per_file or DEFAULT_MAX_ROWS_PER_FILE
        self.open: dict[tuple[str | None, ...], OpenFile] = {}
        self.done: list[_commit.AddedFile] = []
        self.rows = 0
        self.task_id = uuid.uuid4().hex[:8]
        self.job_id = job_id
        self.row_check = (
            _replace_where.RowCheck(plan.table_uri, plan.replace_where, self.logical_target)
            if check_rows and plan.replace_where is not None
            else None
        )
        self.constraints = (
            _constraints.ArrowChecks(plan.table_uri, plan.checks, self.logical_target)
            if check_rows and plan.checks and not plan.checks_verified
            else None
        )

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = self._to_table_shape(batch)
        if self.row_check is not None:
            self.row_check.check(batch)
        if self.constraints is not None:
            self.constraints.check(batch)
        self.rows += batch.num_rows
        if not self.plan.partition_columns:
            self._append((), {}, batch)
            return
        for values, part in _split_by_partition(batch, self.plan.partition_columns):
            serialized = {
                c: _partitions.serialize_partition_value(v)
                for c, v in zip(self.plan.partition_columns, values, strict=True)
            }
            self._append(tuple(serialized.values()), serialized, part)

    def _to_table_shape(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Reorder by name, cast to table types, fill missing columns with nulls."""
        by_name = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        columns = []
        for target in self.logical_target:
            position = by_name.get(target.name.lower())
            array = batch.column(position) if position is not None else None
            # Struct children are matched by the table's own names, so pass the target twice.
            columns.append(_arrow.conform(array, target.type, target.type, batch.num_rows))
            if not target.nullable and columns[-1].null_count:
                check = _constraints.not_null_check((target.name,))
                raise _constraints.violation(self.plan.table_uri, check, f"{target.name} = null")
        return pa.RecordBatch.from_arrays(columns, schema=self.logical_target)

    def _append(
        self, key: tuple[str | None, ...], values: dict[str, str | None], batch: pa.RecordBatch
    ) -> None:
        data = pa.RecordBatch.from_arrays(
            [
                _arrow.conform(
                    batch.column(i), field.type, self.file_schema.field(n).type, batch.num_rows
                )
                for n, (i, field) in enumerate(
                    zip(self.data_positions, self.logical_data_types, strict=True)
                )
            ],
            schema=self.file_schema,
        )
        start = 0
        while start < data.num_rows:
            handle = self.open.get(key)
            if handle is None:
                handle = self.open[key] = self._new_file(values)
            room = self.max_rows - handle.rows
            chunk = data.slice(start, room)
            handle.write(chunk)
            start += chunk.num_rows
            if handle.rows >= self.max_rows:
                self.done.append(handle.close(self.fs))
                del self.open[key]

    def _new_file(self, values: dict[str, str | None]) -> OpenFile:
        number = len(self.done) + len(self.open)
        name = (
            f"part-{number:05d}-{self.job_id}-{self.task_id}-{uuid.uuid4()}"
            f"-c000.{self.plan.options.compression}.parquet"
        )
        if self.plan.column_mapping:
            # Column-mapped tables use random prefixes instead of Hive-style directories.
            directory = uuid.uuid4().hex[:2]
        else:
            directory = _partitions.partition_dir(list(self.plan.partition_columns), values)
        relative = f"{directory}/{name}" if directory else name
        full = self.root.rstrip("/") + "/" + relative
        # The table root may not exist yet (first write); object stores ignore this.
        self.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
        log_values = {self.plan.partition_physical.get(k, k): v for k, v in values.items()}
        return OpenFile(self.fs, relative, full, self.file_schema, self.plan, log_values)

    def close(self) -> DeltaCommitMessage:
        from deltaflow.spark.write._writer import DeltaCommitMessage

        for handle in self.open.values():
            self.done.append(handle.close(self.fs))
        self.open.clear()
        return DeltaCommitMessage(files=self.done, num_rows=self.rows)

    def write_all(self, batches: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        """Write every batch and close; on failure delete what was written and re-raise.

        deltaflow errors are marked so they reach the driver typed (see errors.to_wire).
        """
        from deltaflow.errors import DeltaflowError, RemoteDeltaflowError

        try:
            for batch in batches:
                self.write(batch)
            return self.close()
        except DeltaflowError as exc:
            self.discard()
            raise RemoteDeltaflowError(exc) from exc
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        for handle in self.open.values():
            try:
                handle.writer.close()
                handle.stream.close()
            except Exception:
                pass
        self.open.clear()
        delete_files(self.plan.table_uri, self.done)


def _split_by_partition(
    batch: pa.RecordBatch, columns: tuple[str, ...]
) -> Iterator[tuple[tuple[Any, ...], pa.RecordBatch]]:
    table = pa.Table.from_batches([batch])
    keys = table.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([])
    if keys.num_rows == 1:
        yield tuple(keys.column(c)[0].as_py() for c in columns), batch
        return
    for row in keys.to_pylist():
        mask = None
        for column in columns:
            value = row[column]
            condition = (
                pc.is_null(table.column(column))
                if value is None
                else pc.equal(
                    table.column(column), pa.scalar(value, table.schema.field(column).type)
                )
            )
            condition = pc.fill_null(condition, False)
            mask = condition if mask is None else pc.and_(mask, condition)
        part = table.filter(mask).combine_chunks()
        for chunk in part.to_batches():
            yield tuple(row[c] for c in columns), chunk
