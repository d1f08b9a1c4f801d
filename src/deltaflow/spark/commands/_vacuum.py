"""``VACUUM`` of a Delta table (delta-spark's full mode) and its retention rules: the
retention a table asks for, the check that refuses a shorter one, and the files running
readers' leases keep whatever the retention.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from deltalake import CommitProperties
from deltalake import DeltaTable as _DeltaRsTable

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.commands._maintenance import Row, upkeep, writable_table
from deltaflow.spark.errors import RetentionTooShortError
from deltaflow.spark.write._native import delete_stale_staging
from deltaflow.table import _dv_references, _log_upkeep, _reader_leases, _uri, _vacuum_guard
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import load_snapshot

log = logging.getLogger("deltaflow.maintenance")

# delta-spark's conf that lets VACUUM keep removed files for less than the table's
# retention; the check protects readers and lagging streams that still need them.
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
DEFAULT_RETENTION_HOURS = 168.0  # delta.deletedFileRetentionDuration default: 7 days
VACUUM_SCHEMA = "path string"


def vacuum(
    uri: str,
    retention_hours: float | None = None,
    *,
    dry_run: bool = False,
    check_retention: bool = True,
    commit_info: Mapping[str, Any] | None = None,
) -> list[Row]:
    """Delete the table directory's files that no version inside the retention
    references and that are older than the retention (``VACUUM``, delta-spark's full mode).

    That covers files the log removed, files never committed (a crashed writer's or
    stream attempt's), expired ``_change_data/`` files and orphaned deletion vectors;
    other ``_``- or ``.``-prefixed directories are left alone. A file younger than the
    retention is never deleted, so a concurrent writer's uncommitted files are safe.

    Without ``retention_hours`` the table's ``delta.deletedFileRetentionDuration`` (7 days
    by default) applies. A shorter one is refused with :class:`RetentionTooShortError`
    unless ``check_retention`` is false (delta-spark's
    ``spark.databricks.delta.retentionDurationCheck.enabled``). A real run also deletes
    the staging directories of writes killed before their commit (``_delta_staging/``),
    once nothing was written in them for the retention. Returns the table's path, or
    with ``dry_run`` the files that would be deleted (nothing is deleted then).
    ``commit_info``: more commitInfo keys for the VACUUM START / END commits
    (``deltaflow maintain`` marks its runs with them).

    Files a running stream still needs are kept whatever the retention: every version at
    or after the lowest live reader lease's (:mod:`deltaflow.table._vacuum_guard`) keeps
    its files; what was kept for them is logged, and a real run deletes expired leases.
    """
    snapshot = load_snapshot(uri)
    minimum = retention_hours_of(snapshot.configuration)
    if retention_hours is not None:
        check_retention_value(snapshot.uri, retention_hours)
    if check_retention and retention_hours is not None and retention_hours < minimum:
        raise RetentionTooShortError(
            f"VACUUM of {snapshot.uri} with a retention of {retention_hours:g} hours is below"
            f" the table's {minimum:g} hours: files that running queries or lagging streams"
            f" still need could be deleted. If you are sure, set the Spark conf"
            f" {RETENTION_CHECK_CONF}=false.",
            table_uri=snapshot.uri,
            retention_hours=float(retention_hours),
            minimum_hours=minimum,
        )
    # delta-rs takes whole hours; rounding up keeps files at least as long as asked.
    hours = None if retention_hours is None else math.ceil(retention_hours)
    # delta-rs refuses to log VACUUM START/END on tables it cannot write (clustered ones):
    # there it only lists the files, and deltaflow deletes them (the log entries are
    # optional provenance, delta-spark's vacuum.logging).
    unwritable = bool(Protocol.of(snapshot).delta_rs_unwritable)
    table = writable_table(snapshot.uri)
    readers = _vacuum_guard.guard(snapshot.uri, snapshot.version, snapshot.configuration)
    keep = list(readers.keep_versions) or None
    plan: dict[str, Any] = {
        "retention_hours": hours,
        "enforce_retention_duration": check_retention,
    }
    # Full mode, as delta-spark: every file in the table directory that no version inside
    # the retention references and that is older than the retention by its modification
    # time (crashed writers' files, expired _change_data/ files), not only the files the
    # log removed. delta-rs's full mode does that, except that it takes live deletion
    # vector files for orphans: on tables with deletion vectors delta-rs runs in its lite
    # mode and deltaflow deletes the other files it lists, deletion vectors excepted; so
    # it does on object stores, where delta-rs also lists directory marker objects (the
    # table's own ``prefix/``), which must not be deleted.
    full = _uri.is_local(snapshot.uri) and not Protocol.of(snapshot).features & {"deletionVectors"}
    # Tombstones removed since then keep their deletion vectors (computed before delta-rs
    # lists, so the cutoff errs early: more kept, never less).
    removed_since_ms = int(time.time() * 1000 - (minimum if hours is None else hours) * 3.6e6)
    dvs = _dv_references.DvFiles(snapshot.uri, removed_since_ms)
    unguarded = None
    if keep:  # to say what the leases keep: the plan without them (lists, deletes nothing)
        unguarded = _full_plan(table, snapshot.uri, plan, None, dvs)
    orphans = [] if full and not unwritable else _full_plan(table, snapshot.uri, plan, keep, dvs)
    inside = _inside(snapshot.uri)
    if not full and not unwritable:
        # delta-rs's lite mode deletes the files the log removed wherever they are: after
        # DML on a shallow clone, its source's files. Then it only lists, and deltaflow
        # deletes what lies under the table's root (delta-spark never deletes elsewhere).
        listed = table.vacuum(**plan, dry_run=True, full=False, keep_versions=keep)
        unwritable = not all(map(inside, listed))
    removed = table.vacuum(
        **plan,
        dry_run=dry_run or unwritable,
        full=full,
        post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
        commit_properties=CommitProperties(custom_metadata=dict(commit_info))
        if commit_info
        else None,
        keep_versions=keep,
    )
    files = sorted(filter(inside, set(removed) | set(orphans)))
    _report_readers(snapshot.uri, readers, unguarded, files, dry_run=dry_run)
    if not dry_run and not unwritable:
        upkeep(snapshot.uri, table)
    if not dry_run:
        # delta-rs's run deleted (and logged) what it listed; the rest is deltaflow's.
        _delete_files(snapshot.uri, files if unwritable else sorted(set(orphans) - set(removed)))
    if dry_run:
        return [(_file_uri(snapshot.uri, f),) for f in sorted(files)]
    # delta-rs leaves _-prefixed directories alone, so the staging directories of
    # writes killed before their commit are ours to remove, by the same retention.
    delete_stale_staging(snapshot.uri, minimum if hours is None else hours)
    for lease in readers.expired:  # their readers died without releasing them
        _reader_leases.delete_lease(snapshot.uri, lease.lease_id)
    return [(snapshot.uri,)]


def _full_plan(
    table: _DeltaRsTable,
    table_uri: str,
    plan: Mapping[str, Any],
    keep: list[int] | None,
    dvs: _dv_references.DvFiles,
) -> list[str]:
    """The files delta-rs's full-mode VACUUM would delete, minus the deletion vector files
    a version inside the retention references (delta-rs 1.6.6's full mode counts no
    deletion vector as referenced, so it would delete live ones; with reader leases
    (``keep``) every deletion vector file stays, the leased versions' are not replayed),
    and minus directory markers (names ending in ``/``), which are no files of the table."""
    files = table.vacuum(**plan, dry_run=True, full=True, keep_versions=keep)
    out = []
    for f in files:
        if not f or f.endswith("/"):
            continue
        if _dv_references.is_dv_file(f) and (keep or dvs.referenced(_file_uri(table_uri, f))):
            continue
        out.append(f)
    return out


def _report_readers(
    uri: str,
    readers: _vacuum_guard.ReaderGuard,
    unguarded: list[str] | None,
    files: list[str],
    *,
    dry_run: bool,
) -> None:
    """Log what the running readers' leases kept (and which leases expired)."""
    for lease in readers.expired:
        log.info("VACUUM of %s: ignoring expired %s", uri, lease.describe())
    oldest = readers.oldest
    if oldest is None:
        return
    kept = sorted(set(unguarded or ()) - set(files))
    others = len(readers.live) - 1
    log.info(
        "VACUUM%s of %s keeps %d removed file(s) past the retention for running readers: %s%s%s",
        " DRY RUN" if dry_run else "",
        uri,
        len(kept),
        oldest.describe(),
        f" and {others} more lease(s)" if others else "",
        f"; e.g. {kept[0]}" if kept else "",
        # For tools and tests: the files kept and the leases that kept them.
        extra={"kept_files": kept, "reader_leases": [lease.lease_id for lease in readers.live]},
    )


def check_retention_value(uri: str, retention_hours: float) -> None:
    """Refuse a negative or non-finite VACUUM retention (:class:`InvalidOptionError`)."""
    if not math.isfinite(retention_hours) or retention_hours < 0:
        raise InvalidOptionError(
            f"VACUUM of {uri}: the retention must be a number of hours of 0 or more, got"
            f" {retention_hours}.",
            option="retentionHours",
        )


def retention_hours_of(configuration: Mapping[str, str | None]) -> float:
    """The table's ``delta.deletedFileRetentionDuration`` in hours (168 when unset)."""
    raw = configuration.get("delta.deletedFileRetentionDuration")
    match = re.fullmatch(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*", (raw or "").lower())
    if match is None:
        return DEFAULT_RETENTION_HOURS
    per_unit = {"week": 168.0, "day": 24.0, "hour": 1.0, "minute": 1 / 60, "second": 1 / 3600}
    unit = match.group(2).rstrip("s")
    if unit not in per_unit:
        return DEFAULT_RETENTION_HOURS
    return float(match.group(1)) * per_unit[unit]


def _delete_files(table_uri: str, files: list[str]) -> None:
    fs, _ = _uri.filesystem(table_uri)
    for path in files:
        uri = _file_uri(table_uri, path)
        target = _uri.local_path(uri) if _uri.is_local(uri) else _uri.filesystem(uri)[1]
        with contextlib.suppress(FileNotFoundError):  # deleted by a concurrent VACUUM
            fs.delete_file(target)


def _inside(table_uri: str) -> Callable[[str], bool]:
    """Whether a file delta-rs names lies under the table's root (a shallow clone's log
    also names its source's files, which VACUUM of the clone must never delete)."""
    root = _uri.normalize_uri(table_uri).rstrip("/") + "/"
    return lambda path: _uri.normalize_uri(_file_uri(table_uri, path)).startswith(root)


def _file_uri(table_uri: str, path: str) -> str:
    """A file delta-rs names (relative to the root, or absolute) as a URI."""
    if "://" in path or path.startswith("/"):
        return _uri.normalize_uri(path)
    return _uri.join(table_uri, path)
