"""The storage side of one served table: a group's Parquet files and its one Delta
commit (:class:`TableWriter`, on the table's commit thread), the idempotency keys
recovered from the log, and what ``GET /tables`` says of a table. The delivery contract
is in :mod:`._commit`, which groups requests and calls :meth:`TableWriter.commit_group`.

Object stores (``s3://``): the same path with no local state at all (no WAL, no lock
file, no rename). A group's Parquet files are PUT first, each visible whole or not at all;
then delta-rs writes the log entry with a conditional put (``If-None-Match: *``), so a
concurrent writer that took the version makes delta-rs retry at the next one rather than
overwrite it. The acknowledgement follows that put: the store has the commit once it
answered. Nothing is fsynced (there is nothing local to sync).

A commit that fails is checked against the log before it is reported: if the group's id
is in a commit after all (e.g. the failure came after the log entry was written), the
requests succeed. Otherwise its files are deleted and its requests fail with a
retryable error; nothing of the group is in the table.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema

from deltaflow.ingest.http import _schema_change
from deltaflow.ingest.http._config import ServeConfig, TableConfig
from deltaflow.ingest.http.errors import IngestCommitError, ServeConfigError
from deltaflow.table import _auto_compact, _commit, _generated, _partitions, _stats, _uri
from deltaflow.table._snapshot import catch_up, commit_history, load_snapshot, table_exists
from deltaflow.table.errors import ConcurrentWriteError, UnsupportedFeatureError

log = logging.getLogger("deltaflow.serve")

_AUTO_COMPACT = _auto_compact.AutoCompactSettings(background=True, stream=True)
# Conflicts a group's blind append resolves by committing again on the new version.
_METADATA_CONFLICTS = frozenset({"MetadataChanged", "ProtocolChanged"})

COMMIT_INFO_KEY = "deltaflow.ingest"


class TableWriter:
    """The storage side of one table: files, commits, key recovery. One thread only."""

    def __init__(self, config: TableConfig, server: ServeConfig) -> None:
        self.config = config
        self._local = _uri.is_local(config.uri)
        # Object stores: durable once the conditional put of the log entry succeeded.
        self.fsync = server.fsync and self._local
        self._location = _uri.delta_rs_uri(config.uri)
        self.table = self._open()
        snapshot = load_snapshot(config.uri)
        if snapshot.column_mapping_mode != "none":
            raise UnsupportedFeatureError(
                f"{config.uri} uses column mapping, which HTTP ingest does not write yet."
                " Serve a table without delta.columnMapping.mode.",
                table_uri=config.uri,
                feature="columnMapping",
            )
        if _generated.identity_columns(snapshot.schema):
            # Ingest writes rows as they come: it would commit NULL identity values.
            raise UnsupportedFeatureError(
                f"{config.uri} has identity columns"
                f" ({', '.join(c.name for c in _generated.identity_columns(snapshot.schema))}),"
                " whose values HTTP ingest does not generate yet. Serve a table without"
                " GENERATED ... AS IDENTITY columns (send the key in the events instead).",
                table_uri=config.uri,
                feature="identityColumns",
            )
        self._check_commit_route()
        self.partition_by = snapshot.partition_columns
        self.num_indexed = _stats.num_indexed_cols(snapshot.configuration)
        self.delta_schema: Schema = self.table.schema()
        self.schema_json: dict[str, Any] = json.loads(self.delta_schema.to_json())
        # Read by the event loop (parsers follow it), replaced by this writer's thread.
        self.arrow_schema = pa.schema(self.delta_schema.to_arrow())
        self._check_configured_schema(snapshot.schema)
        # Set when another writer changed the schema in a way serve cannot follow.
        self._schema_refusal: str | None = None

    def _open(self) -> DeltaTable:
        config = self.config
        if not table_exists(config.uri):
            if not config.create or config.schema is None:
                raise ServeConfigError(
                    f"table {config.name!r}: there is no Delta table at {config.uri}. Give"
                    " the table a 'schema' (and leave 'create' true) to create it, or fix"
                    " 'path'.",
                    option="path",
                )
            DeltaTable.create(
                self._location,
                Schema.from_json(json.dumps(config.schema)),
                partition_by=list(config.partition_by) or None,
                mode="ignore",
            )
            log.info("created table %s at %s", config.name, config.uri)
        return DeltaTable(self._location)

    def _check_commit_route(self) -> None:
        """Refuse at start-up, not at the first request (as a retryable 503 every time), a
        table whose commits need deltaflow's log writer where that writer cannot commit
        (clustering on a store without a conditional put, e.g. HDFS)."""
        from deltaflow.table import _log_write
        from deltaflow.table._protocol import Protocol

        protocol = Protocol.of(self.table.protocol())
        if protocol.delta_rs_unwritable:
            _log_write.require_conditional_put(self.config.uri, protocol, "deltaflow serve")

    def _check_configured_schema(self, existing: dict[str, Any]) -> None:
        wanted = self.config.schema
        if wanted is None:
            return
        have = {f["name"]: f["type"] for f in existing["fields"]}
        want = {f["name"]: f["type"] for f in wanted["fields"]}
        if have != want or (
            self.config.partition_by and tuple(self.config.partition_by) != self.partition_by
        ):
            raise ServeConfigError(
                f"table {self.config.name!r}: the configured schema/partitioning differs from"
                f" the existing table at {self.config.uri} (table columns: "
                f"{', '.join(f'{k} {json.dumps(v)}' for k, v in have.items())}; partitioned"
                f" by {list(self.partition_by)}). Remove 'schema' from the configuration to"
                " serve the table as it is, or point 'path' elsewhere.",
                option="schema",
            )

    # ---- idempotency keys ------------------------------------------------------------

    def recover_keys(self, limit: int) -> list[tuple[str, int, int]]:
        """``(key, version, rows)`` recorded in the latest ``limit`` commits, oldest first."""
        if limit <= 0:
            return []
        found: list[tuple[str, int, int]] = []
        for info in reversed(commit_history(self.table, self.config.uri, limit)):
            marker = _marker(info)
            if marker is None:
                continue
            version = int(info["version"])
            found.extend((str(k), version, int(rows)) for k, rows in marker.get("keys", []))
        return found

    # ---- commits ---------------------------------------------------------------------

    def commit_group(self, tables: list[pa.Table], keys: list[tuple[str, int]]) -> int:
        """Write ``tables`` as files and commit them once; returns the commit's version."""
        if self._schema_refusal is not None:
            raise IngestCommitError(
                self._schema_refusal, table=self.config.name, table_uri=self.config.uri
            )
        group = uuid.uuid4().hex
        # Requests parsed before an ADD COLUMNS was taken lack the new columns: NULL there.
        conformed = [_schema_change.conform(t, self.arrow_schema) for t in tables]
        combined = pa.concat_tables(conformed) if len(conformed) > 1 else conformed[0]
        files = self._write_files(combined, group)
        marker = json.dumps({"group": group, "keys": keys}, separators=(",", ":"))
        before = self.table.version()
        try:
            try:
                self._commit_files(files, marker, before)
            except ConcurrentWriteError as exc:
                # Another writer changed the metadata or protocol (ALTER TABLE ... SET
                # TBLPROPERTIES): delta-rs refuses a commit read before it. The files
                # are blind appends, so they commit as they are on the new version.
                if (
                    getattr(exc, "kind", None) not in _METADATA_CONFLICTS
                    or self._find_group(group, before) is not None
                ):
                    raise
                log.info("table %s: metadata changed under serve; recommitting", self.config.name)
                self._refresh()
                if self._schema_refusal is not None:
                    raise IngestCommitError(
                        self._schema_refusal, table=self.config.name, table_uri=self.config.uri
                    ) from exc
                before = self.table.version()
                self._commit_files(files, marker, before)
        except Exception as exc:
            version = self._find_group(group, before)
            if version is not None:
                log.warning("commit of group %s raised but is in the log: %s", group, exc)
                return version
            _delete(self.config.uri, files)
            if isinstance(exc, IngestCommitError):
                raise
            raise IngestCommitError(
                f"could not commit to table {self.config.name!r} ({self.config.uri}): {exc}."
                " Nothing of this request was written; retry it (with the same"
                " Idempotency-Key).",
                table=self.config.name,
                table_uri=self.config.uri,
            ) from exc
        version = self._find_group(group, before)
        if version is None:  # cannot happen unless the log was rewritten under us
            raise IngestCommitError(
                f"committed to {self.config.uri} but cannot find the commit in the log",
                table=self.config.name,
                table_uri=self.config.uri,
            )
        if self.fsync:
            log_dir = os.path.join(_uri.local_path(self.config.uri), "_delta_log")
            _fsync_path(os.path.join(log_dir, f"{version:020d}.json"))
            _fsync_path(log_dir)
        return version

    def _commit_files(self, files: list[_commit.AddedFile], marker: str, read_version: int) -> None:
        request = _commit.CommitRequest(
            table_uri=self.config.uri,
            schema=self.schema_json,
            partition_columns=self.partition_by,
            adds=files,
            read_version=read_version,
            commit_info={COMMIT_INFO_KEY: marker},
            table=self.table,
            # Acknowledgements wait for the commit: a compaction the table asks for
            # (delta.autoOptimize.autoCompact) runs on a background thread instead.
            auto_compact=_AUTO_COMPACT,
        )
        # delta-rs, or deltaflow's log writer for tables delta-rs cannot write (identity
        # columns, clustering): _commit routes by the table's features.
        _commit.commit(request)

    def _refresh(self) -> None:
        """Take the table's new metadata and protocol (another writer's ALTER)."""
        catch_up(self.table, self.config.uri)
        snapshot = load_snapshot(self.config.uri)
        self._check_commit_route()
        self.num_indexed = _stats.num_indexed_cols(snapshot.configuration)
        self._adopt_schema()

    def refresh_schema(self) -> bool:
        """Look for columns another writer added since the last commit (ALTER TABLE ...
        ADD COLUMNS); True when the schema changed and parsers should follow."""
        catch_up(self.table, self.config.uri)
        return self._adopt_schema()

    def _adopt_schema(self) -> bool:
        """Serve the table's current schema when it only adds nullable columns to the
        one served; otherwise refuse every further commit (the data would be written
        with the old types) with a message that says to restart."""
        schema = self.table.schema()
        fields = json.loads(schema.to_json())
        if fields == self.schema_json:
            return False
        arrow = pa.schema(schema.to_arrow())
        problem = _schema_change.why_not_followed(self.schema_json, fields, arrow, self.config.uri)
        if problem is not None:
            self._schema_refusal = (
                f"the schema of table {self.config.name!r} ({self.config.uri}) was changed by"
                f" another writer in a way a running serve cannot follow: {problem}. Nothing"
                " of this request was written; restart deltaflow serve to serve the new"
                " schema, then retry."
            )
            log.error("%s", self._schema_refusal)
            return False
        served = {f["name"] for f in self.schema_json["fields"]}
        added = [f["name"] for f in fields["fields"] if f["name"] not in served]
        self.delta_schema, self.schema_json, self.arrow_schema = schema, fields, arrow
        log.info(
            "table %s: serving the columns added by another writer: %s", self.config.name, added
        )
        return True

    def _find_group(self, group: str, before: int) -> int | None:
        """The version after ``before`` whose commit carries ``group``, if any."""
        try:
            catch_up(self.table, self.config.uri)
            latest = self.table.version()
            if latest <= before:
                return None
            for info in commit_history(self.table, self.config.uri, latest - before):
                marker = _marker(info)
                if marker is not None and marker.get("group") == group:
                    return int(info["version"])
        except Exception:
            log.exception("could not read the log of %s to check a commit", self.config.uri)
            raise
        return None

    def _write_files(self, table: pa.Table, group: str) -> list[_commit.AddedFile]:
        files = []
        fs, root = _uri.filesystem(self.config.uri)
        directories: set[str] = set()
        for number, (values, part) in enumerate(self._split(table)):
            data = part.drop_columns(list(self.partition_by)) if self.partition_by else part
            directory = _partitions.partition_dir(list(self.partition_by), values)
            name = f"part-{number:05d}-{group}-c000.snappy.parquet"
            relative = f"{directory}/{name}" if directory else name
            full = f"{root}/{relative}"
            if directory and self._local:
                # Object stores have no directories: a create_dir there would PUT an empty
                # marker object per partition and commit.
                fs.create_dir(f"{root}/{directory}", recursive=True)
            if self.fsync:
                with open(full, "wb") as handle:
                    pq.write_table(data, handle, compression="snappy")
                    handle.flush()
                    os.fsync(handle.fileno())
                    size = handle.tell()
                directories.add(os.path.dirname(full))
            else:
                # On an object store the object appears whole when the stream closes (one
                # PUT, or a completed multipart upload), or not at all.
                with fs.open_output_stream(full) as stream:
                    pq.write_table(data, stream, compression="snappy")
                    size = stream.tell()
            files.append(
                _commit.AddedFile(
                    path=relative,
                    size=size,
                    partition_values=values,
                    modification_time=int(time.time() * 1000),
                    stats=_stats.file_stats(data, self.num_indexed),
                )
            )
        for directory in sorted(directories, key=len, reverse=True):
            _fsync_path(directory)
        if self.fsync and self.partition_by:
            _fsync_path(root)
        return files

    def _split(self, table: pa.Table) -> list[tuple[dict[str, str | None], pa.Table]]:
        columns = list(self.partition_by)
        if not columns:
            return [({}, table)]
        combos = table.select(columns).group_by(columns).aggregate([]).to_pylist()
        parts = []
        for combo in combos:
            mask = None
            for column in columns:
                value = combo[column]
                array = table.column(column)
                if value is None:
                    test = pc.is_null(array)
                else:
                    test = pc.equal(array, pa.scalar(value, type=array.type))
                mask = test if mask is None else pc.and_(mask, test)
            values = {c: _partitions.serialize_partition_value(combo[c]) for c in columns}
            parts.append((values, table.filter(mask)))
        return parts


def describe_table(config: TableConfig) -> dict[str, Any]:
    """Version, row count and last commit of a served table (a fresh snapshot)."""
    snapshot = load_snapshot(config.uri)
    files = snapshot.files()
    rows = sum(f.num_records or 0 for f in files)
    last = snapshot.history(1)
    commit = last[0] if last else {}
    return {
        "name": config.name,
        "uri": config.uri,
        "version": snapshot.version,
        "num_rows": rows,
        "num_files": len(files),
        "partition_columns": list(snapshot.partition_columns),
        "last_commit": {
            "version": commit.get("version", snapshot.version),
            "timestamp_ms": commit.get("timestamp"),
            "operation": commit.get("operation"),
        },
    }


def _marker(info: dict[str, Any]) -> dict[str, Any] | None:
    raw = info.get(COMMIT_INFO_KEY)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _fsync_path(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _delete(table_uri: str, files: list[_commit.AddedFile]) -> None:
    fs, root = _uri.filesystem(table_uri)
    for added in files:
        try:
            fs.delete_file(f"{root}/{added.path}")
        except OSError:
            log.warning("could not delete uncommitted file %s", added.path)
