"""The brain's snapshot cache: one loaded snapshot per table, shared by ``table.load`` and
``scan.plan`` (issue 29; ``docs/notes/s3a-next2.md`` §1.4, P2).

A read's ``table.load`` and its ``scan.plan`` used to load the log twice, each load on S3
1 LIST + 1 GET + 2 GET per commit since the last checkpoint, one after the other before any
task starts. Here a snapshot is loaded once and then revalidated by name:

* **Time travel** (``versionAsOf``): a version never changes, so a hit costs no request.
* **Latest**: a hit at version *v* is still the latest if ``_delta_log/<v+1>.json`` does not
  exist — one HEAD on an object store, one stat on a local path (one code path: the probe
  is :func:`deltaflow.table._conditional_put.object_exists`). Versions are contiguous and
  every commit file is created once with put-if-absent; log cleanup removes only old
  commits below a checkpoint, never the newest. So "``v+1.json`` is absent" means "no
  version after *v*" at that instant, the same answer a LIST gives, with the same race
  against a concurrent committer. If it exists the table is loaded anew.
* **A table deleted and re-created at the same path** that has not reached *v*+1 yet passes
  the name probe. On a local path an entry also keeps which file its version's commit is
  (inode, mtime, size: ``_log.commit_mark``, as the real-time sink's ``LogHead`` does) and
  a hit is reused only while ``<v>.json`` is still that file — one stat more, a few µs
  (``docs/architecture.md``), for latest and time-travel hits alike. On an object store a
  stat is a request: there a batch scan that fails on a missing data file has the
  connector name the table in its next request (``staleSnapshots``, the server's
  ``drop_stale_snapshots``), so at most one read fails; and an entry older than
  :data:`TTL_SECONDS` is loaded anew (option (b) of the note), and a load that finds no
  table drops the path's entries. Option (a) (a LIST from ``<v-1>.json`` comparing the
  commit's size and modification time for older entries) needs those recorded at each
  install — a HEAD more per load — and is priced on AWS like ~12 GETs; the failure (b)
  leaves is loud, not wrong: the stale snapshot's data files are gone, so the read fails
  with FileNotFound (once, then the drop above), it returns no stale rows.
* The brain's own commits (``write.commit``, sink commits, DML, SQL commands) drop the
  table's entries (:func:`forget`), as delta-spark's ``updateAfterCommit`` moves its cached
  log on.

Bounded by entries and by the files they hold (a 1M-file table's add actions are hundreds
of MB here); the least recently used go first. One lock guards the map and is never held
during a load or a probe: two concurrent cold loads of a table may both load, the newer
version stays. Entries are never changed once installed (a newer version is a new entry), so
a snapshot handed out stays valid however long its caller keeps it.

Keyed by the normalized table URI: the brain reads storage credentials from its environment,
one identity per brain, so no storage options take part in the key.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from deltaflow.table import _conditional_put, _log, _uri
from deltaflow.table._log import CommitMark
from deltaflow.table._snapshot import Snapshot, load_snapshot
from deltaflow.table.errors import TableNotFoundError

# A query's table.load and scan.plan, and back-to-back queries, fall well within it; a table
# deleted and re-created at one path is seen after at most this long (see the docstring).
TTL_SECONDS = 10.0
ENTRIES_KEPT = 256
# The add actions of all kept snapshots together (each ~0.3-1 KB in the brain).
FILES_KEPT = 2_000_000

_LATEST = -1  # the key's version of a table's latest snapshot


@dataclass(frozen=True)
class _Entry:
    snapshot: Snapshot
    files: int
    loaded_at: float  # time.monotonic() when its load began
    # The snapshot's own commit file as it was just after the load; None on object stores.
    mark: CommitMark | None = None


_entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
_files_kept = 0
_lock = threading.Lock()


def snapshot(
    uri: str, *, version: int | None = None, timestamp: str | dt.datetime | None = None
) -> Snapshot:
    """The table at ``uri`` (normalized) at ``version``, as of ``timestamp``, or latest, as
    :func:`deltaflow.table._snapshot.load_snapshot` loads it (same typed errors)."""
    if timestamp is not None:
        # Which version a timestamp names needs the log's commit times: a load.
        loaded = _load(uri, timestamp=timestamp)
        _install((uri, loaded.snapshot.version), loaded)
        return loaded.snapshot
    if version is not None:
        hit = _get((uri, version))
        if hit is None:
            latest = _get((uri, _LATEST))
            hit = latest if latest is not None and latest.snapshot.version == version else None
        if hit is not None and _still_the_table(uri, hit):
            return hit.snapshot
        loaded = _load(uri, version=version)
        _install((uri, version), loaded)
        return loaded.snapshot
    hit = _get((uri, _LATEST))
    if (
        hit is not None
        and _conditional_put.supported(uri)
        and _still_the_table(uri, hit)
        and not _newer_commit(uri, hit.snapshot.version)
    ):
        return hit.snapshot
    loaded = _load(uri)
    _install((uri, _LATEST), loaded)
    return loaded.snapshot


def forget(uri: str | None = None) -> None:
    """Drop the entries of the table at ``uri`` (normalized), or all of them: after a
    commit, or a load that found no table there."""
    global _files_kept
    with _lock:
        for key in [k for k in _entries if uri is None or k[0] == uri]:
            _files_kept -= _entries.pop(key).files


def _get(key: tuple[str, int]) -> _Entry | None:
    now = time.monotonic()
    global _files_kept
    with _lock:
        entry = _entries.get(key)
        if entry is None:
            return None
        if now - entry.loaded_at > TTL_SECONDS:
            _files_kept -= _entries.pop(key).files
            return None
        _entries.move_to_end(key)
        return entry


def _load(
    uri: str, *, version: int | None = None, timestamp: str | dt.datetime | None = None
) -> _Entry:
    started = time.monotonic()
    try:
        loaded = load_snapshot(uri, version=version, timestamp=timestamp)
    except TableNotFoundError:
        forget(uri)
        raise
    # The table is loaded with its files (deltalake 1.6 always materializes them): counting
    # them costs no request. As Arrow rows, not a Python list of their URIs (~5x cheaper).
    files = loaded.delta_table.get_add_actions(flatten=False).num_rows
    # Marked after the load: a table made again between the load's read of the commit and
    # this stat would tie the old snapshot to the new file — a window of microseconds,
    # still closed by the TTL, as on object stores.
    mark = commit_mark(uri, loaded.version) if _uri.is_local(uri) else None
    return _Entry(loaded, files, started, mark)


def _install(key: tuple[str, int], entry: _Entry) -> None:
    global _files_kept
    with _lock:
        current = _entries.get(key)
        if current is not None:
            if current.snapshot.version > entry.snapshot.version:
                return  # a concurrent load saw a newer version
            _files_kept -= current.files
            del _entries[key]
        _entries[key] = entry
        _files_kept += entry.files
        while _entries and (len(_entries) > ENTRIES_KEPT or _files_kept > FILES_KEPT):
            _files_kept -= _entries.popitem(last=False)[1].files


def commit_mark(uri: str, version: int) -> CommitMark | None:
    """Which file commit ``version`` of the local table ``uri`` is; None when it is absent
    (a table whose log starts at a checkpoint past it: no mark, the TTL alone applies)."""
    return _log.commit_mark(os.path.join(_uri.local_path(uri), "_delta_log"), version)


def _still_the_table(uri: str, entry: _Entry) -> bool:
    """Whether ``entry``'s commit file is still the one it was loaded from (one stat, local
    paths only; object stores answer True: a stat there is a request). When it is not,
    the table was made again at ``uri``: all its entries (time travel too) are of the old
    one and go, so the new table's lower versions are installed over none of them."""
    if entry.mark is None or commit_mark(uri, entry.snapshot.version) == entry.mark:
        return True
    forget(uri)
    return False


def _newer_commit(uri: str, version: int) -> bool:
    return _conditional_put.object_exists(_uri.join(uri, f"_delta_log/{version + 1:020d}.json"))
