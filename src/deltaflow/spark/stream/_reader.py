"""Streaming reads: ``spark.readStream.format("delta").load(uri)``.

Offsets follow delta-spark's model: ``reservoirVersion`` (a table version),
``index`` (a position inside that version) and ``isStartingVersion`` (whether the
version is the initial snapshot). A stream first reads the snapshot as of its start,
file by file in a fixed order, then each later commit's ``add`` actions with
``dataChange=true``, in log order. An offset means "every file up to and including
this position has been read"; index -1 is the start of a version, so a fully read
version ``v`` is written ``(v + 1, -1)``.

Where things run: ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit``
are called on one long-lived reader in a Python worker on the driver, so the reader
caches the commits it has parsed there. ``read`` runs in executors on a separately
built reader and only uses what its :class:`StreamPartition` carries.

Delivery: Spark records an offset range in the checkpoint before the batch runs and
replays the same range after a crash; ``partitions(start, end)`` is a pure function
of the two offsets and the (immutable) log, so a replayed batch reads the same files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from deltaflow.errors import carry_errors
from deltaflow.spark._compat import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
    legacy_latest_offset,
)
from deltaflow.spark._options import StreamReadOptions
from deltaflow.spark.errors import (
    ChangeCommitError,
    LogVersionMissingError,
    SourceSchemaChangedError,
    SourceTableReplacedError,
)
from deltaflow.spark.read._cdf import (
    ChangePartition,
    ChangeTask,
    change_layout,
    change_partitions,
    change_task,
    read_changes,
)
from deltaflow.spark.read._reader import FileTask, ReadLayout, bin_pack, read_tasks
from deltaflow.spark.stream._positions import (
    Budget,
    CommitActions,
    LogFile,
    Offset,
    VersionEnd,
)
from deltaflow.table import _cdf, _deletion_vectors, _log, _reader_leases, _schema, _uri
from deltaflow.table._snapshot import Snapshot, load_snapshot, parse_timestamp
from deltaflow.table.errors import TableNotFoundError

log = logging.getLogger("deltaflow.stream")

# Commits without data for the stream (OPTIMIZE, skipped change commits, metadata) do
# not move the offset by themselves: an offset change costs Spark an empty micro-batch.
# After this many such commits in a row the offset moves anyway, so that a stream over
# a table that only gets compacted does not fall behind log cleanup.
EMPTY_VERSIONS_BEFORE_ADVANCE = 100
# Parsed commits kept in memory between batches; older ones are dropped on commit().
MAX_CACHED_COMMITS = 10_000


class StreamPartition(InputPartition):
    """The files one Spark task of a micro-batch reads, and how to shape them."""

    def __init__(self, index: int, files: list[FileTask], layout: ReadLayout) -> None:
        super().__init__(index)
        self.index = index
        self.files = files
        self.layout = layout


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over a Delta table's snapshot and then its new commits.

    Built from the snapshot pinned when the query started: its schema is the
    stream's schema for the whole run (a restart picks up additive changes).
    Construction does no I/O, because Spark also builds a reader in every planning
    worker just to ship ``read`` to executors.
    """

    def __init__(self, snapshot: Snapshot, schema: StructType, options: StreamReadOptions) -> None:
        self.snapshot = snapshot
        self.uri = snapshot.uri
        self.schema_json = schema.jsonValue()
        self.options = options
        self._table_id: str | None = None
        self._cap: int | None = None  # availableNow: the last version to read
        self._known_latest = snapshot.version  # versions up to here must exist
        self._commits: dict[int, CommitActions] = {}
        self._snapshot_files: tuple[int, list[LogFile]] | None = None
        self._layout: ReadLayout | None = None
        self._timestamps: _cdf.CommitTimestamps | None = None
        self._snapshot_timestamp: tuple[int, int] | None = None
        self._partition_parser: _log.PartitionParser | None = None
        # VACUUM keeps what this reader still needs while it runs (table/_reader_leases);
        # made on the first offset call, so the readers Spark builds to ship read() to
        # executors hold none.
        self._lease: _reader_leases.LeaseHolder | None = None

    # ---- Spark's API -------------------------------------------------------------------

    @carry_errors
    def initialOffset(self) -> dict[str, Any]:
        start = self._starting_offset()
        log.info("stream over %s starts at %s", self.uri, start)
        return start.to_json(self.table_id)

    def getDefaultReadLimit(self) -> ReadLimit:
        # Spark hands this back to latestOffset unless a trigger needs everything
        # (ReadAllAvailable); maxBytesPerTrigger applies alongside it there.
        return ReadMaxFiles(self.options.max_files_per_trigger)

    @carry_errors
    def prepareForTriggerAvailableNow(self) -> None:
        self._cap = self._latest_version()
        log.info("availableNow over %s: reading up to version %d", self.uri, self._cap)

    @legacy_latest_offset
    @carry_errors
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = self._parse(start)
        if isinstance(limit, ReadAllAvailable):
            budget = Budget(None, None)
        else:
            budget = Budget(self.options.max_files_per_trigger, self.options.max_bytes_per_trigger)
        if begin.is_unresolved:
            first = self._first_offset(begin, budget)
            # The first batch reads the snapshot of (or the commits after) the version
            # before its end.
            self._hold(first.version if first.is_starting else first.version - 1)
            return first.to_json(self.table_id)
        self._hold(begin.version)
        end, admitted, skipped, pending = begin, 0, 0, begin
        whole_version: int | None = None  # readChangeFeed: the commit admitted as a whole
        for item in self._walk(begin, last_version=self._cap):
            if isinstance(item, VersionEnd):
                pending = Offset(item.version + 1, -1)
                if admitted:
                    end = pending
                else:
                    skipped += 1
                continue
            if self.options.read_change_feed and not item.is_starting:
                if item.version != whole_version:
                    commit = self._commit_actions(item.version)
                    sizes = [f.size for f in commit.changes] if commit else [item.size]
                    if not budget.admit_all(sizes):
                        break
                    whole_version = item.version
            elif not budget.admit(item.size):
                break
            admitted += 1
            end = item.offset
        if not admitted and skipped >= EMPTY_VERSIONS_BEFORE_ADVANCE:
            end = pending
        return end.to_json(self.table_id)

    @carry_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        files = self._files_between(start, end)
        if self.options.read_change_feed:
            changes = [self._change_task(f) for f in files]
            layout = change_layout(self.snapshot, StructType.fromJson(self.schema_json))
            return change_partitions(self.uri, changes, layout)
        tasks = [self._task(f) for f in files]
        layout = self._read_layout()
        groups = bin_pack(tasks, os.cpu_count() or 2)
        return [StreamPartition(i, group, layout) for i, group in enumerate(groups)]

    def tasks(self, start: dict[str, Any], end: dict[str, Any]) -> list[FileTask]:
        """The files of the batch ``start`` -> ``end``, in stream order (the connector's
        ``planInputPartitions``; not for change-feed streams)."""
        return [self._task(f) for f in self._files_between(start, end)]

    def backlog(self, offset: dict[str, Any]) -> tuple[int, int]:
        """Files and bytes committed after ``offset`` and not read yet (delta-spark's
        ``numFilesOutstanding`` / ``numBytesOutstanding``)."""
        files = size = 0
        for item in self._walk(self._parse(offset), last_version=None):
            if isinstance(item, LogFile):
                files += 1
                size += item.size
        return files, size

    def _files_between(self, start: dict[str, Any], end: dict[str, Any]) -> list[LogFile]:
        begin, stop = self._parse(start), self._parse(end)
        if begin.is_unresolved:
            if not begin.is_starting:  # startingVersion=latest: the first batch is empty
                return []
            version = stop.version if stop.is_starting else stop.version - 1
            begin = Offset(version, -1, True)
        self._hold(begin.version)  # a batch replayed after a restart, before latestOffset
        last_version = stop.version if stop.index >= 0 else stop.version - 1
        files: list[LogFile] = []
        for item in self._walk(begin, last_version=last_version):
            if isinstance(item, LogFile):
                if item.offset > stop:
                    break
                files.append(item)
        log.info(
            "stream batch over %s: %s -> %s, %d files, %d bytes",
            self.uri,
            begin,
            stop,
            len(files),
            sum(f.size for f in files),
        )
        return files

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, ChangePartition):
            yield from read_changes(partition)
            return
        assert isinstance(partition, StreamPartition)
        yield from read_tasks(self.uri, partition.files, partition.layout)

    @carry_errors
    def commit(self, end: dict[str, Any]) -> None:
        done = self._parse(end)
        self._hold(done.version)
        for version in [v for v in self._commits if v < done.version]:
            del self._commits[version]
        if not done.is_starting:
            self._snapshot_files = None

    def stop(self) -> None:
        """The query stopped cleanly: give up the lease (VACUUM no longer keeps files
        for this reader; a restarted query takes a new one)."""
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lease"] = None  # the lease belongs to the driver's long-lived reader
        return state

    def _hold(self, version: int) -> None:
        """This reader may still read ``version`` and later ones: VACUUM keeps their files
        while the query runs (writes the lease only when it must, see LeaseHolder.need)."""
        if self._lease is None:
            timeout = _reader_leases.timeout_seconds(self.snapshot.configuration)
            self._lease = _reader_leases.LeaseHolder(self.uri, timeout, f"stream over {self.uri}")
        self._lease.need(max(version, 0))

    # ---- offsets -----------------------------------------------------------------------

    @property
    def table_id(self) -> str:
        if self._table_id is None:
            self._table_id = str(self.snapshot.delta_table.metadata().id)
        return self._table_id

    def _parse(self, raw: dict[str, Any]) -> Offset:
        found = str(raw.get("reservoirId", ""))
        if found and found != self.table_id:
            raise SourceTableReplacedError(
                f"The checkpoint of this stream was reading table id {found}, but the table at"
                f" {self.uri} now has id {self.table_id}: it was dropped and re-created. Start"
                " the query with a new checkpointLocation to read the new table.",
                table_uri=self.uri,
                expected_id=found,
                found_id=self.table_id,
            )
        return Offset(
            int(raw["reservoirVersion"]), int(raw["index"]), bool(raw["isStartingVersion"])
        )

    def _starting_offset(self) -> Offset:
        opts = self.options
        if opts.starting_version == "latest":
            return Offset(-1, -1, False)  # resolved by the first latestOffset
        if isinstance(opts.starting_version, int):
            self._check_feed_recorded_at(opts.starting_version)
            return Offset(opts.starting_version, -1)
        if opts.starting_timestamp is not None:
            version = self._version_at_or_after(opts.starting_timestamp)
            self._check_feed_recorded_at(version)
            return Offset(version, -1)
        return Offset(-1, -1, True)  # the snapshot, at the version the first batch finds

    def _check_feed_recorded_at(self, version: int) -> None:
        """readChangeFeed from ``version``: the feed must be on there (delta-spark checks
        the start version's metadata; later commits that turn it off fail when reached)."""
        if not self.options.read_change_feed or version > self._latest_version():
            return
        config = (
            self.snapshot.configuration
            if version == self.snapshot.version
            else load_snapshot(
                self.uri,
                version=version,
                storage_options=self.snapshot.storage_options,
                check_readable=False,
            ).configuration
        )
        if not _cdf.cdf_enabled(config):
            raise _cdf.not_recorded(self.uri, version, version, version)

    def _first_offset(self, begin: Offset, budget: Budget) -> Offset:
        """The end of a fresh query's first batch: this pins its start version.

        The first batch stops at the end of the snapshot so that ``partitions`` can
        tell the snapshot's version from the end offset alone.
        """
        latest = self._cap if self._cap is not None else self._latest_version()
        if not begin.is_starting:
            return Offset(latest + 1, -1)
        end = Offset(latest + 1, -1)
        for item in self._walk(Offset(latest, -1, True), last_version=latest):
            if isinstance(item, LogFile):
                if not budget.admit(item.size):
                    break
                end = item.offset
            else:
                end = Offset(latest + 1, -1)
        return end

    def _version_at_or_after(self, timestamp: str) -> int:
        wanted = int(parse_timestamp(timestamp).timestamp() * 1000)
        history = self.snapshot.history()
        commits = sorted((c["version"], c["timestamp"]) for c in history if "version" in c)
        for version, ts in commits:
            if ts >= wanted:
                return int(version)
        return self.snapshot.version + 1

    # ---- the log -----------------------------------------------------------------------

    def _walk(self, start: Offset, *, last_version: int | None) -> Iterator[LogFile | VersionEnd]:
        """Every file after ``start`` in stream order, with a marker after each version."""
        version, after = start.version, start.index
        if start.is_starting:
            for entry in self._snapshot(version):
                if entry.index > after:
                    yield entry
            yield VersionEnd(version)
            version, after = version + 1, -1
        while last_version is None or version <= last_version:
            commit = self._commit_actions(version)
            if commit is None:
                return
            for entry in self._admissible(commit):
                if entry.index > after:
                    yield entry
            yield VersionEnd(version)
            version, after = version + 1, -1

    def _admissible(self, commit: CommitActions) -> tuple[LogFile, ...]:
        self._check_schema(commit)
        if self.options.read_change_feed:
            if commit.cdf_enabled is False:
                raise _cdf.not_recorded(self.uri, commit.version, commit.version, commit.version)
            return commit.changes
        if not commit.removes_data:
            return commit.files
        if self.options.skip_change_commits:
            return ()
        if self.options.ignore_deletes and not commit.files:
            return ()
        raise ChangeCommitError(
            f"Version {commit.version} of the source table {self.uri} removed or rewrote data"
            " (UPDATE, DELETE, MERGE or overwrite), which this stream cannot pass on. To skip"
            " such commits and read only appends, restart the query with"
            " .option('skipChangeCommits', 'true'); to ignore commits that only delete data,"
            " use .option('ignoreDeletes', 'true').",
            table_uri=self.uri,
            version=commit.version,
        )

    def _check_schema(self, commit: CommitActions) -> None:
        if commit.schema is None:
            return
        current = _schema.logical_schema(self.snapshot.schema)
        changed = _schema.logical_schema(commit.schema)
        problems = _schema.struct_mismatches(changed, current, allow_new=False)
        if commit.version > self.snapshot.version:
            # A later schema lacks a column the stream reads: dropped, or renamed under
            # column mapping (an older commit's schema lacks the columns added since).
            gone = _schema.struct_mismatches(current, changed, allow_new=False)
            problems += [
                f"{p.split(' (new column')[0]} (dropped or renamed)"
                for p in gone
                if "(new column" in p
            ]
        partitions_changed = commit.partition_columns is not None and tuple(
            p.lower() for p in commit.partition_columns
        ) != tuple(p.lower() for p in self.snapshot.partition_columns)
        if not problems and not partitions_changed:
            return
        additive = not partitions_changed and all("new column" in p for p in problems)
        advice = (
            "Restart the query to read the new columns."
            if additive
            else "The stream cannot read on with its schema: start it again with a new"
            " checkpointLocation (and startingVersion) once the change is settled."
        )
        raise SourceSchemaChangedError(
            f"Version {commit.version} of the source table {self.uri} changed its schema"
            f" ({'; '.join(problems) or 'partition columns changed'}). {advice}",
            table_uri=self.uri,
            version=commit.version,
            additive=additive,
        )

    def _snapshot(self, version: int) -> list[LogFile]:
        if self._snapshot_files is not None and self._snapshot_files[0] == version:
            return self._snapshot_files[1]
        snapshot = load_snapshot(
            self.uri, version=version, storage_options=self.snapshot.storage_options
        )
        if self.options.read_change_feed and not _cdf.cdf_enabled(snapshot.configuration):
            raise _cdf.not_recorded(self.uri, version, version, version)
        deleted = snapshot.deleted_rows()
        entries = sorted(snapshot.files(stats=False), key=lambda e: (e.modification_time, e.path))
        files = [
            LogFile(version, i, True, e.path, e.size, e.partition_values, None, deleted.get(e.path))
            for i, e in enumerate(entries)
        ]
        self._snapshot_files = (version, files)
        return files

    def _latest_version(self) -> int:
        version = self._known_latest
        while self._commit_actions(version + 1) is not None:
            version += 1
        return version

    def _commit_actions(self, version: int) -> CommitActions | None:
        """The parsed commit ``version``, or None when it does not exist yet."""
        cached = self._commits.get(version)
        if cached is not None:
            return cached
        text = _log.read_commit_text(self.uri, version)
        if text is None:
            self._raise_if_cleaned_up(version)
            return None
        commit = self._parse_commit(version, text)
        if len(self._commits) < MAX_CACHED_COMMITS:
            self._commits[version] = commit
        self._known_latest = max(self._known_latest, version)
        return commit

    def _raise_if_cleaned_up(self, version: int) -> None:
        # Log cleanup only deletes commits older than the newest checkpoint, so a missing
        # commit at or below it (or below a version already seen) is gone for good.
        checkpoint = _log.last_checkpoint(self.uri)
        if version > self._known_latest and (checkpoint is None or version > checkpoint):
            if checkpoint is None:
                self._raise_if_deleted()
            return
        raise LogVersionMissingError(
            f"The stream over {self.uri} needs version {version}, but its commit file was"
            f" removed by log cleanup (the latest checkpoint is at version {checkpoint}). The"
            " stream fell behind the table's log retention (delta.logRetentionDuration)."
            " Restart it with a new checkpointLocation, and startingVersion set to a version"
            " still in the log, accepting the gap; or raise the retention for the future.",
            table_uri=self.uri,
            version=version,
            earliest=None if checkpoint is None else checkpoint,
        )

    def _raise_if_deleted(self) -> None:
        # A table's log never goes away while the table lives; without it, the stream
        # would wait for commits that cannot come.
        fs, root = _uri.filesystem(self.uri)
        if fs.get_file_info(f"{root}/_delta_log").type == pafs.FileType.NotFound:
            raise TableNotFoundError(
                f"The source table of this stream, {self.uri}, was deleted (its _delta_log is"
                " gone). If it was recreated, start the stream again with a new"
                " checkpointLocation; otherwise stop the query.",
                table_uri=self.uri,
            )

    def _parse_commit(self, version: int, text: str) -> CommitActions:
        actions = _log.parse_commit_text(text)
        if self._partition_parser is None:
            self._partition_parser = _log.PartitionParser(self.snapshot.schema)
        data = _log.data_changes(actions, self._partition_parser)
        files = tuple(
            LogFile(
                version,
                a.index,
                False,
                a.path,
                a.size,
                a.partition_values,
                a.deletion_vector,
                row_log=a.row_log,
            )
            for a in data.adds
        )
        if not self.options.read_change_feed:
            return CommitActions(
                version, files, data.removes_data, data.schema, data.partition_columns
            )
        commit = _cdf.commit_changes(
            version,
            actions,
            self._commit_timestamp(version),
            self._partition_parser,
            table_uri=self.uri,
            partition_columns=self.snapshot.partition_columns,
        )
        changes = tuple(
            LogFile(version, c.index, False, c.path, c.size, c.partition_values, change=c)
            for c in commit.changes
        )
        return CommitActions(
            version,
            files,
            data.removes_data,
            data.schema,
            data.partition_columns,
            changes,
            commit.cdf_enabled,
        )

    def _commit_timestamp(self, version: int) -> int:
        """``_commit_timestamp`` of ``version`` without an in-commit timestamp: the commit
        file's modification time, monotonized (see ``table/_cdf.py``)."""
        if self._timestamps is None:
            self._timestamps = _cdf.CommitTimestamps(self.uri)
        return self._timestamps.get(version) or 0

    # ---- tasks -------------------------------------------------------------------------

    def _task(self, entry: LogFile) -> FileTask:
        deleted = entry.deleted_rows
        if entry.deletion_vector is not None:
            descriptor = _deletion_vectors.DeletionVectorDescriptor.from_json(entry.deletion_vector)
            deleted = _deletion_vectors.read_deleted_rows(self.uri, descriptor).astype(np.int64)
        uri = _uri.join(self.uri, entry.path)
        return FileTask(
            uri=uri, size=entry.size, partition_values=entry.partition_values, deleted_rows=deleted
        )

    def _change_task(self, entry: LogFile) -> ChangeTask:
        if entry.change is not None:
            return change_task(self.uri, entry.change)
        # A file of the initial snapshot: an insert at the snapshot's version.
        if self._snapshot_timestamp is None or self._snapshot_timestamp[0] != entry.version:
            actions = _log.read_commit(self.uri, entry.version) or []
            timestamp = _cdf.in_commit_timestamp(actions) or self._commit_timestamp(entry.version)
            self._snapshot_timestamp = (entry.version, timestamp)
        return ChangeTask(
            self._task(entry), "add", entry.version, self._snapshot_timestamp[1], entry.path
        )

    def _read_layout(self) -> ReadLayout:
        if self._layout is None:
            self._layout = ReadLayout.build(self.snapshot, StructType.fromJson(self.schema_json))
        return self._layout
