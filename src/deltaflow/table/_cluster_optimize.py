"""OPTIMIZE of a clustered table: rewrite the files not yet clustered, in curve order.

delta-rs 1.6 refuses to commit to clustered tables, so this is deltaflow's own rewrite:

* **Which files.** A file counts as clustered when its ``add`` has
  ``clusteringProvider: "liquid"`` and its ``ZCUBE_ZORDER_BY`` tag names the table's
  current clustering columns (delta-spark's ZCube tags). Every other live file is
  rewritten; ``OPTIMIZE ... FULL`` rewrites all of them. Nothing to rewrite is a no-op
  (no commit), so a second OPTIMIZE with nothing new does nothing.
* **Order.** One clustering column: sorted by it. Two to four: by a Hilbert curve over
  the columns' dense ranks (``64 // n`` bits each), as delta-spark's liquid clustering
  orders them, so files get narrow min/max ranges in every clustering column.
* **Files.** The sorted rows are cut into files of ``delta.targetFileSize`` bytes
  (100 MiB when unset, delta-rs's OPTIMIZE default), estimated from the input's bytes
  per row; each file gets stats and the ``clusteringProvider`` / ZCube tags.
* **Commit.** One ``dataChange=false`` commit on the log writer (streams skip it), read
  set = the rewritten files: a concurrent DELETE / UPDATE of one of them conflicts, a
  concurrent append does not. A failed commit deletes the files written.

The rewrite reads the candidate files on the driver (pyarrow), so one OPTIMIZE holds the
unclustered part of the table in memory: fine for incremental runs after each batch of
writes; ``FULL`` on a large table needs that much memory.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltaflow.table import _clustering, _log_commit, _log_write, _partitions, _stats, _uri
from deltaflow.table._snapshot import FileEntry, Snapshot

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 100 * 1024 * 1024
ZCUBE_ID = "ZCUBE_ID"
ZCUBE_CURVE = "ZCUBE_ZORDER_CURVE"
ZCUBE_BY = "ZCUBE_ZORDER_BY"
_ROW_GROUP_ROWS = 1 << 20


@dataclass(frozen=True)
class ClusterResult:
    version: int | None  # None: nothing to rewrite, no commit
    files_added: list[int]  # sizes
    files_removed: list[int]
    considered: int
    curve: str


def cluster(
    snapshot: Snapshot,
    *,
    full: bool = False,
    commit_info: Mapping[str, Any] | None = None,
    small: tuple[int, int] | None = None,
) -> ClusterResult:
    """Cluster the files of ``snapshot`` not clustered yet by its clustering columns
    (all files with ``full``); one commit, or none when there is nothing to do.
    ``commit_info``: more commitInfo keys (``deltaflow maintain`` marks its runs); its
    ``operationParameters`` are merged into OPTIMIZE's. ``small`` (a table without
    clustering columns: auto compaction): ``(file size, bytes)``, only files under that
    size, the smallest first, at most that many bytes (at least two files), so that one
    run reads a bounded amount into memory."""
    plan = _plan(snapshot, full)
    physical, by_tag, adds, candidates = plan.physical, plan.by_tag, plan.adds, plan.candidates
    if small is not None and not physical:
        candidates = _smallest(candidates, *small)
    entries = plan.entries
    curve = "hilbert" if len(physical) > 1 else "linear"
    if not candidates:
        return ClusterResult(None, [], [], len(entries), curve)
    table = _read(snapshot, candidates)
    if physical and table.num_rows:
        table = table.take(_order(table, physical))
    cube = str(uuid.uuid4())
    tags = {ZCUBE_ID: cube, ZCUBE_CURVE: curve, ZCUBE_BY: by_tag} if physical else {}
    written = _write(snapshot, table, sum(e.size for e in candidates), tags)
    extra = dict(commit_info or {})
    parameters = {
        "predicate": "[]",
        "clusterBy": by_tag,
        "zOrderBy": "[]",
        "auto": False,
        "isFull": full,
        **dict(extra.pop("operationParameters", None) or {}),
    }
    version = _commit_rewrite(snapshot, adds, candidates, written, parameters, extra)
    log.info(
        "clustered %d files of %s into %d (version %d)",
        len(candidates),
        snapshot.uri,
        len(written),
        version,
    )
    return ClusterResult(
        version, [a["size"] for a in written], [e.size for e in candidates], len(entries), curve
    )


@dataclass(frozen=True)
class CompactResult:
    version: int | None  # None: nothing to compact, no commit
    files_added: list[int]  # sizes
    files_removed: list[int]
    partitions: int  # partitions compacted
    considered: int  # live files looked at


def compact(snapshot: Snapshot, parameters: Mapping[str, Any]) -> CompactResult:
    """OPTIMIZE's bin-packing on deltaflow's own reader, writer and log writer: in each
    partition, the files under half the target size (two at least) rewritten as files of
    about the target size, one ``dataChange=false`` commit for every partition. For a
    table delta-rs cannot compact: one whose log names files outside its root (a shallow
    clone's; they are removed from the table, never deleted, and the new files go under
    the table's own root). Reads a partition's small files into memory at a time."""
    entries = snapshot.files(stats=False)
    target = target_file_size(snapshot.configuration)
    adds = _log_commit.add_actions_of(snapshot.uri, snapshot.version, [e.path for e in entries])
    groups: dict[tuple[tuple[str, str | None], ...], list[FileEntry]] = {}
    for entry in entries:
        if entry.size < target // 2:
            raw = (adds.get(entry.path) or {}).get("partitionValues") or {}
            key = tuple(sorted((str(k), v) for k, v in raw.items()))
            groups.setdefault(key, []).append(entry)
    chosen = {key: files for key, files in groups.items() if len(files) >= 2}
    if not chosen:
        return CompactResult(None, [], [], 0, len(entries))
    written: list[dict[str, Any]] = []
    removed: list[FileEntry] = []
    try:
        for key, files in chosen.items():
            table = _read(snapshot, files)
            written += _write(snapshot, table, sum(e.size for e in files), {}, dict(key))
            removed += files
    except BaseException:
        _delete(snapshot.uri, [a["path"] for a in written])
        raise
    version = _commit_rewrite(snapshot, adds, removed, written, parameters, {})
    log.info(
        "compacted %d files of %s into %d (version %d)",
        len(removed),
        snapshot.uri,
        len(written),
        version,
    )
    return CompactResult(
        version, [a["size"] for a in written], [e.size for e in removed], len(chosen), len(entries)
    )


def _commit_rewrite(
    snapshot: Snapshot,
    adds: Mapping[str, dict[str, Any]],
    removed: list[FileEntry],
    written: list[dict[str, Any]],
    parameters: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> int:
    """OPTIMIZE's one ``dataChange=false`` commit: ``written`` in, ``removed`` out (its
    read set: a concurrent DELETE / UPDATE of one of them conflicts, an append does not).
    A failed commit deletes the files written."""
    removes = [
        _log_write.remove_action(adds.get(e.path, {}), e.path, e.size, data_change=False)
        for e in removed
    ]
    try:
        return _log_commit.commit(
            _log_commit.LogCommitRequest(
                table_uri=snapshot.uri,
                read_version=snapshot.version,
                operation="OPTIMIZE",
                operation_parameters=dict(parameters),
                operation_metrics={
                    "numAddedFiles": str(len(written)),
                    "numRemovedFiles": str(len(removes)),
                    "numAddedBytes": str(sum(a["size"] for a in written)),
                    "numRemovedBytes": str(sum(e.size for e in removed)),
                },
                adds=written,
                removes=removes,
                read=_log_commit.ReadSet(files=frozenset(e.path for e in removed)),
                partitioned=bool(snapshot.partition_columns),
                checkpoint_interval=_log_commit.checkpoint_interval(snapshot.configuration),
                extra_commit_info=dict(extra),
            )
        )
    except BaseException:
        _delete(snapshot.uri, [a["path"] for a in written])
        raise


def pending_files(snapshot: Snapshot) -> list[FileEntry]:
    """The live files an incremental OPTIMIZE would rewrite (not clustered yet by the
    current clustering columns; without clustering columns, the small ones)."""
    return _plan(snapshot, False).candidates


@dataclass(frozen=True)
class _Plan:
    physical: list[tuple[str, ...]]
    by_tag: str
    entries: list[FileEntry]
    adds: dict[str, dict[str, Any]]
    candidates: list[FileEntry]


def _plan(snapshot: Snapshot, full: bool) -> _Plan:
    physical = _clustering.physical_columns(snapshot.uri, snapshot.version)
    by_tag = json.dumps([".".join(p) for p in physical])
    entries = snapshot.files(stats=False)
    adds = _log_commit.add_actions_of(snapshot.uri, snapshot.version, [e.path for e in entries])
    candidates = [
        e
        for e in entries
        if full or not _is_clustered(adds.get(e.path, {}), by_tag) or not physical
    ]
    if not physical:
        # CLUSTER BY NONE: OPTIMIZE only compacts (small files, nothing to order by).
        target = target_file_size(snapshot.configuration)
        candidates = [e for e in candidates if e.size < target // 2]
        if len(candidates) < 2:
            candidates = []
    return _Plan([tuple(p) for p in physical], by_tag, entries, adds, candidates)


def _smallest(files: list[FileEntry], under: int, budget: int) -> list[FileEntry]:
    chosen: list[FileEntry] = []
    total = 0
    for entry in sorted((e for e in files if e.size < under), key=lambda e: e.size):
        if chosen and total + entry.size > budget:
            break
        chosen.append(entry)
        total += entry.size
    return chosen if len(chosen) >= 2 else []


def target_file_size(configuration: Any) -> int:
    raw = str(configuration.get("delta.targetFileSize") or "").strip().lower()
    match = re.fullmatch(r"(\d+)\s*([kmgt]?i?b?)?", raw)
    if not match:
        return DEFAULT_TARGET_FILE_SIZE
    units = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    unit = (match.group(2) or "").replace("i", "").rstrip("b") or ""
    return max(int(match.group(1)) * units.get(unit, 1), 1)


def _is_clustered(add: dict[str, Any], by_tag: str) -> bool:
    tags = add.get("tags") or {}
    return add.get("clusteringProvider") == _clustering.PROVIDER and tags.get(ZCUBE_BY) == by_tag


def _read(snapshot: Snapshot, files: list[Any]) -> pa.Table:
    fs, root = _uri.filesystem(snapshot.uri)
    deleted = snapshot.deleted_rows() if snapshot.has_deletion_vectors_enabled else {}
    tables = []
    for entry in files:
        relative = unquote(entry.path)
        if _uri.is_absolute(entry.path):  # a file outside the table (a shallow clone's)
            file_fs, where = _uri.filesystem(_uri.normalize_uri(relative))
        else:
            file_fs, where = fs, f"{root.rstrip('/')}/{relative}"
        with file_fs.open_input_file(where) as handle:
            table = pq.read_table(handle, coerce_int96_timestamp_unit="us")
        gone = deleted.get(relative, deleted.get(entry.path))
        if gone is not None and len(gone):
            keep = np.ones(table.num_rows, dtype=bool)
            keep[gone] = False
            table = table.filter(pa.array(keep))
        tables.append(_timestamps_as_table(table, snapshot.schema))
    return pa.concat_tables(tables, promote_options="default")


def _timestamps_as_table(table: pa.Table, schema: dict[str, Any]) -> pa.Table:
    """Top-level timestamps as the table declares them (INT96 files read back as naive
    nanoseconds; a Delta ``timestamp`` is UTC-adjusted microseconds)."""
    physical = {
        f.get("metadata", {}).get("delta.columnMapping.physicalName", f["name"]): f["type"]
        for f in schema.get("fields", [])
    }
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_timestamp(column.type):
            tz = column.type.tz
            if tz is None and physical.get(name) == "timestamp":
                tz = "UTC"
            column = column.cast(pa.timestamp("us", tz=tz), safe=False)
        columns.append(column)
    return pa.Table.from_arrays(
        columns,
        schema=pa.schema([table.schema.field(i).with_type(c.type) for i, c in enumerate(columns)]),
    )


def _order(table: pa.Table, physical: list[tuple[str, ...]]) -> np.ndarray:
    """Row order: by the one column, or along a Hilbert curve over the columns' ranks."""
    arrays = [_column(table, path) for path in physical]
    if len(arrays) == 1:
        return np.asarray(pc.sort_indices(arrays[0], null_placement="at_start"))
    bits = 64 // len(arrays)
    coords = np.empty((table.num_rows, len(arrays)), dtype=np.uint64)
    for i, array in enumerate(arrays):
        ranks = np.asarray(pc.rank(array, sort_keys="ascending", tiebreaker="dense")).astype(
            np.uint64
        )
        top = int(ranks.max()) if len(ranks) else 1
        # Spread the ranks over the column's bits so every column weighs the same.
        scale = ((1 << bits) - 1) / max(top, 1)
        coords[:, i] = np.minimum(ranks.astype(np.float64) * scale, (1 << bits) - 1).astype(
            np.uint64
        )
    return np.argsort(hilbert_index(coords, bits), kind="stable")


def _column(table: pa.Table, path: tuple[str, ...]) -> pa.Array:
    column: Any = table.column(path[0])
    for part in path[1:]:
        column = pc.struct_field(column, part)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def hilbert_index(coords: np.ndarray, bits: int) -> np.ndarray:
    """Hilbert curve index of each row of ``coords`` (n dims, ``bits`` bits each; n*bits
    <= 64), by Skilling's transpose ("Programming the Hilbert curve", 2004)."""
    x = coords.astype(np.uint64, copy=True)
    n = x.shape[1]
    one = np.uint64(1)
    q = one << np.uint64(bits - 1)
    while q > one:  # inverse undo of the excess work
        p = q - one
        for i in range(n):
            high = (x[:, i] & q) != 0
            x[high, 0] ^= p
            low = ~high
            t = (x[low, 0] ^ x[low, i]) & p
            x[low, 0] ^= t
            x[low, i] ^= t
        q >>= one
    for i in range(1, n):  # Gray encode
        x[:, i] ^= x[:, i - 1]
    t = np.zeros(x.shape[0], dtype=np.uint64)
    q = one << np.uint64(bits - 1)
    while q > one:
        t[(x[:, n - 1] & q) != 0] ^= q - one
        q >>= one
    for i in range(n):
        x[:, i] ^= t
    key = np.zeros(x.shape[0], dtype=np.uint64)
    for b in range(bits - 1, -1, -1):  # interleave: the transpose's bits, high first
        for i in range(n):
            key = (key << one) | ((x[:, i] >> np.uint64(b)) & one)
    return key


def _write(
    snapshot: Snapshot,
    table: pa.Table,
    input_bytes: int,
    tags: dict[str, str],
    partition: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """``table`` as files of about the target size; ``partition``: the raw partition
    values of every row (the files go in its directory, as Spark names it)."""
    folder = (
        _partitions.partition_dir(list(snapshot.partition_columns), dict(partition)) + "/"
        if partition
        else ""
    )
    target = target_file_size(snapshot.configuration)
    bytes_per_row = input_bytes / max(table.num_rows, 1)
    rows_per_file = max(int(target / max(bytes_per_row, 1e-9)), 1)
    num_indexed = _stats.num_indexed_cols(snapshot.configuration)
    fs, root = _uri.filesystem(snapshot.uri)
    out: list[dict[str, Any]] = []
    try:
        for start in range(0, max(table.num_rows, 1), rows_per_file):
            chunk = table.slice(start, rows_per_file)
            if chunk.num_rows == 0:
                break
            name = f"{folder}part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            if folder and _uri.is_local(snapshot.uri):  # object stores have no directories
                fs.create_dir(f"{root.rstrip('/')}/{folder}", recursive=True)
            with fs.open_output_stream(f"{root.rstrip('/')}/{name}") as sink:
                pq.write_table(
                    chunk,
                    sink,
                    compression="snappy",
                    row_group_size=_ROW_GROUP_ROWS,
                    coerce_timestamps="us",
                    allow_truncated_timestamps=True,
                )
            size = fs.get_file_info(f"{root.rstrip('/')}/{name}").size
            add: dict[str, Any] = {
                "path": _log_commit.encode_path(name),
                "partitionValues": dict(partition or {}),
                "size": size,
                "modificationTime": int(time.time() * 1000),
                "dataChange": False,
                "stats": _stats.file_stats(chunk, num_indexed),
            }
            if tags:
                add["tags"] = dict(tags)
                add["clusteringProvider"] = _clustering.PROVIDER
            out.append(add)
    except BaseException:
        _delete(snapshot.uri, [a["path"] for a in out])
        raise
    return out


def _delete(uri: str, paths: list[str]) -> None:
    fs, root = _uri.filesystem(uri)
    for path in paths:
        try:
            fs.delete_file(f"{root.rstrip('/')}/{unquote(path)}")
        except OSError:
            log.warning("could not delete %s of a failed OPTIMIZE", path)
