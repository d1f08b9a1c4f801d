"""DML with deletion vectors: matched rows are marked deleted, their files are not rewritten.

On a table with ``delta.enableDeletionVectors=true`` (and the ``deletionVectors``
feature in its protocol), DELETE, UPDATE and MERGE do what delta-spark's
``DMLWithDeletionVectorsHelper`` does:

1. The target scan carries each row's index in its physical Parquet file
   (:data:`ROW_INDEX`: Spark's ``_metadata.row_index``, or the Python reader's
   position) and already drops rows that an existing deletion vector deletes.
2. Per touched file, the matched row indexes are merged with the file's current
   deletion vector. A file whose every live row matched is removed outright; each
   other touched file gets a new deletion vector. All new vectors of one commit go
   into one ``deletion_vector_<uuid>.bin`` file.
3. The commit removes the old file entry (naming its old deletion vector) and adds
   the same path with the new one, the ``numRecords`` of its stats unchanged (the
   physical file's) and ``tightBounds`` false. UPDATE and MERGE add the new versions
   of matched rows as new files; unchanged rows are never copied.

Conflict detection is unchanged: a file that gets a new deletion vector is a remove
(and add) of that file, so a concurrent DML touching it fails with
``ConcurrentDeleteRead`` / ``ConcurrentDeleteDelete``. Deletion vectors are written
only where deltaflow's own log writer commits (local tables); elsewhere DML rewrites
files as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from deltaflow.spark.write import _replace_where
from deltaflow.table import _commit, _conditional_put, _log_commit, _schema, _uri
from deltaflow.table._deletion_vectors import write_deletion_vectors
from deltaflow.table._snapshot import FileEntry, Snapshot
from deltaflow.table.errors import CorruptTableError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger("deltaflow.dml")

# Each target row's index in its physical Parquet file (before any deletion vector).
ROW_INDEX = "__deltaflow_row_index"
ENABLE_KEY = "delta.enabledeletionvectors"


def enabled(snapshot: Snapshot) -> bool:
    """Whether DML on ``snapshot`` marks rows in deletion vectors instead of rewriting."""
    config = {k.lower(): (v or "").lower() for k, v in snapshot.configuration.items()}
    return (
        config.get(ENABLE_KEY) == "true"
        and snapshot.has_deletion_vectors_enabled
        and _conditional_put.supported(snapshot.uri)
    )


@dataclasses.dataclass(frozen=True)
class FileMatches:
    """One candidate file: its live rows, and the physical indexes of those that matched."""

    total: int
    rows: np.ndarray

    @property
    def matched(self) -> int:
        return int(self.rows.size)


def collect_matches(
    df: DataFrame, key_column: str, matched: Column, index_of: Any
) -> dict[int, FileMatches]:
    """Per file (``index_of(key)``), its row count and the row indexes where ``matched``."""
    from pyspark.sql import functions as F

    rows = (
        df.groupBy(F.col(key_column))
        .agg(
            F.count(F.lit(1)).alias("total"),
            F.collect_list(F.when(matched, F.col(ROW_INDEX))).alias("rows"),
        )
        .collect()
    )
    return {
        index_of(r[key_column]): FileMatches(
            int(r["total"]), np.asarray(r["rows"] or [], dtype=np.int64)
        )
        for r in rows
    }


class ReAddedFile(_commit.AddedFile):
    """A live file added again with a new deletion vector: its log ``add``, as is."""

    action: dict[str, Any]

    def __init__(self, action: dict[str, Any], stats: str) -> None:
        super().__init__(
            path=action["path"],
            size=int(action["size"]),
            partition_values=dict(action.get("partitionValues") or {}),
            modification_time=int(action.get("modificationTime") or 0),
            stats=stats,
        )
        object.__setattr__(self, "action", action)

    def to_log_action(self) -> dict[str, Any]:
        return dict(self.action)


@dataclasses.dataclass(frozen=True)
class Marked:
    """The commit's part for rows marked deleted: removes, re-adds, the DV file written."""

    removes: list[_commit.RemovedFile]
    adds: list[ReAddedFile]
    dv_files: list[str]
    removed_whole: int  # files every live row of which was deleted
    dvs_added: int  # files that had no deletion vector and got one
    dvs_updated: int  # files whose deletion vector was replaced
    dvs_removed: int  # deletion vectors dropped with their wholly deleted files

    def delete_files(self) -> None:
        for path in self.dv_files:
            fs, inner = _uri.filesystem(path)
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(inner)

    def operation_metrics(self) -> dict[str, str]:
        """delta-spark's deletion vector metrics."""
        return {
            "numDeletionVectorsAdded": str(self.dvs_added),
            "numDeletionVectorsRemoved": str(self.dvs_removed),
            "numDeletionVectorsUpdated": str(self.dvs_updated),
        }


def mark(
    snapshot: Snapshot,
    files: list[FileEntry],
    matches: Mapping[int, FileMatches],
    deleted: Mapping[str, np.ndarray],
) -> Marked:
    """Write the new deletion vectors of ``files[i]`` for every ``i`` in ``matches`` with
    rows (``deleted``: the snapshot's current deleted rows per file)."""
    touched = sorted(i for i, m in matches.items() if m.matched)
    physical = _schema.top_level_physical_names(snapshot.schema)
    paths = [files[i].path for i in touched]
    logged = _log_commit.add_actions_of(snapshot.uri, snapshot.version, paths) if paths else {}
    removes: list[_commit.RemovedFile] = []
    partial: list[tuple[dict[str, Any], np.ndarray]] = []
    whole = dvs_removed = dvs_added = dvs_updated = 0
    for i in touched:
        entry, found = files[i], matches[i]
        add = logged.get(entry.path)
        if add is None:
            raise CorruptTableError(
                f"The log of table {snapshot.uri} at version {snapshot.version} has no add"
                f" action for {entry.path}, which the snapshot lists. Nothing was committed;"
                " report this with the table's _delta_log.",
                table_uri=snapshot.uri,
                path=entry.path,
            )
        old_dv = add.get("deletionVector")
        removes.append(
            _commit.RemovedFile(
                path=entry.path,
                size=entry.size,
                partition_values=_replace_where.serialized_partition_values(entry, physical),
                deletion_vector=old_dv,
                stats=add.get("stats"),
            )
        )
        if found.matched >= found.total:
            whole += 1
            dvs_removed += 1 if old_dv else 0
            continue
        previous = deleted.get(entry.path)
        rows = found.rows if previous is None else np.union1d(previous, found.rows)
        partial.append((add, rows))
        if old_dv:
            dvs_updated += 1
        else:
            dvs_added += 1
    descriptors = write_deletion_vectors(snapshot.uri, [rows for _, rows in partial])
    dv_files = sorted({d.absolute_path(snapshot.uri) for d in descriptors})
    adds = [
        ReAddedFile(_re_add(add, descriptor.to_json()), _loose_stats(add.get("stats")))
        for (add, _), descriptor in zip(partial, descriptors, strict=True)
    ]
    log.info(
        "deletion vectors for %s: %d files marked, %d removed whole",
        snapshot.uri,
        len(adds),
        whole,
    )
    return Marked(removes, adds, dv_files, whole, dvs_added, dvs_updated, dvs_removed)


def _re_add(add: Mapping[str, Any], descriptor: dict[str, Any]) -> dict[str, Any]:
    action = {k: v for k, v in add.items() if v is not None}
    action["dataChange"] = True
    action["deletionVector"] = descriptor
    action["stats"] = _loose_stats(add.get("stats"))
    return action


def _loose_stats(stats: str | None) -> str:
    """The file's stats with ``tightBounds`` false: min/max still bound the live rows,
    ``numRecords`` stays the physical file's (readers subtract the DV's cardinality)."""
    if not stats:
        return json.dumps({"tightBounds": False})
    parsed = json.loads(stats)
    parsed["tightBounds"] = False
    return json.dumps(parsed, separators=(",", ":"))


def live_rows(entry: FileEntry, deleted: Mapping[str, np.ndarray]) -> int | None:
    """Rows of ``entry`` that no deletion vector deletes (None: no numRecords in the log)."""
    if entry.num_records is None:
        return None
    return entry.num_records - len(deleted.get(entry.path, ()))
