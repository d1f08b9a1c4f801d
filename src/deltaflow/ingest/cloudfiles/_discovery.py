"""Finding new files in a landing zone, each exactly once.

**Which files count.** A file is read once it is visible under its final name. Writers
must write elsewhere (another directory, or a hidden / temporary name in the landing
zone) and rename into place: a rename is atomic on POSIX file systems, and object
stores only show an object once its upload completes. Ignored: any path component that
starts with ``.`` or ``_`` (``.part-1``, ``_SUCCESS``, ``_temporary/``), names ending in
``.tmp``, ``.crc``, ``.inprogress`` or ``.partial``, names not matching
``pathGlobFilter``, and the schema location.

**The seen-file store.** A SQLite database at
``<schemaLocation>/_cloudfiles/files.db`` (stdlib ``sqlite3``). One row per discovered
file: ``seq`` (the stream's position, 1, 2, ...), path, size, modification time and
arrival time. Offsets are ``seq`` values: a batch reads the rows in ``(start, end]``,
which never change once written, so a replayed batch reads the same files. Look-ups
go through an index, so the cost of a batch does not grow with the files seen before.
Chosen over sharded JSON files because SQLite gives atomic multi-row commits and
indexed look-ups for free; it needs a local (or mounted) schemaLocation.

**Incremental listing.** Every trigger lists the landing zone (one ``scandir`` walk;
on object stores one recursive listing), but only files whose *arrival time* is within
``cloudFiles.recheckWindowSeconds`` of the newest arrival seen (the watermark) are
looked up in the store; older ones were already recorded. The arrival time of a local
file is the later of its mtime and ctime: a rename keeps the mtime of the write but
sets the ctime, so a file renamed in long after it was written is still new. On an
object store the arrival time is the object's LastModified, which may be stamped
before the object became visible (a long or multipart upload): an upload slower than
the recheck window would be missed, so the default window (an hour) is kept far above
the time a landing file's upload takes.
"""

from __future__ import annotations

import fnmatch
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass

import pyarrow.fs as pafs

from deltaflow.ingest.cloudfiles._options import CloudFilesOptions
from deltaflow.table import _uri

STORE_DIR = "_cloudfiles"
_IGNORED_SUFFIXES = (".tmp", ".crc", ".inprogress", ".partial")
# Look-ups per SQL statement: under SQLite's default limit of bound parameters.
_LOOKUP_CHUNK = 500


@dataclass(frozen=True)
class LandingFile:
    seq: int
    uri: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class _Listed:
    uri: str
    size: int
    mtime_ns: int
    arrival_ns: int


def is_visible(relative: str, glob: str | None) -> bool:
    """Whether a path relative to the landing zone is a file the stream reads."""
    parts = relative.split("/")
    if any(p.startswith((".", "_")) for p in parts):
        return False
    name = parts[-1]
    if name.endswith(_IGNORED_SUFFIXES):
        return False
    return glob is None or fnmatch.fnmatchcase(name, glob)


class FileStore:
    """The seen-file store of one stream (see the module docstring)."""

    def __init__(self, options: CloudFilesOptions) -> None:
        self.options = options
        folder = os.path.join(_uri.local_path(options.schema_location), STORE_DIR)
        self.db_path = os.path.join(folder, "files.db")

    def _connect(self) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(self.db_path), exist_ok=True)
        conn = sqlite3.connect(self.db_path, timeout=60)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS files (seq INTEGER, path TEXT NOT NULL,"
            " size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, arrival_ns INTEGER NOT NULL)"
        )
        conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS files_seq ON files (seq)")
        conn.execute("CREATE INDEX IF NOT EXISTS files_path ON files (path, mtime_ns)")
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER)")
        return conn

    # ---- discovery ---------------------------------------------------------------------

    def discover(self) -> int:
        """List the landing zone, record new files; return the highest ``seq`` known."""
        started = time.monotonic()
        with closing(self._connect()) as conn, conn:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            first_listing = "watermark_ns" not in meta
            watermark = int(meta.get("watermark_ns", 0))
            floor = watermark - int(self.options.recheck_window_seconds * 1e9)
            candidates = [f for f in self._list() if f.arrival_ns >= floor]
            new = self._unknown(conn, candidates)
            new.sort(key=lambda f: (f.arrival_ns, f.uri))
            next_seq = int(meta.get("next_seq", 1))
            skip = first_listing and not self.options.include_existing_files
            rows = []
            for f in new:
                rows.append((None if skip else next_seq, f.uri, f.size, f.mtime_ns, f.arrival_ns))
                next_seq += 0 if skip else 1
            conn.executemany("INSERT INTO files VALUES (?, ?, ?, ?, ?)", rows)
            newest = max((f.arrival_ns for f in candidates), default=watermark)
            conn.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [("watermark_ns", max(newest, watermark)), ("next_seq", next_seq)],
            )
        self.last_listing = (len(candidates), len(new), time.monotonic() - started)
        return next_seq - 1

    def _unknown(self, conn: sqlite3.Connection, listed: list[_Listed]) -> list[_Listed]:
        known: set[tuple[str, int]] = set()
        for i in range(0, len(listed), _LOOKUP_CHUNK):
            chunk = listed[i : i + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            known.update(
                conn.execute(
                    f"SELECT path, mtime_ns FROM files WHERE path IN ({marks})",
                    [f.uri for f in chunk],
                ).fetchall()
            )
        if self.options.allow_overwrites:  # a changed mtime makes a new file
            return [f for f in listed if (f.uri, f.mtime_ns) not in known]
        paths = {path for path, _ in known}
        return [f for f in listed if f.uri not in paths]

    def _list(self) -> Iterator[_Listed]:
        root = self.options.path
        exclude = self.options.schema_location.rstrip("/") + "/"
        if _uri.is_local(root):
            yield from self._walk_local(_uri.local_path(root), "", exclude)
            return
        fs, base = _uri.filesystem(root)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        for info in fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(base) :].lstrip("/")
            uri = _uri.join(root, relative)
            if is_visible(relative, self.options.path_glob_filter) and not uri.startswith(exclude):
                mtime = int(info.mtime_ns or 0)
                yield _Listed(uri, int(info.size or 0), mtime, mtime)

    def _walk_local(self, folder: str, prefix: str, exclude: str) -> Iterator[_Listed]:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            relative = prefix + entry.name
            if entry.name.startswith((".", "_")):
                continue
            uri = "file://" + entry.path
            if (uri + "/").startswith(exclude):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk_local(entry.path, relative + "/", exclude)
            elif entry.is_file() and is_visible(relative, self.options.path_glob_filter):
                try:
                    stat = entry.stat()
                except FileNotFoundError:  # renamed away meanwhile
                    continue
                arrival = max(stat.st_mtime_ns, stat.st_ctime_ns)
                yield _Listed(uri, stat.st_size, stat.st_mtime_ns, arrival)

    # ---- admission ---------------------------------------------------------------------

    def admit(
        self, start: int, cap: int | None, budget_files: int | None, budget_bytes: int | None
    ) -> int:
        """The end ``seq`` of a batch after ``start``: at most ``budget_files`` files;
        ``budget_bytes`` is soft (the file that crosses it is still admitted)."""
        with closing(self._connect()) as conn:
            query = "SELECT seq, size FROM files WHERE seq > ?"
            params: list[int] = [start]
            if cap is not None:
                query += " AND seq <= ?"
                params.append(cap)
            query += " ORDER BY seq"
            if budget_files is not None:
                query += " LIMIT ?"
                params.append(budget_files)
            end, used = start, 0
            for seq, size in conn.execute(query, params):
                if budget_bytes is not None and used >= budget_bytes:
                    break
                end, used = seq, used + size
        return end

    def files_between(self, start: int, end: int) -> list[LandingFile]:
        with closing(self._connect()) as conn:
            rows = conn.execute(
                "SELECT seq, path, size, mtime_ns FROM files WHERE seq > ? AND seq <= ?"
                " ORDER BY seq",
                (start, end),
            ).fetchall()
        return [LandingFile(int(s), str(p), int(z), int(m)) for s, p, z, m in rows]

    def sample(self, count: int) -> list[str]:
        """Up to ``count`` visible files to infer a schema from (the newest first)."""
        listed = sorted(self._list(), key=lambda f: (f.arrival_ns, f.uri), reverse=True)
        return [f.uri for f in listed[:count] if f.size > 0]
