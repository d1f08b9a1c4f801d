"""One table as the console sees it: its commits, and facts of its latest snapshot.

Everything is cached against the latest log version, so a page that polls an unchanged
table costs one ``stat``. The snapshot facts (files, sizes, rows) come from delta-rs,
kept loaded and moved forward with ``update_incremental`` when the log grows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson
import pyarrow as pa
from deltalake import DeltaTable

from deltaflow.console._commits import Commit, CommitLog
from deltaflow.table._arrow import read_stream
from deltaflow.table._log_upkeep import MANY_LOG_FILES
from deltaflow.table._snapshot import catch_up, open_latest

# A file counts as small below a quarter of delta.targetFileSize, and never above 32 MB
# (the threshold when the table sets no target): such files are what compaction rewrites.
SMALL_FILE_SHARE = 0.25
_DEFAULT_SMALL_BYTES = 32 * 1024 * 1024
# File-size histogram buckets: powers of two from 1 KB to 1 GB.
_BUCKET_EDGES = [1024 * 2**i for i in range(0, 21)]
# Actions that leave the table's metadata alone: a commit of only these moves the cached
# facts forward; any other (metaData, protocol, domainMetadata, ...) reloads them.
_FILE_ONLY = frozenset({"add", "remove", "commitInfo", "txn", "cdc"})
# The files in ``_delta_log`` are counted again at most this often: a table a real-time
# stream writes gains ~20 versions a second, and a count of a large log costs ~0.1 s.
LOG_COUNT_SECONDS = 60.0


@dataclass(frozen=True)
class SnapshotFacts:
    version: int
    table_uuid: str  # metaData.id: what a stream's source offsets call the table
    schema: dict[str, Any]
    partition_columns: list[str]
    clustering_columns: list[str]
    properties: dict[str, str | None]
    protocol: dict[str, Any]
    name: str | None
    description: str | None
    num_files: int
    size_bytes: int
    num_rows: int | None
    small_files: int
    small_file_bytes: int
    histogram: list[dict[str, int]]


class TableState:
    """A table under a root: its :class:`CommitLog` and cached snapshot facts."""

    def __init__(self, table_id: str, path: str, root: str) -> None:
        self.id = table_id
        self.path = path
        self.root = root
        self.log = CommitLog(path)
        self._table: DeltaTable | None = None
        self._facts: SnapshotFacts | None = None
        self._files: dict[str, tuple[int, int | None]] = {}  # live file -> (size, rows)
        self._lock = threading.Lock()
        self._log_files: tuple[float, int | None] | None = None  # (counted at, count)

    def log_files(self) -> int | None:
        """How many files ``_delta_log`` holds (None: unreadable), counted at most once a
        minute. Every reader that loads the table lists them all on a local disk."""
        now = time.monotonic()
        cached = self._log_files
        if cached is not None and now - cached[0] < LOG_COUNT_SECONDS:
            return cached[1]
        try:
            with os.scandir(os.path.join(self.path, "_delta_log")) as entries:
                count: int | None = sum(1 for _ in entries)
        except OSError:
            count = None
        self._log_files = (now, count)
        return count

    def facts(self) -> SnapshotFacts:
        """The latest snapshot's facts, moved forward commit by commit when versions were
        added (a table a stream appends to costs its new commits, not its file count)."""
        latest = self.log.latest_version()
        with self._lock:
            facts = self._facts
            if facts is not None and facts.version == latest:
                return facts
            if facts is not None and facts.version < latest and self._apply(latest):
                facts = _with_files(facts, latest, self._files)
            else:
                facts = self._load()
            self._facts = facts
            return facts

    def _load(self) -> SnapshotFacts:
        """Everything from a delta-rs snapshot (first use, and after metadata changes)."""
        if self._table is None:
            self._table = open_latest(self.path)
        else:
            try:
                catch_up(self._table, self.path)
            except Exception:  # the table was replaced under us: load it afresh
                self._table = open_latest(self.path)
        facts, self._files = _facts_of(self._table)
        return facts

    def _apply(self, latest: int) -> bool:
        """Apply the adds and removes of the commits after the cached facts to the live
        file list; False when one of them changes more than files (metadata, protocol,
        domains) or cannot be read, so that a full load must follow."""
        assert self._facts is not None
        for version in range(self._facts.version + 1, latest + 1):
            try:
                with open(self.log.file(version), "rb") as handle:
                    text = handle.read()
            except FileNotFoundError:
                return False
            for line in text.splitlines():
                if not line.strip():
                    continue
                action = orjson.loads(line)
                if "add" in action:
                    add = action["add"]
                    self._files[unquote(add["path"])] = (int(add.get("size") or 0), _rows(add))
                elif "remove" in action:
                    self._files.pop(unquote(action["remove"]["path"]), None)
                elif not action.keys() <= _FILE_ONLY:
                    return False
        return True

    def summary(self) -> dict[str, Any]:
        """The table list's row: size, files, small-file health, last write."""
        facts = self.facts()
        last = self.log.page(None, 1)
        log_files = self.log_files()
        warnings = _warnings(facts, log_files)
        return {
            "id": self.id,
            "root": self.root,
            "name": facts.name,
            "version": facts.version,
            "num_files": facts.num_files,
            "size_bytes": facts.size_bytes,
            "num_rows": facts.num_rows,
            "small_files": facts.small_files,
            "small_file_bytes": facts.small_file_bytes,
            "log_files": log_files,
            "health": warnings[0] if warnings else "ok",
            "warnings": warnings,
            "last_commit": _brief(last[0]) if last else None,
            "streams": sorted({a for c in self.log.page(None, 50) for a, _ in c.transactions}),
        }

    def detail(self) -> dict[str, Any]:
        facts = self.facts()
        return {
            **self.summary(),
            "description": facts.description,
            "schema": facts.schema,
            "partition_columns": facts.partition_columns,
            "clustering_columns": facts.clustering_columns,
            "properties": facts.properties,
            "protocol": facts.protocol,
            "change_data_feed": str(facts.properties.get("delta.enableChangeDataFeed", ""))
            .strip()
            .lower()
            == "true",
        }


def _brief(commit: Commit) -> dict[str, Any]:
    return {"version": commit.version, "timestamp": commit.timestamp, "operation": commit.operation}


def _warnings(facts: SnapshotFacts, log_files: int | None) -> list[str]:
    """What needs care: ``small-files`` when most files (and more than a handful) are
    small; ``long-log`` when ``_delta_log`` holds so many files that every load of the
    table lists them for a long time (a real-time writer's 30 days of log)."""
    found = []
    if facts.small_files > 8 and facts.small_files * 2 > facts.num_files:
        found.append("small-files")
    if log_files is not None and log_files >= MANY_LOG_FILES:
        found.append("long-log")
    return found


def small_file_bytes(properties: dict[str, str | None]) -> int:
    raw = str(properties.get("delta.targetFileSize") or "").strip().lower()
    target = _parse_bytes(raw)
    if target is None:
        return _DEFAULT_SMALL_BYTES
    return min(_DEFAULT_SMALL_BYTES, int(target * SMALL_FILE_SHARE))


def _parse_bytes(raw: str) -> int | None:
    units = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2}
    units |= {"g": 1024**3, "gb": 1024**3}
    number = raw.rstrip("kmgbKMGB ")
    suffix = raw[len(number) :].strip()
    if not number.isdigit() or suffix not in ("", *units):
        return None
    return int(number) * units.get(suffix or "b", 1)


def _rows(add: dict[str, Any]) -> int | None:
    """An added file's live rows: ``numRecords`` less the rows its deletion vector drops."""
    stats = add.get("stats")
    try:
        rows = orjson.loads(stats).get("numRecords") if stats else None
    except orjson.JSONDecodeError:
        rows = None
    if not isinstance(rows, int):
        return None
    return rows - int((add.get("deletionVector") or {}).get("cardinality") or 0)


def _with_files(
    facts: SnapshotFacts, version: int, files: dict[str, tuple[int, int | None]]
) -> SnapshotFacts:
    sizes = [size for size, _ in files.values()]
    records = [rows for _, rows in files.values()]
    small = sum(1 for s in sizes if s < facts.small_file_bytes)
    return dataclasses.replace(
        facts,
        version=version,
        num_files=len(sizes),
        size_bytes=sum(sizes),
        num_rows=None if any(r is None for r in records) else sum(r or 0 for r in records),
        small_files=small,
        histogram=_histogram(sizes),
    )


def _facts_of(table: DeltaTable) -> tuple[SnapshotFacts, dict[str, tuple[int, int | None]]]:
    metadata = table.metadata()
    protocol = table.protocol()
    schema = json.loads(table.schema().to_json())
    properties: dict[str, str | None] = dict(metadata.configuration)
    actions = read_stream(table.get_add_actions(flatten=False))
    files = {
        unquote(path): (int(size), None if rows is None else int(rows))
        for path, size, rows in zip(
            _column(actions, "path"),
            _column(actions, "size_bytes"),
            _column(actions, "num_records"),
            strict=True,
        )
    }
    if "deletionVectors" in (protocol.reader_features or []):
        _drop_deleted_rows(table, files)
    writer_features = list(protocol.writer_features or [])
    facts = SnapshotFacts(
        version=table.version(),
        table_uuid=str(metadata.id),
        schema=schema,
        partition_columns=list(metadata.partition_columns),
        clustering_columns=_clustering(table, schema, writer_features),
        properties=properties,
        protocol={
            "min_reader_version": protocol.min_reader_version,
            "min_writer_version": protocol.min_writer_version,
            "reader_features": list(protocol.reader_features or []),
            "writer_features": writer_features,
        },
        name=metadata.name,
        description=metadata.description,
        num_files=0,
        size_bytes=0,
        num_rows=None,
        small_files=0,
        small_file_bytes=small_file_bytes(properties),
        histogram=[],
    )
    return _with_files(facts, table.version(), files), files


def _drop_deleted_rows(table: DeltaTable, files: dict[str, tuple[int, int | None]]) -> None:
    """Take the rows deletion vectors remove off their files' counts (delta-rs's file
    list gives ``numRecords`` alone)."""
    vectors = read_stream(table.deletion_vectors())
    prefix = unquote(table.table_uri.rstrip("/") + "/")
    for file_uri, selection in zip(
        vectors.column("filepath").to_pylist(),
        vectors.column("selection_vector").to_pylist(),
        strict=True,
    ):
        path = unquote(file_uri).removeprefix(prefix)
        size, rows = files.get(path, (0, None))
        if rows is not None and path in files:
            files[path] = (size, rows - sum(1 for keep in selection if not keep))


def _column(actions: pa.Table, name: str) -> list[Any]:
    if name not in actions.column_names:
        return []
    return list(actions.column(name).to_pylist())


def _histogram(sizes: list[int]) -> list[dict[str, int]]:
    """File counts per power-of-two size bucket, from the smallest to the largest used."""
    import bisect

    counts = [0] * (len(_BUCKET_EDGES) + 1)
    for size in sizes:
        counts[bisect.bisect_right(_BUCKET_EDGES, size)] += 1
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return []
    out = []
    for i in range(used[0], used[-1] + 1):
        low = 0 if i == 0 else _BUCKET_EDGES[i - 1]
        high = _BUCKET_EDGES[i] if i < len(_BUCKET_EDGES) else -1
        out.append({"min_bytes": low, "max_bytes": high, "files": counts[i]})
    return out


def _clustering(table: DeltaTable, schema: dict[str, Any], writer_features: list[str]) -> list[str]:
    from deltaflow.table import _clustering

    if not _clustering.is_clustered(writer_features):
        return []
    uri = table.table_uri
    domain = _clustering.read_domains(uri, table.version()).get(_clustering.DOMAIN)
    if not domain:
        return []
    config = json.loads(domain.get("configuration") or "{}")
    return _clustering.logical_names(schema, config.get("clusteringColumns") or [])
