"""Which versions VACUUM must keep whole for running readers (their leases).

VACUUM's retention already keeps every file a version inside the retention needs: a file
removed at version ``k`` is needed by versions below ``k``, and its tombstone stays until
``k``'s removal is older than the retention, by which time every version that saw the file
is older too. The leases of :mod:`deltaflow.table._reader_leases` add the versions a
running stream still has to read, however old: every version ``>= v`` for the lowest
live lease version ``v``.

A file some version ``>= v`` references is either current (VACUUM never deletes those)
or was removed by a later commit ``k > v``, so it is in version ``k - 1``'s snapshot.
Keeping the snapshots of ``v`` and of ``k - 1`` for each commit ``k`` in ``(v, latest]``
that removes files keeps exactly those files; commits without removes (a stream's
appends) add nothing to keep. delta-rs's VACUUM takes that list (``keep_versions``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from deltaflow.table import _log, _reader_leases
from deltaflow.table._reader_leases import ReaderLease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaderGuard:
    """The leases a VACUUM found, and the versions it keeps for the live ones."""

    live: tuple[ReaderLease, ...]
    expired: tuple[ReaderLease, ...]
    keep_versions: tuple[int, ...]  # empty: the live readers need nothing VACUUM could take

    @property
    def oldest(self) -> ReaderLease | None:
        """The live lease that needs the oldest version (it decides what is kept)."""
        return min(self.live, key=lambda lease: lease.version, default=None)


def guard(table_uri: str, latest: int, configuration: Mapping[str, str | None]) -> ReaderGuard:
    """The leases on the table at ``table_uri`` (newest version ``latest``) and the
    versions whose files VACUUM has to keep for the live ones."""
    timeout = _reader_leases.timeout_seconds(configuration)
    live, expired = _reader_leases.live_leases(table_uri, timeout)
    versions: tuple[int, ...] = ()
    if live:
        lowest = min(lease.version for lease in live)
        versions = tuple(_versions_to_keep(table_uri, lowest, latest))
    return ReaderGuard(tuple(live), tuple(expired), versions)


def _versions_to_keep(table_uri: str, lowest: int, latest: int) -> list[int]:
    if lowest >= latest:
        return []  # the reader needs only current files and later ones
    lowest = max(lowest, _oldest_in_log(table_uri, lowest))
    versions = {lowest}
    for version in range(lowest + 1, latest + 1):
        text = _log.read_commit_text(table_uri, version)
        # A text search is enough: a false hit only keeps one snapshot more.
        if text is not None and '"remove"' in text:
            versions.add(version - 1)
    return sorted(versions)


def _oldest_in_log(table_uri: str, wanted: int) -> int:
    """``wanted``, or the oldest version log cleanup left when ``wanted`` is gone (such a
    reader fails on the missing commit anyway; its lease cannot keep what is lost)."""
    if _log.read_commit_text(table_uri, wanted) is not None:
        return wanted
    checkpoint = _log.last_checkpoint(table_uri)
    if checkpoint is None:
        return wanted
    log.warning(
        "a reader lease on %s needs version %d, which log cleanup removed; keeping from version %d",
        table_uri,
        wanted,
        checkpoint,
    )
    return checkpoint
