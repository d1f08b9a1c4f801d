"""The write side of DML: data files, change data files, and what the commit needs.

With ``delta.enableChangeDataFeed=true``, DELETE / UPDATE / MERGE write, next to
the rewritten data files, ``_change_data/<partition path>/cdc-*.parquet`` files with
the table's columns plus ``_change_type`` (``delete``, ``update_preimage``,
``update_postimage``, ``insert``), each committed as a ``cdc`` action, as
delta-spark does. Readers of the change feed use only the ``cdc`` actions of a
commit that has any, so such a commit's change files hold all its changes.

Job 2 of a DML hands :func:`write` one DataFrame: rows whose ``_change_type`` is
NULL are table rows (data files), the others change rows (change files).

Removes name the file's deletion vector and the commit carries a
:class:`~deltaflow.table._log_commit.ReadSet`, so DML goes through deltaflow's log
writer and follows delta-spark's conflict rules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.errors import DeltaflowError
from deltaflow.spark.write import _files, _replace_where
from deltaflow.table import (
    _commit,
    _conditional_put,
    _constraints,
    _log_commit,
    _partitions,
    _predicates,
    _schema,
)
from deltaflow.table._snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from deltaflow.spark.write._plan import WritePlan

log = logging.getLogger("deltaflow.dml")

CHANGE_TYPE = "_change_type"
CHANGE_DATA_DIR = "_change_data"
DELETE, INSERT = "delete", "insert"
PREIMAGE, POSTIMAGE = "update_preimage", "update_postimage"


def cdf_enabled(snapshot: Snapshot) -> bool:
    return any(
        k.lower() == "delta.enablechangedatafeed" and (v or "").lower() == "true"
        for k, v in snapshot.configuration.items()
    )


def change_plan(plan: WritePlan) -> WritePlan:
    """``plan`` for change data files: the table's columns plus ``_change_type``."""
    column = {"name": CHANGE_TYPE, "type": "string", "nullable": True, "metadata": {}}
    schema = {**plan.schema, "fields": [*plan.schema["fields"], column]}
    physical = {**plan.physical_schema, "fields": [*plan.physical_schema["fields"], column]}
    return dataclasses.replace(plan, schema=schema, physical_schema=physical)


class ChangeDataWriter(_files.FileSetWriter):
    """A FileSetWriter whose files go to ``_change_data/<partition path>/cdc-*.parquet``."""

    def _new_file(self, values: dict[str, str | None]) -> _files.OpenFile:
        number = len(self.done) + len(self.open)
        name = f"cdc-{number:05d}-{self.job_id}-{self.task_id}-{uuid.uuid4()}.c000.snappy.parquet"
        directory = _partitions.partition_dir(list(self.plan.partition_columns), values)
        relative = "/".join(p for p in (CHANGE_DATA_DIR, directory, name) if p)
        full = self.root.rstrip("/") + "/" + relative
        self.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
        log_values = {self.plan.partition_physical.get(k, k): v for k, v in values.items()}
        return _files.OpenFile(self.fs, relative, full, self.file_schema, self.plan, log_values)


@dataclasses.dataclass(frozen=True)
class Written:
    adds: list[_commit.AddedFile]
    cdc: list[_commit.AddedFile]
    rows: int  # table rows (change rows not counted)

    def delete(self, table_uri: str) -> None:
        _files.delete_files(table_uri, [*self.adds, *self.cdc])


def write(rows: DataFrame, plan: WritePlan, *, changes: bool) -> Written:
    """Write ``rows`` in Spark tasks; with ``changes``, rows carry ``_change_type``.

    Without change rows, Spark's own Parquet writer writes them when it can
    (:mod:`._native_write`, same eligibility and ``deltaflow.write.nativeWrite`` conf
    as a batch write); otherwise Python tasks do (:class:`FileSetWriter`).
    """
    with constraint_errors(plan):
        return _write(guarded(rows, plan, changes=changes), plan, changes=changes)


@contextlib.contextmanager
def constraint_errors(plan: WritePlan) -> Iterator[None]:
    """A Spark job's failure from :func:`guarded`'s check raised as the typed violation."""
    try:
        yield
    except Exception as exc:
        violation = _constraints.violation_from_text(str(exc), plan.checks, plan.table_uri)
        if violation is not None:
            raise violation from exc
        raise


def guarded(rows: DataFrame, plan: WritePlan, *, changes: bool) -> DataFrame:
    """``rows`` checked against the table's NOT NULL columns and CHECK constraints in
    Spark (change rows, which are not table rows, left out): the first violating row
    fails the job, so nothing is committed."""
    if not plan.checks:
        return rows
    names = rows.columns
    first = next(n for n in names if n != CHANGE_TYPE)
    only_if = f"{_constraints.quote([CHANGE_TYPE])} IS NULL" if changes else None
    guard = _constraints.guard_sql(plan.checks, first, only_if=only_if)
    return rows.selectExpr(
        *(
            f"{guard} AS {_constraints.quote([n])}" if n == first else _constraints.quote([n])
            for n in names
        )
    )


def _write(rows: DataFrame, plan: WritePlan, *, changes: bool) -> Written:
    from deltaflow.errors import RemoteDeltaflowError, unpack_remote_error

    if not changes:
        native = _write_native(rows, plan)
        if native is not None:
            return native
    job_id = uuid.uuid4().hex[:8]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            written = write_batches(batches, plan, changes=changes, job_id=job_id)
        except DeltaflowError as exc:
            raise RemoteDeltaflowError(exc) from exc
        yield pa.RecordBatch.from_pydict(
            {
                "files": [json.dumps([dataclasses.asdict(f) for f in written.adds])],
                "cdc": [json.dumps([dataclasses.asdict(f) for f in written.cdc])],
                "rows": [written.rows],
            },
            schema=pa.schema([("files", pa.string()), ("cdc", pa.string()), ("rows", pa.int64())]),
        )

    try:
        results = rows.mapInArrow(run, "files string, cdc string, rows long").collect()
    except Exception as exc:
        _files.delete_job_files(plan.table_uri, job_id)
        remote = unpack_remote_error(exc)
        if remote is not None:
            raise remote from exc
        raise
    return Written(
        adds=[_commit.AddedFile(**f) for r in results for f in json.loads(r["files"])],
        cdc=[_commit.AddedFile(**f) for r in results for f in json.loads(r["cdc"])],
        rows=sum(int(r["rows"]) for r in results),
    )


def write_batches(
    batches: Iterable[pa.RecordBatch], plan: WritePlan, *, changes: bool, job_id: str
) -> Written:
    """Write ``batches`` here, in this process: table rows to data files and, with
    ``changes``, rows whose ``_change_type`` is set to change data files. On failure
    every file written is deleted and the error raised."""
    writer = _files.FileSetWriter(plan, job_id=job_id)
    cdc_writer = ChangeDataWriter(change_plan(plan), job_id=job_id) if changes else None
    try:
        for batch in batches:
            if cdc_writer is None:
                writer.write(batch)
                continue
            is_data = pc.is_null(batch.column(batch.schema.get_field_index(CHANGE_TYPE)))
            writer.write(batch.filter(is_data).drop_columns([CHANGE_TYPE]))
            cdc_writer.write(batch.filter(pc.invert(is_data)))
        message = writer.close()
        changed = cdc_writer.close().files if cdc_writer else []
    except BaseException:
        writer.discard()
        if cdc_writer:
            cdc_writer.discard()
        raise
    return Written(adds=list(message.files), cdc=list(changed), rows=message.num_rows)


def _write_native(rows: DataFrame, plan: WritePlan) -> Written | None:
    """The rows written by Spark's Parquet writer (uncommitted), or None: not eligible."""
    from deltaflow.spark.write import _native

    spark = rows.sparkSession
    native = _native.plan_native_write(plan, rows.schema.jsonValue(), spark.conf.get)
    if not isinstance(native, _native.NativeWrite):
        log.info("DML write to %s: Python writer (%s)", plan.table_uri, native.reason)
        return None
    adds = _native.stage_native(rows, plan, native)
    count = _native.rows_in(adds)
    log.info("DML write to %s: JVM Parquet writer, %d files", plan.table_uri, len(adds))
    return Written(adds=adds, cdc=[], rows=count)


def removes(snapshot: Snapshot, files: list[FileEntry]) -> list[_commit.RemovedFile]:
    """Remove actions for ``files``, naming each one's deletion vector and stats."""
    physical = _schema.top_level_physical_names(snapshot.schema)
    with_dv = set(snapshot.deleted_rows()) if files else set()
    wanted = [f.path for f in files if f.path in with_dv]
    if wanted:
        _log_commit.require_conditional_put(
            snapshot.uri, "Rewriting files that have deletion vectors"
        )
    logged = _log_commit.add_actions_of(snapshot.uri, snapshot.version, wanted) if wanted else {}
    out = []
    for f in files:
        add = logged.get(f.path, {})
        if f.path in with_dv and not add.get("deletionVector"):
            raise DeltaflowError(
                f"The log of table {snapshot.uri} at version {snapshot.version} has no"
                f" deletion vector for {f.path}, though delta-rs reports one. Nothing was"
                " committed; report this with the table's _delta_log.",
                table_uri=snapshot.uri,
            )
        out.append(
            _commit.RemovedFile(
                path=f.path,
                size=f.size,
                partition_values=_replace_where.serialized_partition_values(f, physical),
                deletion_vector=add.get("deletionVector"),
                stats=add.get("stats"),
            )
        )
    return out


def read_set(
    snapshot: Snapshot, files: list[FileEntry], node: Any | None, *, whole_table: bool
) -> _log_commit.ReadSet:
    """What a DML read: ``files``, and (conflicts on new files) ``node``'s partition part."""
    return _log_commit.ReadSet(
        files=frozenset(f.path for f in files),
        partition_predicate=None if node is None else partition_predicate(snapshot, node),
        whole_table=whole_table,
    )


def partition_predicate(snapshot: Snapshot, node: Any) -> _log_commit.PartitionPredicate:
    """``node`` judged on a file's raw partition values alone (other columns: may match)."""
    physical = _schema.top_level_physical_names(snapshot.schema)
    types = {
        f["name"].lower(): (physical.get(f["name"], f["name"]), f["type"])
        for f in snapshot.schema["fields"]
        if f["name"] in snapshot.partition_columns and isinstance(f["type"], str)
    }

    def matches(values: Mapping[str, str | None]) -> bool:
        def lookup(path: _predicates.ColumnPath) -> _predicates.ColumnStats | None:
            known = types.get(path[0].lower()) if len(path) == 1 else None
            if known is None or known[0] not in values:
                return None
            value = _partitions.parse_partition_value(values[known[0]], known[1])
            return _predicates.ColumnStats(value, value, 1 if value is None else 0, 1)

        return _predicates.may_match(node, lookup)

    return matches


def require_log_writer(snapshot: Snapshot, operation: str) -> None:
    """Change data files can only be committed by deltaflow's log writer, which needs a
    store with put-if-absent (local paths, S3, GCS, Azure)."""
    if cdf_enabled(snapshot):
        _log_commit.require_conditional_put(
            snapshot.uri, f"{operation} with the change data feed enabled"
        )


def uses_log_writer(uri: str) -> bool:
    """Whether DML on ``uri`` commits with deltaflow's log writer (its conflict rules)."""
    return _conditional_put.supported(uri)
