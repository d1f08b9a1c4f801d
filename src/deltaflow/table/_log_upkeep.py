"""Log upkeep after a commit: checkpoints and expired log cleanup, as delta-spark does.

Every commit route (delta-rs transactions in :mod:`deltaflow.table._commit`, deltaflow's
own log writer in :mod:`deltaflow.table._log_commit`, auto compaction) calls
:func:`after_commit` with the version it just committed:

* **Checkpoint** when the version is a multiple of ``delta.checkpointInterval`` (default
  :data:`DEFAULT_CHECKPOINT_INTERVAL`, delta-spark's 10). delta-rs's own post-commit hook
  checkpoints when ``version + 1`` is a multiple (versions 9, 19, ...) and defaults to 100,
  so our delta-rs commits turn that hook off (:data:`DELTA_RS_HOOKS_OFF`) and every route
  gets the same checkpoints a delta-spark writer would write (10, 20, ...).
* **Expired log cleanup** right after a checkpoint this commit wrote, unless
  ``delta.enableExpiredLogCleanup`` is false: delta-rs deletes the JSON commits and
  checkpoints older than ``delta.logRetentionDuration`` (default ``interval 30 days``),
  never past the newest checkpoint before that cutoff, so every remaining version can
  still be read. Time travel to a removed version is a ``VersionNotFoundError``.

Neither ever fails the writer: the commit is in, and a missing checkpoint only slows
readers down (the next multiple writes one). A failure is logged as a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from deltalake import DeltaTable
from deltalake.transaction import PostCommitHookProperties

from deltaflow.table import _log, _uri

log = logging.getLogger(__name__)

# delta-spark's default. delta-rs defaults to 100; 10 keeps a streaming table (one commit
# per micro-batch) cheap to open, at one checkpoint write per ten commits.
DEFAULT_CHECKPOINT_INTERVAL = 10

# Our delta-rs commits leave checkpoints and cleanup to :func:`after_commit`.
DELTA_RS_HOOKS_OFF = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def checkpoint_interval(configuration: Mapping[str, str | None]) -> int:
    """``delta.checkpointInterval`` of a table configuration (a bad value: the default)."""
    value = _property(configuration, "delta.checkpointInterval")
    if value:
        try:
            return max(int(value), 1)
        except ValueError:
            pass
    return DEFAULT_CHECKPOINT_INTERVAL


def expired_log_cleanup_enabled(configuration: Mapping[str, str | None]) -> bool:
    """``delta.enableExpiredLogCleanup`` (default true, as in delta-spark)."""
    value = _property(configuration, "delta.enableExpiredLogCleanup")
    return value is None or value.strip().lower() != "false"


def after_commit(
    table_uri: str,
    version: int | None,
    *,
    configuration: Mapping[str, str | None] | None = None,
    checkpoint_interval: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> bool:
    """Checkpoint ``version`` of ``table_uri`` if it is due, then clean up expired log
    files. ``configuration``: the table's properties when the caller has them;
    ``checkpoint_interval``: its interval when the caller knows only that (the properties
    are then read from the log only when a checkpoint is due); neither: read from the log.
    True when a checkpoint was written here; never raises."""
    if version is None or version <= 0:
        return False
    known_not_due = checkpoint_interval is not None and version % max(checkpoint_interval, 1)
    if configuration is None and known_not_due:
        return False
    try:
        return _upkeep(table_uri, version, configuration, storage_options)
    except Exception as exc:  # the commit is in: upkeep never fails the writer
        log.warning(
            "log upkeep after version %d of %s failed (the commit stands): %s",
            version,
            table_uri,
            exc,
        )
        return False


def _upkeep(
    table_uri: str,
    version: int,
    configuration: Mapping[str, str | None] | None,
    storage_options: dict[str, str] | None,
) -> bool:
    table: DeltaTable | None = None
    if configuration is None:
        table = _load(table_uri, version, storage_options)
        configuration = table.metadata().configuration
    if version % checkpoint_interval(configuration):
        return False
    if _already_checkpointed(table_uri, version):
        return False  # another route (or writer) already did this version's upkeep
    table = table or _load(table_uri, version, storage_options)
    table.create_checkpoint()
    log.info("wrote a checkpoint at version %d of %s", version, table_uri)
    if expired_log_cleanup_enabled(configuration):
        table.cleanup_metadata()
    return True


def _already_checkpointed(table_uri: str, version: int) -> bool:
    try:
        newest = _log.last_checkpoint(table_uri)
    except Exception:  # e.g. a store pyarrow cannot open without options: just checkpoint
        return False
    return newest is not None and newest >= version


def _load(table_uri: str, version: int, storage_options: dict[str, str] | None) -> DeltaTable:
    return DeltaTable(
        _uri.delta_rs_uri(table_uri), version=version, storage_options=storage_options
    )


def _property(configuration: Mapping[str, str | None], name: str) -> str | None:
    wanted = name.lower()  # delta-spark matches table property keys case-insensitively
    for key, value in configuration.items():
        if key.lower() == wanted:
            return value
    return None
