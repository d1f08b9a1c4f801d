"""``replaceWhere``: overwrite only the rows that match a predicate, atomically.

delta-spark semantics: with ``mode("overwrite")``, every row of the table for
which the predicate is true is replaced by the rows written, in one commit;
written rows must themselves satisfy the predicate, or the write fails and
nothing is committed.

- The driver checks the predicate before the job starts (syntax, columns).
- Each task checks its rows (:class:`RowCheck`); a violation fails the task,
  which fails the job, and ``abort`` deletes the files already written.
- At commit time the driver settles which files of the read snapshot hold
  matching rows: files whose partition values alone decide the predicate are
  removed whole; others are first filtered by their min/max stats, then read,
  and rewritten without the matching rows. Removes and adds share the commit,
  which delta-rs checks for conflicts against the version the write read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.table import _partitions, _predicates, _uri
from deltaflow.table._snapshot import FileEntry, Snapshot
from deltaflow.table.errors import ReplaceWhereViolationError, UnsupportedFeatureError

OPTION = "replaceWhere"


def validate(
    uri: str,
    predicate: str,
    schema: pa.Schema,
    partition_columns: tuple[str, ...],
    configuration: dict[str, str | None],
) -> None:
    """Refuse a predicate we cannot run on this table, before any data moves."""
    node = _predicates.parse(predicate, option=OPTION)
    _predicates.to_expression(node, schema, option=OPTION)
    partitions = {c.lower() for c in partition_columns}
    touches_data = any(path[0].lower() not in partitions for path in _predicates.columns(node))
    if touches_data and (configuration.get("delta.enableChangeDataFeed") or "").lower() == "true":
        # Rewriting part of a file needs change-data files for the deleted rows, which the
        # commit API we use cannot write yet; partition predicates remove whole files only.
        raise UnsupportedFeatureError(
            f"replaceWhere on data columns of table {uri} would rewrite files, and the table has"
            " the change data feed enabled, which deltaflow cannot record for rewrites yet. Use a"
            " predicate on partition columns only.",
            table_uri=uri,
            feature="changeDataFeed",
        )


class RowCheck:
    """Counts written rows that do not satisfy the predicate (false or null)."""

    def __init__(self, uri: str, predicate: str, schema: pa.Schema) -> None:
        self.uri = uri
        self.predicate = predicate
        node = _predicates.parse(predicate, option=OPTION)
        expression = _predicates.to_expression(node, schema, option=OPTION)
        self.outside = pc.Expression._call("invert", [_predicates.is_true(expression)])

    def check(self, batch: pa.RecordBatch) -> None:
        bad = batch.filter(self.outside).num_rows
        if bad:
            raise ReplaceWhereViolationError(
                f"{bad} written rows do not satisfy replaceWhere '{self.predicate}' for table"
                f" {self.uri}; nothing was committed. Write only rows that match the predicate,"
                " or widen it.",
                table_uri=self.uri,
                predicate=self.predicate,
            )


@dataclass(frozen=True)
class Replacement:
    """What the commit must do to the files of the read snapshot."""

    remove: tuple[FileEntry, ...]  # removed whole: every row matches
    rewrite: tuple[FileEntry, ...]  # removed, and their non-matching rows written again


def plan_replacement(snapshot: Snapshot, predicate: str, schema: pa.Schema) -> Replacement:
    """Sort the snapshot's files by what ``predicate`` does to them (reads candidates)."""
    node = _predicates.parse(predicate, option=OPTION)
    expression = _predicates.to_expression(node, schema, option=OPTION)
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    files = snapshot.files()
    if not files:
        return Replacement((), ())
    if all(path[0].lower() in partitions for path in _predicates.columns(node)):
        table = _partition_table(files, schema, partitions)
        matches = _predicates.evaluate(_predicates.is_true(expression), table).to_pylist()
        return Replacement(tuple(f for f, hit in zip(files, matches, strict=True) if hit), ())
    deleted = snapshot.deleted_rows()
    remove: list[FileEntry] = []
    rewrite: list[FileEntry] = []
    for entry in files:
        if not _predicates.may_match(node, _stats_lookup(entry, partitions)):
            continue
        if entry.path in deleted:
            raise UnsupportedFeatureError(
                f"replaceWhere would rewrite {entry.path} of table {snapshot.uri}, which has a"
                " deletion vector; deltaflow cannot remove such files yet. Run OPTIMIZE first.",
                table_uri=snapshot.uri,
                feature="deletionVectors",
            )
        matched = total = 0
        for batch in read_entry(snapshot, entry, schema):
            total += batch.num_rows
            matched += batch.filter(_predicates.is_true(expression)).num_rows
        if matched == 0:
            continue
        (remove if matched == total else rewrite).append(entry)
    return Replacement(tuple(remove), tuple(rewrite))


def kept_rows(
    snapshot: Snapshot, entry: FileEntry, predicate: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The rows of ``entry`` that the predicate does not replace (false or null)."""
    node = _predicates.parse(predicate, option=OPTION)
    outside = pc.Expression._call(
        "invert", [_predicates.is_true(_predicates.to_expression(node, schema, option=OPTION))]
    )
    for batch in read_entry(snapshot, entry, schema):
        kept = batch.filter(outside)
        if kept.num_rows:
            yield kept


def read_entry(snapshot: Snapshot, entry: FileEntry, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One file's rows in the table's logical shape, partition columns included."""
    from pyspark.sql.types import StructType

    from deltaflow.spark.read._reader import FileTask, ReadLayout, read_file
    from deltaflow.table import _schema

    struct = StructType.fromJson(_schema.logical_schema(snapshot.schema))
    layout = ReadLayout.build(snapshot, struct)
    task = FileTask(_uri.join(snapshot.uri, entry.path), entry.size, entry.partition_values)
    for batch in read_file(task, layout):
        yield _rename_like(batch, schema)


def _rename_like(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    # The read layout and the predicate schema agree on names up to case only.
    by_lower = {f.name.lower(): f.name for f in schema}
    names = [by_lower.get(n.lower(), n) for n in batch.schema.names]
    return batch.rename_columns(names) if names != batch.schema.names else batch


def serialized_partition_values(
    entry: FileEntry, physical: dict[str, str]
) -> dict[str, str | None]:
    return {
        physical.get(k, k): _partitions.serialize_partition_value(v)
        for k, v in entry.partition_values.items()
    }


def _partition_table(
    files: list[FileEntry], schema: pa.Schema, partitions: dict[str, str]
) -> pa.Table:
    arrays = {}
    for f in schema:
        if f.name.lower() in partitions:
            name = partitions[f.name.lower()]
            arrays[f.name] = pa.array([e.partition_values.get(name) for e in files], f.type)
    return pa.table(arrays)


def _stats_lookup(entry: FileEntry, partitions: dict[str, str]) -> _predicates.StatsLookup:
    rows = entry.num_records

    def lookup(path: _predicates.ColumnPath) -> _predicates.ColumnStats | None:
        top = path[0].lower()
        if top in partitions and len(path) == 1:
            # A partition value is exact stats: min = max = value.
            value = entry.partition_values.get(partitions[top])
            return _predicates.ColumnStats(value, value, rows if value is None else 0, rows)
        low, high, nulls = (
            _find(entry.min_values, path),
            _find(entry.max_values, path),
            _find(entry.null_counts, path),
        )
        if low is None and high is None and nulls is None:
            return None
        return _predicates.ColumnStats(low, high, nulls if isinstance(nulls, int) else None, rows)

    return lookup


def _find(tree: Any, path: _predicates.ColumnPath) -> Any:
    for part in path:
        if not isinstance(tree, dict):
            return None
        key = next((k for k in tree if k.lower() == part.lower()), None)
        if key is None:
            return None
        tree = tree[key]
    return tree
