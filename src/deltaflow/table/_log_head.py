"""A table's log head, kept by a writer that commits often (the real-time sink).

A real-time sink commits every few tens of milliseconds. Keeping a delta-rs table up to
date for that lists ``_delta_log`` (``update_incremental()``), and on a local file system
a listing walks the whole directory: its cost grows with the log, without bound. What
the commit path needs of the log is small: the version, the ``metaData`` and
``protocol`` (to plan and to write), and the app transactions (exactly once). A
:class:`LogHead` holds exactly that.

- **Seeded** with one delta-rs load (:meth:`LogHead.seed`).
- **Moved forward** one version at a time, only from actions it knows: a commit this
  process won (its own payload) and other writers' commits, read by name
  (``<version>.json``, never a listing): before each use (:meth:`LogHead.catch_up`) and
  by the log writer's conflict scan after a lost put (``LogCommitRequest.on_version``).
- **Exact**, because versions are contiguous: the head moves from v to v + 1 only when
  it knows v + 1's actions, so its app transactions are those of the log at its version.
  A commit that lands after the head's version makes the next put at version + 1 lose,
  and the conflict scan reads it.
- **Re-seeded** when it cannot move forward by name cheaply: more than
  :data:`MAX_CATCH_UP` versions behind, or successors removed by log cleanup, or any
  doubt (a version out of order marks it ``stale``; the owner drops it).
- **Tied to its log**: it remembers which file its version's commit is (inode and
  mtime) and re-seeds when that file is gone or another: a table dropped and made again
  at the same path (a new log, perhaps shorter) must never be written at the old
  table's next version, which would leave a gap no reader can load past.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from deltalake import DeltaTable, Schema

from deltaflow.table import _log, _log_commit
from deltaflow.table._snapshot import (
    Snapshot,
    check_reader_features,
    open_latest,
    snapshot_of_table,
)

log = logging.getLogger(__name__)

# Versions read by name before a full load is cheaper: one open per version against one
# listing plus a replay from the last checkpoint (a head this far behind idled while
# other writers committed).
MAX_CATCH_UP = 1_000
# A head unchanged for this long also reads ``_last_checkpoint`` when its next version
# is absent: log cleanup removes only commits older than ``delta.logRetentionDuration``
# that a checkpoint covers, so only a head idle that long can have had its successors
# removed, and a checkpoint beyond it shows it. A busy head never pays the read.
IDLE_CHECK_SECONDS = 5.0


class LogHead:
    """The version, metadata, protocol and app transactions of a table's log at one
    version, moved forward from known actions (module docstring). Not thread safe by
    itself: use it under :attr:`lock` (:meth:`Heads.use` does)."""

    def __init__(self, uri: str, table: DeltaTable) -> None:
        self.uri = uri
        self.lock = threading.Lock()
        self.log_dir = _log_commit.log_location(uri)
        self._base = table  # loaded once, never moved: app ids not seen since ask it
        self._base_txns: dict[str, int | None] = {}
        self._txns: dict[str, int] = {}  # app ids in versions (base, version]
        self._snapshot = snapshot_of_table(table, uri)
        self._snapshot.__dict__.pop("delta_table", None)  # never a load through the head
        self.version = self._snapshot.version
        self._mark = _log.commit_mark(self.log_dir, self.version)
        self.stale = False  # set when the head may no longer be exact: the owner drops it
        self.moved_at = time.monotonic()
        # Bumped when metadata or protocol change: plans made before are out of date.
        self.generation = 0

    @classmethod
    def seed(cls, uri: str) -> LogHead:
        """The head of ``uri`` now, from one delta-rs load."""
        return cls(uri, open_latest(uri))

    def txn(self, app_id: str) -> int | None:
        """``app_id``'s app transaction version in the log at :attr:`version`."""
        if app_id in self._txns:
            return self._txns[app_id]
        if app_id not in self._base_txns:
            self._base_txns[app_id] = self._base.transaction_version(app_id)
        return self._base_txns[app_id]

    def snapshot(self) -> Snapshot:
        """The table at :attr:`version` as a :class:`Snapshot` with no delta-rs table
        behind it (its ``delta_table`` would load one: the commit path never asks)."""
        if self._snapshot.version != self.version:
            self._snapshot = dataclasses.replace(self._snapshot, version=self.version)
        return self._snapshot

    def apply(self, version: int, actions: Sequence[Mapping[str, Any]]) -> None:
        """Move to ``version`` (which must be :attr:`version` + 1) by its ``actions``.
        Never raises: a version out of order, or actions it cannot read, mark the head
        :attr:`stale` (it is called after a won put, where an error would make the
        caller delete files the log now references)."""
        if self.stale:
            return
        if version != self.version + 1:
            log.warning(
                "log head of %s at %d was offered version %d: re-seeding it",
                self.uri,
                self.version,
                version,
            )
            self.stale = True
            return
        try:
            self._apply(version, actions)
        except Exception:
            log.warning(
                "log head of %s could not read version %d", self.uri, version, exc_info=True
            )
            self.stale = True

    def _apply(self, version: int, actions: Sequence[Mapping[str, Any]]) -> None:
        snapshot = self._snapshot
        changed = False
        for action in actions:
            if "txn" in action:
                txn = action["txn"]
                self._txns[str(txn["appId"])] = int(txn["version"])
            elif "protocol" in action:
                p = action["protocol"]
                snapshot = dataclasses.replace(
                    snapshot,
                    min_reader_version=int(p["minReaderVersion"]),
                    min_writer_version=int(p["minWriterVersion"]),
                    reader_features=tuple(p.get("readerFeatures") or ()),
                    writer_features=tuple(p.get("writerFeatures") or ()),
                )
                changed = True
            elif "metaData" in action:
                m = action["metaData"]
                # delta-rs's JSON of the schema, as a loaded table's snapshot has it.
                schema = json.loads(Schema.from_json(m["schemaString"]).to_json())
                snapshot = dataclasses.replace(
                    snapshot,
                    schema=schema,
                    partition_columns=tuple(m.get("partitionColumns") or ()),
                    configuration=dict(m.get("configuration") or {}),
                    description=m.get("description") or None,
                )
                changed = True
        if changed:
            self.generation += 1
        self._snapshot = dataclasses.replace(snapshot, version=version)
        self.version = version
        self._mark = _log.commit_mark(self.log_dir, version)
        self.moved_at = time.monotonic()

    def _same_log(self) -> bool:
        """Whether the commit file of :attr:`version` is still the one the head moved to
        (one stat): False when the log was replaced under it."""
        return self._mark is None or _log.commit_mark(self.log_dir, self.version) == self._mark

    def catch_up(self) -> bool:
        """Read the versions after :attr:`version` by name and move past them; False
        when the head should be seeded again instead (too far behind, or its successors
        gone to log cleanup)."""
        if self.stale:
            return False
        if not self._same_log():
            log.warning(
                "log head of %s at %d: that commit's file was replaced (the table was made"
                " again at its path): re-seeding",
                self.uri,
                self.version,
            )
            return False
        for _ in range(MAX_CATCH_UP):
            actions = _log_commit.read_actions_if_present(self.log_dir, self.version + 1)
            if actions is None:
                return not self._successors_removed()
            self.apply(self.version + 1, actions)
            if self.stale:
                return False
        return False

    def _successors_removed(self) -> bool:
        if time.monotonic() - self.moved_at < IDLE_CHECK_SECONDS:
            return False
        last = _log.last_checkpoint(self.uri)
        self.moved_at = time.monotonic()
        return last is not None and last > self.version

    def check_readable(self) -> None:
        """A typed error when the table now uses a reader feature deltaflow cannot read."""
        check_reader_features(self._snapshot)


class Heads:
    """Log heads by ``(table, owner)`` (a real-time sink's query), the newest
    :data:`kept` of them."""

    def __init__(self, kept: int = 64) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        self._heads: OrderedDict[tuple[str, str], LogHead] = OrderedDict()

    @contextmanager
    def use(self, uri: str, owner: str) -> Iterator[LogHead]:
        """The head of ``uri`` (an existing local table) for ``owner``, caught up with
        the log and held (its lock) for the block: seeded from one delta-rs load when
        there is none or it cannot catch up by name. Dropped when the block raises
        anything but a :class:`~deltaflow.table.errors.ConcurrentWriteError` (a conflict
        leaves it exact: the scan moved it over the winners), or when it went stale."""
        from deltaflow.table.errors import ConcurrentWriteError

        key = (uri, owner)
        with self._lock:
            head = self._heads.get(key)
            if head is not None:
                self._heads.move_to_end(key)
        if head is None:
            head = self._put(key, LogHead.seed(uri))
        head.lock.acquire()
        try:
            if not head.catch_up():
                log.info("log head of %s at %d: re-seeded with a full load", uri, head.version)
                head.stale = True
                fresh = LogHead.seed(uri)
                fresh.lock.acquire()
                head.lock.release()
                head = self._put(key, fresh)
                head.catch_up()
            head.check_readable()
            yield head
        except ConcurrentWriteError:
            raise
        except BaseException:
            head.stale = True
            raise
        finally:
            if head.stale:
                self.forget(uri, owner, head)
            head.lock.release()

    def holds(self, uri: str, owner: str) -> bool:
        """Whether a head of ``uri`` for ``owner`` is kept (then the table exists)."""
        return self.get(uri, owner) is not None

    def get(self, uri: str, owner: str) -> LogHead | None:
        """The kept head of ``uri`` for ``owner``, as it is (not caught up, not held)."""
        with self._lock:
            return self._heads.get((uri, owner))

    def _put(self, key: tuple[str, str], head: LogHead) -> LogHead:
        with self._lock:
            self._heads[key] = head
            self._heads.move_to_end(key)
            while len(self._heads) > self._kept:
                self._heads.popitem(last=False)
        return head

    def forget(self, uri: str, owner: str | None = None, head: LogHead | None = None) -> None:
        """Drop the heads of ``uri`` (of ``owner`` only, when given; only if it is still
        ``head``, when given): the next use seeds again."""
        with self._lock:
            for key in [k for k in self._heads if k[0] == uri and owner in (None, k[1])]:
                if head is None or self._heads[key] is head:
                    del self._heads[key]
