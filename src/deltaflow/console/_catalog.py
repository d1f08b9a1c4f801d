"""The tables under the console's roots, found on disk and confined to the roots.

A table is addressed by an id: its path relative to its root, prefixed by the root's name
when the console has several roots. Ids are only ever looked up in the set found by
walking the roots (symlinks not followed), so a request cannot name a directory outside
them: ``..``, absolute paths and symlinks that leave a root are refused or not found.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from deltaflow.console._checkpoints import Checkpoint, is_checkpoint
from deltaflow.console._table_state import TableState
from deltaflow.console.errors import ConsoleRequestError

# How old the list of tables may be before a request walks the roots again. Walking is
# cheap for a few hundred tables; doing it on every 2-second poll of every browser is not.
_RESCAN_SECONDS = 2.0
# Directories a walk never descends into: they belong to tables or to Spark, not to users.
_SKIP = frozenset({"_delta_log", "_change_data", "__pycache__", ".git"})


@dataclass(frozen=True)
class Root:
    name: str
    path: str  # real path


class Catalog:
    """Finds the tables under the roots and keeps one :class:`TableState` per table."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = _named(roots)
        self._tables: dict[str, TableState] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self._scanned_at = 0.0
        self._lock = threading.Lock()

    def tables(self) -> list[TableState]:
        """Every table under the roots, by id (rescanned at most every couple of seconds)."""
        with self._lock:
            if time.monotonic() - self._scanned_at > _RESCAN_SECONDS:
                self._rescan()
            return [self._tables[k] for k in sorted(self._tables)]

    def checkpoints(self) -> list[Checkpoint]:
        """Streaming checkpoints under the roots (found by the same walk as the tables)."""
        with self._lock:
            if time.monotonic() - self._scanned_at > _RESCAN_SECONDS:
                self._rescan()
            return [self._checkpoints[k] for k in sorted(self._checkpoints)]

    def table(self, table_id: str | None) -> TableState:
        """The table with this id, or a 400 / 404 :class:`ConsoleRequestError`."""
        if not table_id:
            raise ConsoleRequestError("give the table: ?id=<table id>", status=400, code="bad_id")
        parts = table_id.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\\" in table_id or "\0" in table_id:
            raise ConsoleRequestError(
                f"table id {table_id!r} is not a path under the roots: use an id from"
                " /api/tables (no '..', no leading '/').",
                status=400,
                code="bad_id",
            )
        with self._lock:
            state = self._tables.get(table_id)
            if state is None and self._created_since_scan(parts):
                self._rescan()
                state = self._tables.get(table_id)
        if state is None or not _inside(state.path, self._root_of(state.root).path):
            raise ConsoleRequestError(
                f"no Delta table {table_id!r} under the console's roots: see /api/tables.",
                status=404,
                code="table_not_found",
            )
        return state

    def _created_since_scan(self, parts: list[str]) -> bool:
        """Whether the id names a table directory (no symlink on the way) that the last
        walk did not see: only then is walking again worth it."""
        candidates = [(self.roots[0], parts)] if len(self.roots) == 1 else []
        candidates += [(r, parts[1:]) for r in self.roots if len(parts) > 1 and r.name == parts[0]]
        for root, rel in candidates:
            path = root.path
            for part in rel:
                path = os.path.join(path, part)
                if os.path.islink(path):
                    break
            else:
                if os.path.isdir(os.path.join(path, "_delta_log")):
                    return True
        return False

    def _root_of(self, name: str) -> Root:
        return next(r for r in self.roots if r.name == name)

    def _rescan(self) -> None:
        found: dict[str, tuple[str, str]] = {}
        checkpoints: dict[str, Checkpoint] = {}
        several = len(self.roots) > 1
        for root in self.roots:
            tables, streams = _walk(root.path)
            for path in tables:
                found[_id_of(root, path, several)] = (path, root.name)
            for path in streams:
                cid = _id_of(root, path, several)
                known = self._checkpoints.get(cid)
                checkpoints[cid] = known if known is not None else Checkpoint(path, cid)
        self._checkpoints = checkpoints
        kept = {}
        for table_id, (path, root_name) in found.items():
            state = self._tables.get(table_id)
            if state is None or state.path != path:
                state = TableState(table_id, path, root_name)
            kept[table_id] = state
        self._tables = kept
        self._scanned_at = time.monotonic()


def _named(paths: tuple[str, ...]) -> tuple[Root, ...]:
    roots: list[Root] = []
    used: set[str] = set()
    for path in paths:
        base = os.path.basename(path.rstrip("/")) or "root"
        name, n = base, 2
        while name in used:
            name, n = f"{base}-{n}", n + 1
        used.add(name)
        roots.append(Root(name, os.path.realpath(path)))
    return tuple(roots)


def _id_of(root: Root, path: str, several: bool) -> str:
    rel = os.path.relpath(path, root.path).replace(os.sep, "/")
    rel = "" if rel == "." else rel
    return "/".join(p for p in (root.name if several else "", rel) if p) or root.name


def _walk(root: str) -> tuple[list[str], list[str]]:
    """Table directories (with a ``_delta_log``) and streaming checkpoints under ``root``.

    A table's insides are not walked, except a ``_checkpoint*`` folder in it (where
    streams often keep their checkpoints); symlinks are not followed (they could lead
    out of the root).
    """
    tables, checkpoints = [], []
    for current, dirs, files in os.walk(root, followlinks=False):
        if is_checkpoint(current, dirs, files):
            checkpoints.append(current)
            dirs.clear()
            continue
        if "_delta_log" in dirs and os.path.isdir(os.path.join(current, "_delta_log")):
            if _inside(os.path.join(current, "_delta_log"), root):
                tables.append(current)
            dirs[:] = sorted(d for d in dirs if d.startswith("_checkpoint"))
            continue
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.startswith("."))
    return tables, checkpoints


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)
