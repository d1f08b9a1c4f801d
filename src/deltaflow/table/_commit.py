"""Commits: turn files that executors wrote into exactly one Delta commit.

delta-rs writes the log entry (atomic put-if-absent on every store it supports),
retries when another writer took the version it wanted and checks the winner for
conflicts. This module adds what Spark-side writers need on top: app-transaction
idempotency (``txnAppId`` / ``txnVersion``), creation with data in one commit,
schema evolution, and typed errors.

Commits delta-rs's Python API cannot express (``cdc`` actions, removes of files with
deletion vectors), every DML commit (a request with ``read`` set: what the transaction
read) so that all of them follow one set of conflict rules, and every commit to a table
with a writer feature delta-rs refuses (``DELTA_RS_UNWRITABLE_FEATURES``: identity
columns, clustering) go through :mod:`deltaflow.table._log_write` instead. A delta-rs
refusal that slips through is an :class:`UnsupportedFeatureError`, never a conflict.
Conflicts are named and typed in :mod:`._commit_conflicts`, what a commit records about
itself in :mod:`._commit_info`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from deltaflow.table import (
    _auto_compact,
    _compaction_lease,
    _conditional_put,
    _log_commit,
    _log_upkeep,
    _uri,
)
from deltaflow.table._commit_conflicts import (
    LEASE_WAIT_SECONDS,
    MAX_APPEND_REBASES,
    busy_error,
    conflict_error,
    conflict_kind,
    past_compactions,
)
from deltaflow.table._commit_info import commit_properties, delta_rs_operation
from deltaflow.table._object_store import object_store_error
from deltaflow.table._protocol import Protocol, protocol_for_new_table
from deltaflow.table._snapshot import catch_up, latest_version, open_latest
from deltaflow.table.errors import ConcurrentWriteError, TableAlreadyExistsError

if TYPE_CHECKING:
    from deltaflow.table._log_head import LogHead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AddedFile:
    """A data file an executor wrote, ready to be referenced by a commit."""

    path: str  # relative to the table root, not percent-encoded
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str
    data_change: bool = True
    # The protocol's add tags (readers ignore them): a real-time sink's row log names the
    # log positions a file holds (``_rowlog.TAG``). Only deltaflow's log writer writes them.
    tags: dict[str, str] | None = None

    def to_action(self) -> AddAction:
        return AddAction(
            self.path,
            self.size,
            self.partition_values,
            self.modification_time,
            self.data_change,
            self.stats,
        )

    def to_log_action(self) -> dict[str, Any]:
        """The protocol's ``add`` object (path URI-encoded, as the log stores it)."""
        return {
            "path": _log_commit.encode_path(self.path),
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": self.modification_time,
            "dataChange": self.data_change,
            "stats": self.stats,
            **({"tags": dict(self.tags)} if self.tags else {}),
        }

    def to_cdc_action(self) -> dict[str, Any]:
        """The protocol's ``cdc`` object for a change data file."""
        return {
            "path": _log_commit.encode_path(self.path),
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "dataChange": False,
        }


@dataclass(frozen=True)
class RemovedFile:
    """A live file to remove; ``path`` exactly as the log (and ``FileEntry.path``) has it."""

    path: str  # URI-encoded, as in the log
    size: int
    partition_values: dict[str, Any]
    data_change: bool = True
    # The file's deletion vector descriptor: a remove must name it (protocol: the
    # logical file is path + DV), else readers keep the DV'd version live.
    deletion_vector: dict[str, Any] | None = None
    stats: str | None = None

    def to_log_action(self) -> dict[str, Any]:
        """The protocol's ``remove`` object, with the extended file metadata."""
        action: dict[str, Any] = {
            "path": self.path,
            "dataChange": self.data_change,
            "extendedFileMetadata": True,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
        }
        if self.stats is not None:
            action["stats"] = self.stats
        if self.deletion_vector is not None:
            action["deletionVector"] = dict(self.deletion_vector)
        return action

    def to_action(self, now_ms: int) -> RemoveAction:
        # delta-rs URI-encodes the paths it is given (as for adds), so hand it the decoded
        # path: passing the log's form would encode it twice and remove nothing.
        return RemoveAction(
            unquote(self.path),
            self.data_change,
            now_ms,
            size=self.size,
            partition_values=self.partition_values,
        )


@dataclass(frozen=True)
class CommitRequest:
    """Everything one commit needs; built on the driver from the executors' messages."""

    table_uri: str
    schema: dict[str, Any]
    partition_columns: tuple[str, ...]
    adds: Sequence[AddedFile]
    removes: Sequence[RemovedFile] = ()
    mode: Literal["append", "overwrite"] = "append"
    read_version: int | None = None  # None: the table did not exist when the write started
    new_columns: Sequence[dict[str, Any]] = ()  # mergeSchema: fields to add before appending
    # mergeSchema added struct fields, or columns to a column-mapped table: ``schema`` and
    # ``configuration`` (its raised maxColumnId) are committed beside the data (log writer).
    evolves_in_commit: bool = False
    configuration: dict[str, str] = field(default_factory=dict)
    app_id: str | None = None
    app_version: int | None = None
    # More app transactions in the same commit, ``(app id, version)`` (a real-time sink's
    # interval commits every partition's rows, each partition under its own app id).
    more_transactions: tuple[tuple[str, int], ...] = ()
    # Where each app transaction's rows start, ``(app id, from)``: a real-time sink's
    # rolls (``from`` = ``epoch << 32 | first row``). Set, the commit must continue the log
    # exactly (:func:`rolls_committed`) instead of only being newer than it.
    txn_from: tuple[tuple[str, int], ...] = ()
    user_metadata: str | None = None
    description: str | None = None  # the table comment, for a commit that creates the table
    # Extra top-level commitInfo fields (operationParameters, operationMetrics, readVersion...)
    commit_info: dict[str, Any] = field(default_factory=dict)
    storage_options: dict[str, str] | None = None
    # Set: commit with deltaflow's log writer, checking conflicts against this read set.
    read: _log_commit.ReadSet | None = None
    operation: str = "WRITE"
    cdc: Sequence[AddedFile] = ()  # change data files (``_change_data/...``)
    # The table, loaded (at read_version when pinned) by a caller that keeps it up to
    # date: the commit then loads no log of its own. Moved on by the commit.
    table: DeltaTable | None = None
    # A local table's log head at read_version, held by the caller (a real-time sink):
    # the commit reads its metadata and app transactions from it, not from a delta-rs
    # table, and moves it over every version it learns (its own included). No listing.
    head: LogHead | None = field(default=None, compare=False)
    # Identity columns whose values this write generated: their high water marks move.
    identity_generated: tuple[str, ...] = ()
    # CLUSTER BY of a write that creates (or replaces) the table: column names.
    clustering_columns: tuple[str, ...] | None = None
    # CREATE OR REPLACE TABLE: the request's schema, partitioning, configuration and
    # comment replace the table's, and every live file is removed.
    replace_table: bool = False
    # overwriteSchema with new partition columns: ``partition_columns`` (and ``schema``)
    # replace the table's beside the data, every live file removed (the log writer).
    replace_partitioning: bool = False
    # The writer's session settings for auto compaction (the table's property decides
    # when they leave it open); see :mod:`deltaflow.table._auto_compact`.
    auto_compact: _auto_compact.AutoCompactSettings = _auto_compact.DEFAULT_SETTINGS


@dataclass(frozen=True)
class CommitResult:
    version: int | None  # None when the commit was skipped as a duplicate
    skipped: bool
    num_files: int
    # The table's properties as the commit saw them, when known (the post-commit log
    # upkeep then reads no log to find delta.checkpointInterval).
    configuration: dict[str, str | None] | None = field(default=None, compare=False)


def already_committed(table: DeltaTable, app_id: str | None, app_version: int | None) -> bool:
    """True when an app transaction at or above ``app_version`` is in the log."""
    if app_id is None or app_version is None:
        return False
    seen = table.transaction_version(app_id)
    return seen is not None and seen >= app_version


def transactions_of(request: CommitRequest) -> tuple[tuple[str, int], ...]:
    """Every app transaction ``request`` commits, ``(app id, version)``."""
    first = (
        ((request.app_id, request.app_version),)
        if request.app_id is not None and request.app_version is not None
        else ()
    )
    return first + tuple(request.more_transactions)


RollState = Literal["contiguous", "replayed", "other"]
_ROWS_MASK = (1 << 32) - 1


def roll_state(seen: int | None, start: int, end: int) -> RollState:
    """How a real-time roll of rows ``start``..``end`` (each ``epoch << 32 | row``) stands
    against ``seen``, its app transaction's version in the log: ``contiguous`` when it
    starts where the log ends (or at its epoch's start, the log holding an earlier epoch
    or nothing), ``replayed`` when the log ends exactly where it ends, else ``other``
    (a gap, an overlap, a finished epoch's zombie)."""
    if seen == start or (start & _ROWS_MASK == 0 and (seen is None or seen < start)):
        return "contiguous"
    if seen == end:
        return "replayed"
    return "other"


def rolls_committed(seen: Callable[[str], int | None], request: CommitRequest) -> bool:
    """The check of a commit whose transactions carry their starts (``txn_from``), against
    ``seen(app id)``, the log at the commit's read version: True when every roll is there
    exactly (a replay: commit nothing); False when every roll continues the log (commit);
    anything else is a ``ConcurrentWriteError`` (``ConcurrentTransaction``) naming each
    roll. Atomic with the put: the put is at read + 1, and a lost put's conflict scan
    refuses any later ``txn`` of these app ids."""
    starts = dict(request.txn_from)
    rolls = [(app, starts[app], end, seen(app)) for app, end in transactions_of(request)]
    states = [roll_state(logged, start, end) for _, start, end, logged in rolls]
    if states and all(s == "replayed" for s in states):
        return True
    if all(s == "contiguous" for s in states):
        return False
    described = "; ".join(
        f"{app} rows {_rows(start)}-{_rows(end)} ({state}), the log holding"
        f" {'nothing' if logged is None else _rows(logged)}"
        for (app, start, end, logged), state in zip(rolls, states, strict=True)
    )
    raise ConcurrentWriteError(
        f"The real-time rolls committed to {request.table_uri} do not continue its app"
        f" transactions ({described}): another writer of the same stream committed these"
        " rows, an older epoch's writer is still running, or the table was dropped and"
        " made again at its path while the stream ran. Nothing was committed; the"
        " stream replays from the log.",
        table_uri=request.table_uri,
        kind="ConcurrentTransaction",
        read_version=request.read_version,
        attempts=1,
    )


def _rows(version: int) -> str:
    """``epoch << 32 | row`` as ``e<epoch>:<row>``."""
    return f"e{version >> 32}:{version & _ROWS_MASK}"


def request_committed(table: DeltaTable, request: CommitRequest) -> bool:
    """True when every app transaction of ``request`` is in the log at or above its version
    (a replay: commit nothing). Some in and some not cannot be a replay of this request:
    a ``ConcurrentWriteError`` (``ConcurrentTransaction``), which the caller replays from.
    A request with ``txn_from`` (real-time rolls) is checked by :func:`rolls_committed`."""
    if request.txn_from:
        return rolls_committed(table.transaction_version, request)
    pairs = transactions_of(request)
    seen = [already_committed(table, app_id, version) for app_id, version in pairs]
    if not seen or not any(seen):
        return False
    if all(seen):
        return True
    raise ConcurrentWriteError(
        f"Some app transactions of this commit to {request.table_uri} are in the log already"
        f" and others not ({', '.join(a for (a, _), s in zip(pairs, seen, strict=True) if s)}"
        " recorded): another writer committed part of these rows. Nothing was committed;"
        " the stream replays from its log.",
        table_uri=request.table_uri,
        kind="ConcurrentTransaction",
        read_version=request.read_version,
        attempts=1,
    )


def commit(request: CommitRequest) -> CommitResult:
    """Commit ``request`` as one Delta transaction, or skip it if its app txn is recorded.

    Then the post-commit hooks: a checkpoint every ``delta.checkpointInterval`` versions and
    expired log cleanup (:mod:`deltaflow.table._log_upkeep`), and auto compaction of the
    partitions the commit wrote to, when the table or the session turns it on
    (:mod:`deltaflow.table._auto_compact`). They never raise: once this commit is in,
    nothing after it fails the write.
    """
    try:
        result = _commit_once(request)
    except OSError as exc:
        # delta-rs reports an object store that fails (or vanishes) mid-commit as a bare
        # OSError: give it its type (``unreachable`` is retryable) so a stream or a job
        # can tell "restart when the store answers" from a bug.
        error = object_store_error(request.table_uri, exc, "commit to")
        if error is None:
            raise
        raise error from exc
    if not result.skipped:
        after_commit(request, result)
    return result


def after_commit(request: CommitRequest, result: CommitResult) -> None:
    """The post-commit hooks for ``request``'s commit: log upkeep, then auto compaction
    (delta-spark's order: the checkpoint is part of the commit, compaction a hook after
    it); never raises."""

    def table() -> DeltaTable:
        # The commit's own table is at (or just after) the new version: no log load.
        if request.table is not None:
            return request.table
        return open_latest(request.table_uri, request.storage_options)

    _log_upkeep.after_commit(
        request.table_uri,
        result.version,
        configuration=_known_configuration(request, result),
        storage_options=request.storage_options,
    )
    _auto_compact.after_commit(
        table_uri=request.table_uri,
        partition_columns=request.partition_columns,
        added_partitions=[a.partition_values for a in request.adds if a.data_change],
        added_sizes=[a.size for a in request.adds if a.data_change],
        version=result.version,
        settings=request.auto_compact,
        configuration=_compaction_configuration(request, result),
        load_table=table,
        storage_options=request.storage_options,
    )


def _compaction_configuration(
    request: CommitRequest, result: CommitResult
) -> dict[str, str | None] | None:
    """The table's properties for auto compaction, when the commit knows them: a commit
    that creates the table carries them, the log writer's reports them (a real-time
    sink's log head has no delta-rs table to read them from); else None (read them)."""
    if result.configuration is not None:
        return result.configuration
    return dict(request.configuration) if request.read_version is None else None


def _known_configuration(
    request: CommitRequest, result: CommitResult
) -> dict[str, str | None] | None:
    """The table's properties when the commit or the request already has them (else the
    upkeep reads them from the log): a creating commit carries them; a caller's table is
    up to date."""
    if result.configuration is not None:
        return result.configuration
    if request.read_version is None:
        return dict(request.configuration)
    if request.table is not None:
        try:
            return dict(request.table.metadata().configuration)
        except Exception:  # a table object in a bad state: let the upkeep load its own
            return None
    return None


def _commit_once(request: CommitRequest) -> CommitResult:
    from deltaflow.table import _log_write

    location = _uri.delta_rs_uri(request.table_uri)
    if request.operation != delta_rs_operation(request) and _uri.is_local(request.table_uri):
        # delta-rs names every commit it writes itself (WRITE, CREATE TABLE); delta-spark's
        # names (STREAMING UPDATE, CREATE TABLE AS SELECT, a first write's WRITE, ...) need
        # deltaflow's log writer. Elsewhere history() reads OPERATION_KEY instead.
        return _log_write.commit_write(request)
    properties = commit_properties(request)
    schema = Schema.from_json(json.dumps(request.schema))
    if request.read_version is None:
        if _log_write.needs_log_writer(request) or _custom_properties(request):
            # delta-rs creates a table with files only when every property is a Delta one
            # (CTAS ... TBLPROPERTIES ('owner.team' = ...)): the log writer, one commit.
            return _log_write.commit_write(request)
        if _create_with_own_protocol(request):
            return CommitResult(0, False, len(request.adds))
        # delta-rs names a first write CREATE TABLE; delta-spark's WRITE also records the
        # partition columns, which readers of the history look for.
        parameters = {
            "partitionBy": json.dumps(list(request.partition_columns), separators=(",", ":"))
        }
        properties = commit_properties(request, parameters)
        try:
            create_table_with_add_actions(
                location,
                schema,
                [a.to_action() for a in request.adds],
                mode="error",
                partition_by=list(request.partition_columns) or None,
                configuration=request.configuration or None,
                description=request.description,
                storage_options=request.storage_options,
                commit_properties=properties,
                post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
            )
            return CommitResult(0, False, len(request.adds))
        except DeltaError as exc:
            if "already exists" not in str(exc).lower():
                raise
            raise TableAlreadyExistsError(
                f"Table {request.table_uri} was created by another writer while this write ran."
                " Retry the write: it will append to (or overwrite) the new table.",
                table_uri=request.table_uri,
            ) from exc
    if (
        request.read is not None
        or request.replace_table
        or request.identity_generated
        or request.clustering_columns is not None
        or request.evolves_in_commit
        or (request.new_columns and _conditional_put.supported(request.table_uri))
        or request.replace_partitioning
    ):
        # mergeSchema's new columns go in the data's own commit, as delta-spark commits
        # them; delta-rs below cannot change the schema inside a write transaction.
        return _log_write.commit_write(request)

    # Appends are blind and commit on the newest version. Anything that removes files
    # commits against the version it read, so delta-rs checks every commit since then
    # for conflicts (e.g. an append that an overwrite would silently drop).
    pinned = request.mode == "overwrite" or bool(request.removes)
    table = request.table
    if table is None or (pinned and table.version() != request.read_version):
        table = DeltaTable(
            location,
            version=request.read_version if pinned else None,
            storage_options=request.storage_options,
        )
    if Protocol.of(table.protocol()).delta_rs_unwritable:
        return _log_write.commit_write(request)
    if request_committed(table, request):
        log.info(
            "skipping commit to %s: app transaction %s/%s is already recorded",
            request.table_uri,
            request.app_id,
            request.app_version,
        )
        return CommitResult(None, True, 0)
    if request.new_columns:
        from deltalake.schema import Field as DeltaField

        fields = [DeltaField.from_json(json.dumps(f)) for f in request.new_columns]
        # Only on a store without put-if-absent (no log writer there): delta-rs cannot
        # change the schema inside a write transaction, so the new columns land one
        # commit earlier; readers of that version see them empty.
        table.alter.add_columns(fields, post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF)
        table = DeltaTable(location, storage_options=request.storage_options)
        _log_upkeep.after_commit(
            request.table_uri,
            table.version(),
            configuration=table.metadata().configuration,
            storage_options=request.storage_options,
        )
    now_ms = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [a.to_action() for a in request.adds]
    actions.extend(r.to_action(now_ms) for r in request.removes)
    if pinned:
        # delta-rs misses a concurrent compaction's removes (see _compaction_lease): the
        # lease keeps compactions out while this checks for them and commits.
        with _compaction_lease.holding(request.table_uri, LEASE_WAIT_SECONDS) as held:
            if not held:
                raise busy_error(request)
            table = past_compactions(request, table, location)
            outcome = _transact(request, table, actions, schema, properties, pinned=True)
    else:
        outcome = _transact(request, table, actions, schema, properties, pinned=False)
    if isinstance(outcome, CommitResult):
        return outcome
    table = outcome
    # delta-rs does not hand back the version it committed; the newest one is ours unless
    # another writer raced in right after, which only makes the reported number later.
    version = _latest_version(location, request, table)
    configuration = dict(table.metadata().configuration)
    return CommitResult(version, False, len(request.adds), configuration)


def _custom_properties(request: CommitRequest) -> bool:
    return any(not key.lower().startswith("delta.") for key in request.configuration or {})


def _transact(
    request: CommitRequest,
    table: DeltaTable,
    actions: list[AddAction | RemoveAction],
    schema: Schema,
    properties: CommitProperties,
    *,
    pinned: bool,
) -> DeltaTable | CommitResult:
    """delta-rs's write transaction, blind appends rebased over concurrent deletes; the
    table it committed on, or the result of a commit found to be a duplicate."""
    from deltaflow.table import _log_write

    location = _uri.delta_rs_uri(request.table_uri)
    rebases = 0
    while True:
        try:
            table.create_write_transaction(
                actions,
                request.mode,
                schema,
                list(request.partition_columns) or None,
                commit_properties=properties,
                # Checkpoints and log cleanup run in after_commit, at delta-spark's versions.
                post_commithook_properties=_log_upkeep.DELTA_RS_HOOKS_OFF,
            )
            return table
        except CommitFailedError as exc:
            kind = conflict_kind(str(exc))
            # delta-rs judges a blind append against the version it loaded as if it had
            # read every file, so a concurrent DELETE / UPDATE / MERGE fails it
            # (ConcurrentDeleteRead) on each of its retries. A blind append read nothing:
            # it commits on the newest version instead (its app transaction checked again).
            unsupported = _log_write.from_delta_rs(exc, request.table_uri, request.operation)
            if unsupported is not None:  # a feature delta-rs cannot write, not a conflict
                raise unsupported from exc
            if pinned or kind != "ConcurrentDeleteRead" or rebases >= MAX_APPEND_REBASES:
                raise conflict_error(request, kind, exc) from exc
            rebases += 1
            table = DeltaTable(location, storage_options=request.storage_options)
            if request_committed(table, request):
                return CommitResult(None, True, 0)


def _create_with_own_protocol(request: CommitRequest) -> bool:
    """Version 0 by deltaflow's log writer when delta-rs would list unused features."""
    protocol = protocol_for_new_table(request.configuration, request.schema)
    if protocol is None or not _conditional_put.supported(request.table_uri):
        return False
    created = _log_commit.create_table(
        request.table_uri,
        schema=request.schema,
        partition_columns=request.partition_columns,
        configuration=request.configuration,
        protocol=protocol.to_action(),
        adds=[a.to_log_action() for a in request.adds],
        description=request.description,
        operation="WRITE",
        operation_parameters={
            "mode": "ErrorIfExists",
            "partitionBy": json.dumps(list(request.partition_columns)),
        },
    )
    if not created:
        raise TableAlreadyExistsError(
            f"Table {request.table_uri} was created by another writer while this write ran."
            " Retry the write: it will append to (or overwrite) the new table.",
            table_uri=request.table_uri,
        )
    return True


def _latest_version(
    location: str, request: CommitRequest, table: DeltaTable | None = None
) -> int | None:
    # Never raise once the commit is in: the caller would treat the write as failed and
    # delete files the log now references.
    try:
        if table is not None:
            # Reads only the commits after the table's version: ~1 ms instead of a log
            # replay (~20 ms per streaming micro-batch on a 100-version table).
            catch_up(table, request.table_uri)
            return int(table.version())
        return latest_version(request.table_uri, request.storage_options)
    except Exception:
        log.warning("committed to %s but could not read back the version", request.table_uri)
        return None
