"""The Delta log's commit files, read and parsed: one place for every reader of the log.

delta-rs replays the log into snapshots (:mod:`deltaflow.table._snapshot`). What it does
not hand over, commit by commit, is parsed here: the stream source's data changes, the
change data feed's actions (:mod:`deltaflow.table._cdf`), and the log facts both need
(the newest checkpoint, paths as the log writes them, typed partition values).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from deltaflow.table import _partitions, _schema, _uri
from deltaflow.table._object_store import object_store_error
from deltaflow.table._rowlog import TAG as ROW_LOG_TAG

Actions = list[tuple[int, dict[str, Any]]]  # (line number, action)


def read_commit_text(uri: str, version: int) -> str | None:
    """The text of commit ``version`` of the table at ``uri``; None if there is no file."""
    fs, root = _uri.filesystem(uri)
    try:
        with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as handle:
            text: str = handle.read().decode("utf-8")
            return text
    except FileNotFoundError:
        return None
    except OSError as exc:
        # An object store that fails (a stream's next offset, say, while the store is
        # down): a typed ObjectStoreError, retryable when the store did not answer.
        error = object_store_error(uri, exc, f"read commit {version} of")
        if error is None:
            raise
        raise error from exc


# Which file a commit is on local disk: inode, modification time (ns), size. A table made
# again at the same path writes its commits as new files (delta-rs and deltaflow create
# each with put-if-absent, never rewrite one in place): a changed mark means a new log.
CommitMark = tuple[int, int, int]


def commit_mark(log_dir: str, version: int) -> CommitMark | None:
    """Which file commit ``version`` in the local ``log_dir`` is (one stat); None when it
    is absent."""
    try:
        found = os.stat(os.path.join(log_dir, f"{version:020d}.json"))
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def parse_commit_text(text: str) -> Actions:
    """A commit file's actions with their line numbers."""
    return [(i, json.loads(line)) for i, line in enumerate(text.splitlines()) if line.strip()]


def read_commit(uri: str, version: int) -> Actions | None:
    """The actions of commit ``version`` with their line numbers; None if there is no file."""
    text = read_commit_text(uri, version)
    return None if text is None else parse_commit_text(text)


def last_checkpoint(uri: str) -> int | None:
    """The version of the newest checkpoint (``_delta_log/_last_checkpoint``), if any."""
    fs, root = _uri.filesystem(uri)
    try:
        with fs.open_input_stream(f"{root}/_delta_log/_last_checkpoint") as handle:
            return int(json.loads(handle.read())["version"])
    except (FileNotFoundError, KeyError, ValueError):
        return None
    except OSError as exc:
        error = object_store_error(uri, exc, "read the last checkpoint of")
        if error is None:
            raise
        raise error from exc


def newest_local_version(uri: str) -> int | None:
    """The newest commit of a table on a local disk, found by name (no listing): from the
    last checkpoint, doubling steps while commits exist, then halving between the last one
    found and the first one missing (commits after a checkpoint are contiguous). None for
    other stores, or when neither a checkpoint nor commit 0 is there.

    A listing of ``_delta_log`` is no snapshot: with many files (a real-time sink's log
    after hours) a walk takes long enough that commits landing meanwhile are seen or not
    in the directory's hash order, and delta-rs then refuses the gap ("Expected
    contiguous commit files"). Every commit up to the version found here existed before
    a load pinned to it began, so that load sees all of them."""
    if not _uri.is_local(uri):
        return None
    log_dir = os.path.join(_uri.local_path(uri), "_delta_log")

    def exists(version: int) -> bool:
        return os.path.exists(os.path.join(log_dir, f"{version:020d}.json"))

    try:
        found = last_checkpoint(uri)
    except OSError:
        found = None
    if found is None:
        if not exists(0):
            return None
        found = 0
    step, missing = 1, found + 1
    while exists(missing):
        found, step = missing, step * 2
        missing = found + step
    while missing - found > 1:
        middle = (found + missing) // 2
        if exists(middle):
            found = middle
        else:
            missing = middle
    return found


def relative_path(path: str) -> str:
    """A file path as the log writes it, made usable: log paths are URI-encoded and
    relative to the table root; absolute ones (shallow clones) keep their scheme."""
    return path if urlparse(path).scheme else unquote(path)


class PartitionParser:
    """Typed, logically named partition values from an action's ``partitionValues``."""

    def __init__(self, schema: dict[str, Any]) -> None:
        physical = _schema.top_level_physical_names(schema)
        self._logical = {p: logical for logical, p in physical.items()}
        self._types = {
            f["name"]: f["type"]
            for f in _schema.logical_schema(schema)["fields"]
            if isinstance(f["type"], str)
        }

    def parse(self, raw: dict[str, str | None] | None) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for physical, value in (raw or {}).items():
            name = self._logical.get(physical, physical)
            values[name] = _partitions.parse_partition_value(value, self._types.get(name, "string"))
        return values


@dataclass(frozen=True)
class AddedData:
    """An ``add`` action with ``dataChange=true``: a file a stream reads."""

    index: int  # line number in the commit file
    path: str  # relative_path() of the action's path
    size: int
    partition_values: dict[str, Any]  # logical column name -> typed value
    deletion_vector: dict[str, Any] | None
    # Its ``deltaflow.rowLog`` tag: the row log positions a real-time sink's file holds
    # (``_rowlog.tag``); a real-time reader that tails that log skips the file.
    row_log: str | None = None


@dataclass(frozen=True)
class DataChanges:
    """What one commit changes in a table's data and shape."""

    adds: tuple[AddedData, ...]
    removes_data: bool  # a remove with dataChange=true
    schema: dict[str, Any] | None  # the schema of a metaData action
    partition_columns: tuple[str, ...] | None  # ... and its partition columns


def data_changes(actions: Actions, partitions: PartitionParser) -> DataChanges:
    """The data changes of one commit's ``actions`` (adds and removes with
    ``dataChange=true``, and a new schema); compaction's rewrites are not changes."""
    adds: list[AddedData] = []
    removes_data = False
    schema: dict[str, Any] | None = None
    partition_columns: tuple[str, ...] | None = None
    for index, action in actions:
        if "add" in action:
            add = action["add"]
            if add.get("dataChange", True):
                adds.append(
                    AddedData(
                        index,
                        relative_path(add["path"]),
                        int(add["size"]),
                        partitions.parse(add.get("partitionValues")),
                        add.get("deletionVector"),
                        (add.get("tags") or {}).get(ROW_LOG_TAG),
                    )
                )
        elif "remove" in action:
            removes_data = removes_data or bool(action["remove"].get("dataChange", True))
        elif "metaData" in action:
            meta = action["metaData"]
            schema = json.loads(meta["schemaString"])
            partition_columns = tuple(meta.get("partitionColumns") or ())
    return DataChanges(tuple(adds), removes_data, schema, partition_columns)
