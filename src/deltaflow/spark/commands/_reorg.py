"""``REORG TABLE t [WHERE partition predicate] APPLY (PURGE)``: files with deletion
vectors rewritten without their deleted rows.

delta-spark's purge: every live file that has a deletion vector (in the partitions the
predicate selects) is read with its deletion vector applied and written again; one
commit removes the old entries (naming their vectors) and adds the new files, all with
``dataChange=false``, so streams and the change data feed skip it. Afterwards no file
of those partitions has a deletion vector, and VACUUM can delete the old files and
their vectors once they are past retention. The rows are read and written here, in the
brain process (pyarrow), as delta-rs's OPTIMIZE does.

Output: OPTIMIZE's row (``path``, ``metrics``), as delta-spark's REORG returns.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from deltaflow.errors import InvalidOptionError
from deltaflow.spark._options import parse_write_options
from deltaflow.spark.dml import _changes
from deltaflow.spark.write import _replace_where
from deltaflow.spark.write._plan import plan_write
from deltaflow.table import _commit, _compaction_lease, _log_commit, _predicates, _schema, _uri
from deltaflow.table._snapshot import FileEntry, Snapshot, load_snapshot

log = logging.getLogger("deltaflow.reorg")

Row = tuple[Any, ...]


def reorg_purge(
    uri: str, *, where: str | None = None, commit_info: Mapping[str, Any] | None = None
) -> list[Row]:
    """Rewrite the files of ``uri`` that have deletion vectors (in the partitions
    ``where`` selects) without their deleted rows; one ``dataChange=false`` commit.
    ``commit_info``: more commitInfo keys (``deltaflow maintain`` marks its runs); its
    ``operationParameters`` are merged into REORG's."""
    from pyspark.sql.types import StructType

    from deltaflow.spark.read._reader import FileTask, ReadLayout, read_file
    from deltaflow.spark.write._files import FileSetWriter

    snapshot = load_snapshot(uri)
    deleted = snapshot.deleted_rows()
    files = [f for f in _selected(snapshot, where) if len(deleted.get(f.path, ()))]
    if not files:
        return [_row(snapshot.uri, 0, [], [])]
    _log_commit.require_conditional_put(snapshot.uri, "REORG TABLE ... APPLY (PURGE)")
    logical = _schema.logical_schema(snapshot.schema)
    layout = ReadLayout.build(snapshot, StructType.fromJson(logical))
    plan = plan_write(
        snapshot.uri, logical, "append", parse_write_options({"path": uri}), current=snapshot
    )
    plan = dataclasses.replace(plan, read_version=snapshot.version)
    writer = FileSetWriter(plan, job_id="reorg")
    try:
        for entry in files:
            task = FileTask(
                _uri.join(snapshot.uri, entry.path),
                entry.size,
                entry.partition_values,
                deleted[entry.path],
            )
            for batch in read_file(task, layout):
                writer.write(batch)
        written = writer.close().files
    except BaseException:
        writer.discard()
        raise
    adds = [dataclasses.replace(a, data_change=False) for a in written]
    try:
        removes = [
            dataclasses.replace(r, data_change=False) for r in _changes.removes(snapshot, files)
        ]
        # A delta-rs compaction that read these files would not see this commit's
        # dataChange=false removes: commit while no compaction runs (_compaction_lease).
        with _compaction_lease.holding(snapshot.uri, _REORG_LEASE_WAIT_SECONDS) as held:
            if not held:
                raise _compaction_lease.busy(
                    "REORG TABLE", snapshot.uri, snapshot.version, _REORG_LEASE_WAIT_SECONDS
                )
            version = _commit_reorg(snapshot, plan, adds, removes, files, where, commit_info)
    except BaseException:
        _changes.Written(list(written), [], 0).delete(snapshot.uri)
        raise
    log.info("REORG PURGE of %s: %d files rewritten, version %s", uri, len(files), version)
    return [_row(snapshot.uri, len(files), files, adds)]


def _selected(snapshot: Snapshot, where: str | None) -> list[FileEntry]:
    files = snapshot.files()
    if not where:
        return files
    node = _predicates.parse(where, option="where")
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    others = sorted({p[0] for p in _column_paths(node) if p[0].lower() not in partitions})
    if others:
        raise InvalidOptionError(
            f"REORG TABLE {snapshot.uri} WHERE {where}: the predicate may only name partition"
            f" columns ({', '.join(snapshot.partition_columns) or 'the table has none'}), not"
            f" {', '.join(others)}. Drop the WHERE clause to purge every file.",
            option="where",
        )
    return [
        f for f in files if _predicates.may_match(node, _replace_where._stats_lookup(f, partitions))
    ]


def _column_paths(node: Any) -> list[tuple[str, ...]]:
    if isinstance(node, _predicates.Column):
        return [tuple(node.path)]
    if isinstance(node, tuple):
        return [p for child in node for p in _column_paths(child)]
    if dataclasses.is_dataclass(node) and not isinstance(node, _predicates.Literal):
        return [p for f in dataclasses.fields(node) for p in _column_paths(getattr(node, f.name))]
    return []


def _row(uri: str, removed: int, files: list[FileEntry], adds: list[Any]) -> Row:
    def stats(sizes: list[int]) -> Row | None:
        if not sizes:
            return None
        return (min(sizes), max(sizes), sum(sizes) / len(sizes), len(sizes), sum(sizes))

    partitions = {json.dumps(f.partition_values, sort_keys=True, default=str) for f in files}
    return (
        uri,
        (
            len(adds),
            removed,
            stats([a.size for a in adds]),
            stats([f.size for f in files]),
            len(partitions),
            None,
            1 if files else 0,
            len(files),
            0,
            True,
        ),
    )


# REORG waits this long for a running compaction of the table to finish.
_REORG_LEASE_WAIT_SECONDS = 600.0


def _commit_reorg(
    snapshot: Snapshot,
    plan: Any,
    adds: list[Any],
    removes: list[Any],
    files: list[FileEntry],
    where: str | None,
    commit_info: Mapping[str, Any] | None = None,
) -> int | None:
    """REORG's one dataChange=false commit."""
    extra = dict(commit_info or {})
    parameters = {
        "predicate": json.dumps([where] if where else []),
        "applyPurge": "true",
        **dict(extra.pop("operationParameters", None) or {}),
    }
    return _commit.commit(
        _commit.CommitRequest(
            table_uri=snapshot.uri,
            schema=plan.schema,
            partition_columns=plan.partition_columns,
            adds=adds,
            removes=removes,
            read_version=snapshot.version,
            read=_log_commit.ReadSet(files=frozenset(f.path for f in files)),
            operation="REORG",
            commit_info={
                **extra,
                "operationParameters": parameters,
                "operationMetrics": {
                    "numAddedFiles": str(len(adds)),
                    "numRemovedFiles": str(len(removes)),
                    "numDeletionVectorsRemoved": str(len(removes)),
                },
            },
        )
    ).version
