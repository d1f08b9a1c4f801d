"""A stream's positions in a Delta log and the pieces of the log it reads.

:class:`Offset` is delta-spark's offset (``reservoirVersion``, ``index``,
``isStartingVersion``); :class:`LogFile` is one data file at its position;
:class:`CommitActions` is what one commit means to a stream; :class:`Budget` is a
trigger's admission limits. Pure data: the reader in ``_reader.py`` produces and walks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deltaflow.table._cdf import ChangeFile

SOURCE_VERSION = 1


@dataclass(frozen=True, order=True)
class Offset:
    version: int
    index: int
    is_starting: bool = False

    @property
    def is_unresolved(self) -> bool:
        """The offset of a fresh query before its first batch chose a start version."""
        return self.version < 0

    def to_json(self, reservoir_id: str) -> dict[str, Any]:
        return {
            "sourceVersion": SOURCE_VERSION,
            "reservoirId": reservoir_id,
            "reservoirVersion": self.version,
            "index": self.index,
            "isStartingVersion": self.is_starting,
        }


@dataclass(frozen=True)
class LogFile:
    """A data file the stream reads, at its position in the stream."""

    version: int
    index: int
    is_starting: bool
    path: str  # relative to the table root and percent-decoded, or an absolute URI
    size: int
    partition_values: dict[str, Any]  # logical column name -> typed value
    deletion_vector: dict[str, Any] | None = None  # the add action's descriptor
    deleted_rows: np.ndarray | None = None  # snapshot files: already resolved
    change: ChangeFile | None = None  # readChangeFeed: the change this file holds
    row_log: str | None = None  # a committed file's deltaflow.rowLog tag (_rowlog.tag)

    @property
    def offset(self) -> Offset:
        return Offset(self.version, self.index, self.is_starting)


@dataclass(frozen=True)
class VersionEnd:
    version: int


@dataclass(frozen=True)
class CommitActions:
    """What one commit file means to a stream."""

    version: int
    files: tuple[LogFile, ...]  # adds with dataChange=true
    removes_data: bool  # a remove with dataChange=true
    schema: dict[str, Any] | None  # the schema of a metaData action
    partition_columns: tuple[str, ...] | None
    changes: tuple[LogFile, ...] = ()  # readChangeFeed: cdc files, or adds and removes
    cdf_enabled: bool | None = None  # readChangeFeed: the feed's switch in a metaData action


class Budget:
    """maxFilesPerTrigger (hard) and maxBytesPerTrigger (soft: a file that crosses the
    limit is still admitted, so every batch makes progress)."""

    def __init__(self, max_files: int | None, max_bytes: int | None) -> None:
        self.files_left = max_files
        self.bytes_left = max_bytes

    def admit(self, size: int) -> bool:
        if self.files_left is not None and self.files_left <= 0:
            return False
        if self.bytes_left is not None and self.bytes_left <= 0:
            return False
        if self.files_left is not None:
            self.files_left -= 1
        if self.bytes_left is not None:
            self.bytes_left -= size
        return True

    def admit_all(self, sizes: Sequence[int]) -> bool:
        """Admit a whole commit's change files or none (readChangeFeed: a commit's
        changes are read together, as delta-spark does; a batch holds at least one)."""
        if self.files_left is not None and self.files_left <= 0:
            return False
        if self.bytes_left is not None and self.bytes_left <= 0:
            return False
        if self.files_left is not None:
            self.files_left -= len(sizes)
        if self.bytes_left is not None:
            self.bytes_left -= sum(sizes)
        return True
