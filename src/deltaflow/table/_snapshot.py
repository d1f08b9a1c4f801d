"""Snapshots: one consistent version of a Delta table, as delta-rs replays it.

delta-rs does the log replay (JSON commits, classic / multi-part / v2
checkpoints). This module turns its answer into what a Spark scan needs: the
schema as a JSON tree, typed partition values, per-file statistics and the rows
deletion vectors remove.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.exceptions import TableNotFoundError as _DeltaRsTableNotFound

from deltaflow.table import _arrow, _log, _schema, _uri
from deltaflow.table._object_store import object_store_error
from deltaflow.table.errors import TableNotFoundError, UnsupportedFeatureError, VersionNotFoundError

log = logging.getLogger(__name__)

# Reader features whose semantics deltaflow implements (protocol "Table Features").
# typeWidening works because every column is cast to the table type on read.
SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "typeWidening",
        "typeWidening-preview",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        # VARIANT columns are read by the connector (Spark's Parquet reader decodes
        # them); the Python path refuses a table that has one (spark/_bridge_ops.py).
        "variantType",
        "variantType-preview",
    }
)


@dataclass(frozen=True)
class FileEntry:
    """One data file of a snapshot (an ``add`` action), with typed partition values."""

    path: str  # relative to the table root, URI-encoded as in the log (decode before use)
    size: int
    modification_time: int
    num_records: int | None
    partition_values: dict[str, Any]
    min_values: dict[str, Any] = field(default_factory=dict)
    max_values: dict[str, Any] = field(default_factory=dict)
    null_counts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """A table at one version. Cheap to pickle: the file list is built on demand."""

    uri: str
    version: int
    schema: dict[str, Any]  # the Delta schema JSON, column-mapping metadata included
    partition_columns: tuple[str, ...]
    configuration: dict[str, str | None]
    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...]
    writer_features: tuple[str, ...]
    storage_options: dict[str, str] | None = None
    description: str | None = None  # the table comment

    @property
    def column_mapping_mode(self) -> str:
        return _schema.column_mapping_mode(self.configuration)

    @property
    def has_deletion_vectors_enabled(self) -> bool:
        return "deletionVectors" in self.reader_features

    def __getstate__(self) -> dict[str, Any]:
        # The loaded table stays behind: a pickled snapshot loads its own where it lands.
        return {k: v for k, v in self.__dict__.items() if k != "delta_table"}

    @cached_property
    def delta_table(self) -> DeltaTable:
        return DeltaTable(
            _uri.delta_rs_uri(self.uri), version=self.version, storage_options=self.storage_options
        )

    def files(self, *, stats: bool = True) -> list[FileEntry]:
        """Every live data file, stats keyed by logical column names.

        ``stats=False`` leaves the stats out (``min_values`` etc. stay empty): turning
        timestamp stats into Python values imports pandas (pyarrow's time zone
        handling), ~0.25 s in a fresh worker that needs no stats, like a stream's.
        """
        actions = _arrow.read_stream(self.delta_table.get_add_actions(flatten=False))
        if not stats:
            actions = actions.drop_columns(
                [c for c in ("min", "max", "null_count") if c in actions.column_names]
            )
        physical_to_logical = _physical_to_logical(self.schema)
        rows = actions.to_pylist()
        entries = []
        for row in rows:
            entries.append(
                FileEntry(
                    path=row["path"],
                    size=row["size_bytes"],
                    modification_time=row["modification_time"],
                    num_records=row.get("num_records"),
                    partition_values=_rename(row.get("partition") or {}, physical_to_logical),
                    min_values=_rename(row.get("min") or {}, physical_to_logical),
                    max_values=_rename(row.get("max") or {}, physical_to_logical),
                    null_counts=_rename(row.get("null_count") or {}, physical_to_logical),
                )
            )
        return entries

    def deleted_rows(self) -> dict[str, np.ndarray]:
        """Path (relative, or the absolute URI of a file outside the table) -> sorted
        indexes of rows removed by deletion vectors."""
        if not self.has_deletion_vectors_enabled:
            return {}
        out: dict[str, np.ndarray] = {}
        prefix = _uri.delta_rs_uri(self.uri).rstrip("/") + "/"
        reader = self.delta_table.deletion_vectors()
        table = _arrow.read_stream(reader)
        outside: dict[tuple[str, str, str], str] | None = None
        for file_uri, selection in zip(
            table.column("filepath").to_pylist(),
            table.column("selection_vector").to_pylist(),
            strict=True,
        ):
            key = _relative_path(file_uri, prefix)
            if _uri.is_absolute(key):
                # A file outside the table (a shallow clone's): the key is the log's own
                # spelling of its URI (file:/x, file:///x, percent-encoded or not).
                if outside is None:
                    outside = {
                        _same_file(f.path): f.path
                        for f in self.files(stats=False)
                        if _uri.is_absolute(f.path)
                    }
                key = outside.get(_same_file(key), key)
            keep = np.asarray(selection, dtype=bool)
            out[key] = np.flatnonzero(~keep).astype(np.int64)
        return out

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return commit_history(self.delta_table, self.uri, limit)


def commit_history(table: DeltaTable, uri: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The commitInfo of each commit, newest first, with its ``version`` (delta-rs's
    ``history()``). delta-rs fails on a commitInfo field it types more narrowly than the
    protocol does (delta-spark writes ``readVersion: -1`` on a shallow clone's version 0);
    then the commits are read from the log here."""
    try:
        return list(table.history(limit))
    except DeltaError as exc:
        if "expected u64" not in str(exc):
            raise
    out: list[dict[str, Any]] = []
    version = table.version()
    while version >= 0 and (limit is None or len(out) < limit):
        actions = _log.read_commit(uri, version)
        if actions is None:  # older commits were cleaned up
            break
        info: dict[str, Any] = next((a["commitInfo"] for _, a in actions if "commitInfo" in a), {})
        out.append({**info, "version": version})
        version -= 1
    return out


def _relative_path(file_uri: str, prefix: str) -> str:
    from urllib.parse import unquote, urlparse

    path = file_uri
    if path.startswith("file://"):
        path = unquote(urlparse(path).path)
    if path.startswith(prefix):
        return path[len(prefix) :]
    local_prefix = prefix[len("file://") :] if prefix.startswith("file://") else prefix
    if path.startswith(local_prefix):
        return path[len(local_prefix) :]
    # A file outside the table (a shallow clone's): the log names it by absolute URI.
    return file_uri


def _same_file(uri: str) -> tuple[str, str, str]:
    """A URI reduced to what names the file, however the log spelled it."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    return parsed.scheme, parsed.netloc, unquote(parsed.path)


def _physical_to_logical(schema: dict[str, Any]) -> dict[str, str]:
    names = _schema.top_level_physical_names(schema)
    return {physical: logical for logical, physical in names.items()}


def _rename(values: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    return {mapping.get(k, k): v for k, v in values.items()}


def table_exists(uri: str, storage_options: dict[str, str] | None = None) -> bool:
    try:
        return bool(DeltaTable.is_deltatable(_uri.delta_rs_uri(uri), storage_options))
    except OSError as exc:
        # delta-rs fails to list a local path that is a file; a file holds no table.
        if _uri.is_local(uri) and os.path.isfile(_uri.local_path(uri)):
            return False
        error = object_store_error(uri, exc, "look for a Delta table at")
        if error is None:
            raise
        raise error from exc


def table_not_found(uri: str) -> TableNotFoundError:
    """The typed error for a location that holds no Delta table."""
    return TableNotFoundError(
        f"No Delta table at {uri}: there is no _delta_log there. Check the path, or create "
        f"the table first with df.write.format('delta').save('{uri}').",
        table_uri=uri,
    )


def open_latest(uri: str, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """delta-rs's table of ``uri`` at its newest version. On a local disk the load is
    pinned to the newest commit found by name (:func:`deltaflow.table._log.newest_local_version`),
    so that commits landing during its listing of a large ``_delta_log`` cannot make it
    fail; a pinned load that fails anyway (a stale checkpoint hint) is done again unpinned."""
    location = _uri.delta_rs_uri(uri)
    newest = _log.newest_local_version(uri)
    if newest is not None:
        try:
            return DeltaTable(location, version=newest, storage_options=storage_options)
        except DeltaError:
            pass
    return DeltaTable(location, storage_options=storage_options)


def latest_version(uri: str, storage_options: dict[str, str] | None = None) -> int:
    """The newest version of ``uri``: found by name on a local disk (no load), else
    delta-rs's load."""
    newest = _log.newest_local_version(uri)
    if newest is not None:
        return newest
    return int(DeltaTable(_uri.delta_rs_uri(uri), storage_options=storage_options).version())


def catch_up(table: DeltaTable, uri: str) -> None:
    """``table.update_incremental()``, pinned on a local disk as :func:`open_latest` is."""
    newest = _log.newest_local_version(uri)
    if newest is None:
        table.update_incremental()
    elif newest > table.version():
        table.load_as_version(newest)


def load_snapshot(
    uri: str,
    *,
    version: int | None = None,
    timestamp: str | dt.datetime | None = None,
    storage_options: dict[str, str] | None = None,
    check_readable: bool = True,
) -> Snapshot:
    """Load ``uri`` at the latest version, at ``version``, or as of ``timestamp``.

    ``timestamp`` follows delta-spark's ``timestampAsOf``: the latest version
    committed at or before it. Naive timestamps are UTC.
    """
    location = _uri.delta_rs_uri(uri)
    try:
        table = open_latest(uri, storage_options)
    except _DeltaRsTableNotFound as exc:
        raise table_not_found(uri) from exc
    except DeltaError as exc:
        _raise_if_unsupported_feature(exc, uri)
        raise
    except OSError as exc:
        error = object_store_error(uri, exc, "read the Delta log of")
        if error is None:
            raise
        raise error from exc
    latest = table.version()
    if timestamp is not None:
        version = _version_at(table, uri, timestamp, latest)
    if version is not None and version != latest:
        if version < 0 or version > latest:
            raise VersionNotFoundError(
                f"Version {version} of table {uri} does not exist: the latest version is {latest}."
                " Use a version between the earliest retained one and the latest (see history()).",
                table_uri=uri,
                version=version,
                latest=latest,
            )
        try:
            table = DeltaTable(location, version=version, storage_options=storage_options)
        except DeltaError as exc:
            _raise_if_unsupported_feature(exc, uri, version)
            raise VersionNotFoundError(
                f"Version {version} of table {uri} cannot be reconstructed: its log files were"
                f" removed by log cleanup ({exc}). Read a later version; the latest is {latest}.",
                table_uri=uri,
                version=version,
                latest=latest,
            ) from exc
    snapshot = _snapshot_of(table, uri, storage_options)
    if check_readable:
        check_reader_features(snapshot)
    # The table just loaded is this snapshot's (same version, same options): its file list
    # needs no second log load (on an object store, a LIST and a GET per commit fewer).
    snapshot.__dict__["delta_table"] = table
    return snapshot


def snapshot_of_table(table: DeltaTable, uri: str) -> Snapshot:
    """The snapshot of ``table`` as loaded now, sharing that ``DeltaTable`` (no log load).

    For a caller that keeps one table up to date with ``update_incremental()`` (a streaming
    sink, per micro-batch): the snapshot's ``delta_table`` *is* ``table``, so it is only
    valid until the caller moves ``table`` on.
    """
    snapshot = _snapshot_of(table, uri, None)
    check_reader_features(snapshot)
    snapshot.__dict__["delta_table"] = table  # the cached_property, pre-filled
    return snapshot


def _snapshot_of(table: DeltaTable, uri: str, storage_options: dict[str, str] | None) -> Snapshot:
    metadata = table.metadata()
    protocol = table.protocol()
    schema = json.loads(table.schema().to_json())
    return Snapshot(
        uri=uri,
        version=table.version(),
        schema=schema,
        partition_columns=tuple(metadata.partition_columns),
        configuration=dict(metadata.configuration),
        min_reader_version=protocol.min_reader_version,
        min_writer_version=protocol.min_writer_version,
        reader_features=tuple(protocol.reader_features or ()),
        writer_features=tuple(protocol.writer_features or ()),
        storage_options=storage_options,
        description=metadata.description or None,
    )


def check_reader_features(snapshot: Snapshot) -> None:
    for feature in snapshot.reader_features:
        if feature not in SUPPORTED_READER_FEATURES:
            raise _unsupported(snapshot.uri, snapshot.version, feature)


def _unsupported(uri: str, version: int | None, feature: str) -> UnsupportedFeatureError:
    at = f" (version {version})" if version is not None else ""
    return UnsupportedFeatureError(
        f"Table {uri}{at} uses the Delta reader feature '{feature}', which deltaflow cannot"
        f" read yet. Supported reader features: {', '.join(sorted(SUPPORTED_READER_FEATURES))}.",
        table_uri=uri,
        feature=feature,
    )


# delta-rs refuses to load a table whose protocol names a feature it does not know, before
# our own allow-list can look; its message is the only place the feature's name appears.
_DELTA_RS_UNSUPPORTED = re.compile(r"Feature '([^']+)' is not supported")


def _raise_if_unsupported_feature(exc: DeltaError, uri: str, version: int | None = None) -> None:
    match = _DELTA_RS_UNSUPPORTED.search(str(exc))
    if match:
        raise _unsupported(uri, version, match.group(1)) from exc


def parse_timestamp(value: str | dt.datetime) -> dt.datetime:
    if isinstance(value, dt.datetime):
        parsed = value
    else:
        text = value.strip().replace("T", " ")
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        parsed = dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed


def _version_at(table: DeltaTable, uri: str, timestamp: str | dt.datetime, latest: int) -> int:
    try:
        wanted = parse_timestamp(timestamp)
    except ValueError as exc:
        raise VersionNotFoundError(
            # delta-spark's DELTA_TIMESTAMP_INVALID sentence first, then what to pass.
            f"[DELTA_TIMESTAMP_INVALID] The provided timestamp ('{timestamp}') cannot be"
            f" converted to a valid timestamp (table {uri}): use 'YYYY-MM-DD',"
            " 'YYYY-MM-DD HH:MM:SS' or ISO 8601 with an offset.",
            table_uri=uri,
            timestamp=str(timestamp),
        ) from exc
    wanted_ms = int(wanted.timestamp() * 1000)
    commits = sorted(
        (c["version"], c["timestamp"]) for c in commit_history(table, uri) if "version" in c
    )
    if not commits:
        return latest
    earliest_version, earliest_ts = commits[0]
    if wanted_ms < earliest_ts:
        raise VersionNotFoundError(
            f"The timestamp {wanted.isoformat()} is before the earliest available version"
            f" ({earliest_version}, committed at {_fmt_ms(earliest_ts)}) of table {uri}. Use a"
            " later timestamp.",
            table_uri=uri,
            timestamp=wanted.isoformat(),
            earliest=earliest_version,
            latest=latest,
        )
    latest_ts = commits[-1][1]
    if wanted_ms > latest_ts:
        raise VersionNotFoundError(
            f"The timestamp {wanted.isoformat()} is after the latest version ({latest}, committed"
            f" at {_fmt_ms(latest_ts)}) of table {uri}. Use a timestamp at or before"
            f" {_fmt_ms(latest_ts)}, or versionAsOf={latest}.",
            table_uri=uri,
            timestamp=wanted.isoformat(),
            earliest=earliest_version,
            latest=latest,
        )
    chosen = earliest_version
    for version, ts in commits:
        if ts <= wanted_ms:
            chosen = version
    return chosen


def _fmt_ms(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()
