"""Batch writes: executors write Parquet files in parallel, the driver commits once.

``plan_write`` (:mod:`._plan`) runs on the driver before any data moves: it settles the
table's schema and partitioning and refuses bad input early. ``write`` runs in each task
and returns the files it wrote; ``commit`` turns all of them into one Delta
commit. Files of a failed or aborted job are never referenced by the log;
``abort`` deletes them right away and VACUUM would remove any it missed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from deltaflow.errors import DeltaflowError, RemoteDeltaflowError
from deltaflow.spark.write import _files, _replace_where
from deltaflow.spark.write._plan import WritePlan, arrow_schema, require_arrow_checks
from deltaflow.table import _commit, _commit_info, _schema
from deltaflow.table._snapshot import load_snapshot

log = logging.getLogger("deltaflow.write")

DEFAULT_MAX_ROWS_PER_FILE = _files.DEFAULT_MAX_ROWS_PER_FILE


def commit_request(
    plan: WritePlan, adds: list[_commit.AddedFile], **overrides: Any
) -> _commit.CommitRequest:
    """The commit of ``adds`` under ``plan``: the plan's schema, partitioning, mode, read
    version and app transaction; ``overrides`` replace any field (commitInfo, ...)."""
    operation, parameters = _operation(plan)
    request = _commit.CommitRequest(
        table_uri=plan.table_uri,
        schema=plan.schema,
        partition_columns=plan.partition_columns,
        adds=adds,
        operation=operation,
        commit_info={"operationParameters": parameters} if parameters else {},
        mode="overwrite" if plan.mode == "overwrite" else "append",
        read_version=plan.read_version,
        new_columns=plan.new_columns,
        configuration=plan.configuration,
        app_id=plan.options.txn_app_id,
        app_version=plan.options.txn_version,
        user_metadata=plan.options.user_metadata,
        description=plan.options.table_comment,
        identity_generated=plan.identity_generated,
        clustering_columns=plan.options.clustering_columns,
        auto_compact=plan.options.auto_compact,
        replace_table=plan.replace_table,
        evolves_in_commit=plan.evolves_in_commit,
        replace_partitioning=plan.repartitions,
    )
    if plan.dynamic_overwrite and plan.read_version is not None:
        # Explicit removes of the touched partitions' files; delta-rs derives none (and
        # records mode Append): delta-spark's WRITE parameters go beside its own.
        info = {
            **request.commit_info,
            _commit_info.HISTORY_PARAMETERS_KEY: {
                "mode": "Overwrite",
                "partitionBy": json.dumps(list(plan.partition_columns)),
                "isDynamicPartitionOverwrite": True,
            },
        }
        request = replace(
            request, removes=partition_removes(plan, adds), mode="append", commit_info=info
        )
    return replace(request, **overrides) if overrides else request


# Spark's SaveMode names, which delta-spark records as a WRITE's "mode".
_SAVE_MODES = {
    "append": "Append",
    "overwrite": "Overwrite",
    "error": "ErrorIfExists",
    "ignore": "Ignore",
}
# delta-spark's operation names of the catalog's statements that write a query's rows.
_CREATE_OPERATIONS = {
    "create": "CREATE TABLE AS SELECT",
    "replace": "REPLACE TABLE AS SELECT",
    "createOrReplace": "CREATE OR REPLACE TABLE AS SELECT",
}


def _operation(plan: WritePlan) -> tuple[str, dict[str, Any] | None]:
    """delta-spark's operation name and parameters for a write under ``plan``
    (parameters None: the ones delta-rs records for a WRITE to an existing table, which
    are delta-spark's: mode and partitionBy)."""
    options = plan.options
    partition_by = json.dumps(list(plan.partition_columns))
    operation = _CREATE_OPERATIONS.get(options.create_mode or "")
    if operation is not None:
        parameters: dict[str, Any] = {
            "isManaged": "true" if options.create_managed else "false",
            "description": options.table_comment,
            "partitionBy": partition_by,
            "clusterBy": json.dumps(list(options.clustering_columns or ())),
            "properties": json.dumps(dict(options.table_properties)),
        }
        if options.create_v1_overwrite:  # saveAsTable's overwrite, as delta-spark records it
            parameters["isV1SaveAsTableOverwrite"] = "true"
            if options.overwrite_schema:
                parameters["canOverwriteSchema"] = "true"
            elif options.merge_schema:
                parameters["canMergeSchema"] = "true"
        return operation, parameters
    if plan.repartitions:
        # The log writer's commit: delta-spark's parameters of an overwriteSchema WRITE
        # (a dynamic one that leaves the table unpartitioned replaces everything, and
        # delta-spark still marks it dynamic).
        parameters = {"mode": "Overwrite", "partitionBy": partition_by, "canOverwriteSchema": True}
        if options.partition_overwrite_mode == "dynamic":
            parameters["isDynamicPartitionOverwrite"] = True
        return "WRITE", parameters
    if plan.read_version is not None:
        return "WRITE", None
    mode = _SAVE_MODES.get(plan.save_mode or plan.mode, "Append")
    return "WRITE", {"mode": mode, "partitionBy": partition_by}


def partition_removes(
    plan: WritePlan, adds: Sequence[_commit.AddedFile]
) -> list[_commit.RemovedFile]:
    """A dynamic partition overwrite's removes: every live file (at the version the
    write read) of each partition the written files fall in."""
    snapshot = load_snapshot(plan.table_uri, version=plan.read_version)
    physical = _schema.top_level_physical_names(snapshot.schema)
    touched = {tuple(sorted(a.partition_values.items())) for a in adds}
    removes = []
    for entry in snapshot.files(stats=False):
        values = _replace_where.serialized_partition_values(entry, physical)
        if tuple(sorted(values.items())) in touched:
            removes.append(
                _commit.RemovedFile(path=entry.path, size=entry.size, partition_values=values)
            )
    return removes


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    files: list[_commit.AddedFile]
    num_rows: int


class DeltaBatchWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan, spark_schema: StructType) -> None:
        self.plan = plan
        # Every file of this job carries the id in its name, so abort() can find files of
        # tasks whose commit messages never reached it (tasks finishing after the failure).
        self.job_id = uuid.uuid4().hex[:8]
        self.input_schema_json = spark_schema.jsonValue()
        require_arrow_checks(plan)  # on the driver: a constraint Arrow cannot check fails here

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        if self.plan.skip:
            return DeltaCommitMessage(files=[], num_rows=0)
        writer = _files.FileSetWriter(self.plan, job_id=self.job_id, check_rows=True)
        return writer.write_all(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.skip:
            return
        adds = [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]
        # Files this commit writes itself (replaceWhere rewrites); the tasks' files are
        # abort()'s job if the commit fails.
        rewritten: list[_commit.AddedFile] = []
        try:
            self._commit(adds, rewritten)
        except DeltaflowError as exc:
            _files.delete_files(self.plan.table_uri, rewritten)
            raise RemoteDeltaflowError(exc) from exc
        except BaseException:
            _files.delete_files(self.plan.table_uri, rewritten)
            raise

    def _commit(self, adds: list[_commit.AddedFile], rewritten: list[_commit.AddedFile]) -> None:
        removes: list[_commit.RemovedFile] = []
        if self.plan.replace_where is not None and self.plan.read_version is not None:
            removes = _replace_rows(self.plan, rewritten)
        request = commit_request(self.plan, [*adds, *rewritten])
        if self.plan.replace_where is not None:
            # With explicit removes: delta-rs derives none of its own (so it records mode
            # Append in the log's parameters, and takes no other mode there); delta-spark's
            # WRITE parameters go beside them for history() (as the MERGE route's do).
            info = {
                "operationParameters": {"predicate": self.plan.replace_where},
                _commit_info.HISTORY_PARAMETERS_KEY: {
                    "mode": "Overwrite",
                    "partitionBy": json.dumps(list(self.plan.partition_columns)),
                    "predicate": self.plan.replace_where,
                },
            }
            request = replace(request, removes=removes, mode="append", commit_info=info)
        started = time.perf_counter()
        result = _commit.commit(request)
        if result.skipped:
            _files.delete_files(self.plan.table_uri, [*adds, *rewritten])
        log.info(
            "deltaflow commit to %s: version %s, %d files, %.1f ms%s",
            self.plan.table_uri,
            result.version,
            len(adds),
            (time.perf_counter() - started) * 1000,
            " (duplicate app transaction, skipped)" if result.skipped else "",
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        adds = [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]
        _files.delete_files(self.plan.table_uri, adds)
        _files.delete_job_files(self.plan.table_uri, self.job_id)


def _replace_rows(plan: WritePlan, rewritten: list[_commit.AddedFile]) -> list[_commit.RemovedFile]:
    """Removes for the rows replaceWhere replaces; files it rewrites go into ``rewritten``."""
    assert plan.replace_where is not None and plan.read_version is not None
    snapshot = load_snapshot(plan.table_uri, version=plan.read_version)
    schema = arrow_schema(snapshot.schema)
    replacement = _replace_where.plan_replacement(snapshot, plan.replace_where, schema)
    if replacement.rewrite:
        writer = _files.FileSetWriter(plan)
        try:
            for entry in replacement.rewrite:
                for batch in _replace_where.kept_rows(snapshot, entry, plan.replace_where, schema):
                    writer.write(batch)
            rewritten.extend(writer.close().files)
        except BaseException:
            writer.discard()
            raise
    physical = _schema.top_level_physical_names(snapshot.schema)
    return [
        _commit.RemovedFile(
            path=entry.path,
            size=entry.size,
            partition_values=_replace_where.serialized_partition_values(entry, physical),
        )
        for entry in (*replacement.remove, *replacement.rewrite)
    ]
