"""The option names the ``delta`` source accepts, parsed into frozen objects.

Names and meanings follow delta-spark (``DeltaOptions.scala``). Spark hands
options over case-insensitively; unknown keys are refused with the list of valid
ones so that a typo never silently changes what a query does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from deltaflow.errors import InvalidOptionError
from deltaflow.table._auto_compact import DEFAULT_SETTINGS, AutoCompactSettings
from deltaflow.table._protocol import CHECKPOINT_POLICIES, CHECKPOINT_POLICY

_COMMON = ("path",)
# delta-spark's streaming source options (readStream); batch reads accept and ignore them.
STREAM_READ_OPTIONS = (
    "maxFilesPerTrigger",
    "maxBytesPerTrigger",
    "startingVersion",
    "startingTimestamp",
    "skipChangeCommits",
    "ignoreDeletes",
    "readChangeFeed",
    # deltaflow's: how often a real-time-mode reader looks for the next commit (ms).
    "realTimePollIntervalMs",
)
# delta-spark's change data feed options (readChangeFeed, with readChangeData its old name).
CDF_READ_OPTIONS = ("endingVersion", "endingTimestamp", "readChangeData")
READ_OPTIONS = (
    *_COMMON,
    "versionAsOf",
    "timestampAsOf",
    "fileSkipping",
    *STREAM_READ_OPTIONS,
    *CDF_READ_OPTIONS,
)
WRITE_OPTIONS = (
    *_COMMON,
    "partitionBy",
    "mergeSchema",
    "overwriteSchema",
    "replaceWhere",
    "partitionOverwriteMode",
    "txnAppId",
    "txnVersion",
    "userMetadata",
    "maxRecordsPerFile",
    "compression",
    "optimizeWrite",
)
# Delta table properties that writer options may set at creation. Spark lowercases
# option keys on their way to a data source, and Delta's property names are
# case-sensitive, so known names are restored to their canonical spelling.
TABLE_PROPERTIES = (
    "delta.appendOnly",
    "delta.autoOptimize.autoCompact",
    "delta.autoOptimize.optimizeWrite",
    "delta.checkpoint.writeStatsAsJson",
    "delta.checkpoint.writeStatsAsStruct",
    "delta.checkpointInterval",
    "delta.checkpointPolicy",
    "delta.columnMapping.maxColumnId",
    "delta.columnMapping.mode",
    "delta.dataSkippingNumIndexedCols",
    "delta.dataSkippingStatsColumns",
    "delta.deletedFileRetentionDuration",
    "delta.enableChangeDataFeed",
    "delta.enableDeletionVectors",
    "delta.enableExpiredLogCleanup",
    "delta.enableInCommitTimestamps",
    "delta.enableRowTracking",
    "delta.enableTypeWidening",
    "delta.isolationLevel",
    "delta.logRetentionDuration",
    "delta.minReaderVersion",
    "delta.minWriterVersion",
    "delta.randomizeFilePrefixes",
    "delta.randomPrefixLength",
    "delta.setTransactionRetentionDuration",
    "delta.targetFileSize",
    "delta.tuneFileSizesForRewrites",
)
_FEATURES = (
    "appendOnly",
    "changeDataFeed",
    "checkConstraints",
    "columnMapping",
    "deletionVectors",
    "domainMetadata",
    "generatedColumns",
    "identityColumns",
    "invariants",
    "rowTracking",
    "timestampNtz",
    "typeWidening",
    "v2Checkpoint",
    "vacuumProtocolCheck",
    "variantType",
)
_CANONICAL = {name.lower(): name for name in TABLE_PROPERTIES} | {
    f"delta.feature.{name}".lower(): f"delta.feature.{name}" for name in _FEATURES
}
OPTIMIZE_WRITE_PROPERTY = "delta.autoOptimize.optimizeWrite"
OPTIMIZE_WRITE_CONF = "spark.databricks.delta.optimizeWrite.enabled"
# delta-spark's session switch for schema evolution: the default of a write's mergeSchema
# (handed over as a write option by the connector) and of MERGE's WITH SCHEMA EVOLUTION.
AUTO_MERGE_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
OPTIMIZE_WRITE_BIN_SIZE_CONF = "spark.databricks.delta.optimizeWrite.binSize"
DEFAULT_OPTIMIZE_WRITE_BIN_SIZE = 512 * 1024 * 1024  # delta-spark's default, 512 MiB
# Keys Spark itself may add to a source's options (SQL tables, DataFrameWriter).
# CREATE TABLE passes location, owner, provider and each OPTIONS key a second time
# with an "option." prefix.
# The save mode a write hands the Python source it delegates to (Spark's Python data
# source API passes only "overwrite or not").
SAVE_MODE_OPTION = "__deltaflow_save_mode"
# What the connector's catalog hands a write that creates a table (CREATE TABLE ... AS
# SELECT): JSON with the statement's properties and comment.
CREATE_SPEC_OPTION = "__deltaflow_create"
# Set by the connector on a write it hands the Python data source after checking the rows
# against the table's constraints itself: their fingerprint (``table/_constraints``).
CHECKED_CONSTRAINTS_OPTION = "__deltaflow_checked"
# Set by the connector on a write it hands the Python data source: the identity columns
# whose values it generated (comma-separated), so their high water marks move.
IDENTITY_GENERATED_OPTION = "__deltaflow_identity_generated"
# Set by the classic reader patch (spark/read/_checks.py) on a batch read it does not load
# itself: table.load then raises TableNotFoundError for a missing table, in load(), instead
# of answering "no table yet" as it does for a write.
READ_MARKER_OPTION = "__deltaflow_read"
_SPARK_INTERNAL = (
    "__partition_columns",
    "__path_provider",
    "location",
    "owner",
    "provider",
    CREATE_SPEC_OPTION,
    CHECKED_CONSTRAINTS_OPTION,
    IDENTITY_GENERATED_OPTION,
    READ_MARKER_OPTION,
)


@dataclass(frozen=True)
class ReadOptions:
    path: str
    version_as_of: int | None = None
    timestamp_as_of: str | None = None
    # None = "auto": skip files only where Spark plans each query afresh (see _reader.py).
    file_skipping: bool | None = None
    # The change data feed (readChangeFeed): a version range, each end by version or time.
    read_change_feed: bool = False
    starting_version: int | None = None
    starting_timestamp: str | None = None
    ending_version: int | None = None
    ending_timestamp: str | None = None


@dataclass(frozen=True)
class WriteOptions:
    path: str
    partition_by: tuple[str, ...] = ()
    merge_schema: bool = False
    overwrite_schema: bool = False
    replace_where: str | None = None
    txn_app_id: str | None = None
    txn_version: int | None = None
    user_metadata: str | None = None
    max_records_per_file: int = 0
    compression: str = "snappy"
    table_properties: dict[str, str] = field(default_factory=dict)
    # "dynamic": an overwrite replaces only the partitions the written rows fall in.
    partition_overwrite_mode: str = "static"
    # Set by CREATE TABLE ... AS SELECT: the new table's comment (its properties are in
    # table_properties).
    table_comment: str | None = None
    # Set by CREATE TABLE ... CLUSTER BY ... AS SELECT / writeTo().clusterBy: the columns.
    clustering_columns: tuple[str, ...] | None = None
    # The fingerprint of the constraints the connector checked these rows against.
    checked_constraints: str | None = None
    # The identity columns the connector generated values for (not the user's values).
    identity_generated: tuple[str, ...] = ()
    # The writer's optimizeWrite option, else its session's
    # spark.databricks.delta.optimizeWrite.enabled; None: the table property decides.
    optimize_write: bool | None = None
    # spark.databricks.delta.optimizeWrite.binSize, in bytes.
    optimize_write_bin_size: int = DEFAULT_OPTIMIZE_WRITE_BIN_SIZE
    # The writer's session settings for auto compaction (spark.databricks.delta.autoCompact.*,
    # handed over as write options by the connector).
    auto_compact: AutoCompactSettings = DEFAULT_SETTINGS
    # Set by the catalog's CREATE / REPLACE / CREATE OR REPLACE TABLE ... AS SELECT
    # (saveAsTable, writeTo): "create" | "replace" | "createOrReplace", and whether the
    # table is managed; they name the commit as delta-spark does.
    create_mode: str | None = None
    create_managed: bool = False
    # A replacing statement whose metadata replaces an existing table's (SQL REPLACE /
    # CREATE OR REPLACE, writeTo().replace()); not saveAsTable's overwrite (delta-spark's
    # V1 writer keeps the table's properties).
    create_replaces_metadata: bool = False
    # saveAsTable's overwrite (delta-spark's V1 writer): a DataFrame overwrite of the
    # table, recorded with isV1SaveAsTableOverwrite.
    create_v1_overwrite: bool = False


JVM_PATH_MODES = ("auto", "false")


def jvm_path_mode(conf: str, value: str | None, off: str) -> str:
    """The Spark conf ``conf`` that switches a JVM fast path: ``auto`` (also when unset) or
    ``false``; ``off`` says what ``false`` does, for the error on any other value."""
    mode = (value or "auto").strip().lower()
    if mode not in JVM_PATH_MODES:
        raise InvalidOptionError(
            f"Spark conf '{conf}' must be one of {', '.join(JVM_PATH_MODES)}, not {value!r}:"
            f" spark.conf.set('{conf}', 'false') {off}.",
            option=conf,
            valid=JVM_PATH_MODES,
        )
    return mode


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items() if v is not None}


def _check_known(options: dict[str, str], valid: tuple[str, ...], kind: str) -> None:
    known = {v.lower() for v in valid} | set(_SPARK_INTERNAL)
    for key in options:
        if key in known or key.startswith(("delta.", "spark.", "option.")):
            continue
        raise InvalidOptionError(
            f"Unknown {kind} option '{key}' for format('delta'). Valid options:"
            f" {', '.join(valid)}, and table properties named 'delta.*'.",
            option=key,
            valid=valid,
        )


def _path(options: dict[str, str]) -> str:
    path = options.get("path") or options.get("location")
    if not path:
        raise InvalidOptionError(
            "format('delta') needs a table location: use .load(uri) / .save(uri), or"
            " CREATE TABLE ... USING delta LOCATION 'uri'.",
            option="path",
        )
    return path


def _bool(options: dict[str, str], key: str) -> bool:
    raw = options.get(key.lower(), "false").strip().lower()
    if raw not in ("true", "false"):
        raise InvalidOptionError(
            f"Option '{key}' must be 'true' or 'false', not {raw!r}.",
            option=key,
            valid=("true", "false"),
        )
    return raw == "true"


def _int(options: dict[str, str], key: str) -> int | None:
    raw = options.get(key.lower())
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidOptionError(
            f"Option '{key}' must be an integer, not {raw!r}.", option=key
        ) from None


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    lowered = _lower(options)
    _check_known(lowered, READ_OPTIONS, "read")
    version = _int(lowered, "versionAsOf")
    timestamp = lowered.get("timestampasof")
    if version is not None and timestamp is not None:
        raise InvalidOptionError(
            "Give either versionAsOf or timestampAsOf, not both.", option="timestampAsOf"
        )
    skipping = lowered.get("fileskipping", "auto").strip().lower()
    if skipping not in ("auto", "true", "false"):
        raise InvalidOptionError(
            f"Option 'fileSkipping' must be 'auto', 'true' or 'false', not {skipping!r}.",
            option="fileSkipping",
            valid=("auto", "true", "false"),
        )
    read_change_feed = _bool(lowered, "readChangeFeed") or _bool(lowered, "readChangeData")
    return ReadOptions(
        path=_path(lowered),
        version_as_of=version,
        timestamp_as_of=timestamp,
        file_skipping=None if skipping == "auto" else skipping == "true",
        read_change_feed=read_change_feed,
        **(_change_feed_range(lowered) if read_change_feed else {}),  # type: ignore[arg-type]
    )


def _change_feed_range(lowered: dict[str, str]) -> dict[str, int | str | None]:
    """startingVersion / startingTimestamp / endingVersion / endingTimestamp of a batch
    change feed read. Outside a change feed read, batch reads ignore them (as delta-spark)."""
    out: dict[str, int | str | None] = {}
    for bound in ("starting", "ending"):
        version = _int(lowered, f"{bound}Version")
        if version is not None and version < 0:
            raise InvalidOptionError(
                f"Option '{bound}Version' must be a version >= 0, not {version}.",
                option=f"{bound}Version",
            )
        out[f"{bound}_version"] = version
        # delta-spark uses the version when both are given.
        out[f"{bound}_timestamp"] = (
            None if version is not None else lowered.get(f"{bound}timestamp")
        )
    return out


@dataclass(frozen=True)
class StreamReadOptions:
    path: str
    max_files_per_trigger: int = 1000  # delta-spark's default
    max_bytes_per_trigger: int | None = None  # soft: a batch holds at least one file
    starting_version: int | Literal["latest"] | None = None
    starting_timestamp: str | None = None
    skip_change_commits: bool = False
    ignore_deletes: bool = False
    read_change_feed: bool = False


def parse_stream_options(options: Mapping[str, str]) -> StreamReadOptions:
    """Options of ``spark.readStream.format("delta")``, checked like batch read options."""
    lowered = _lower(options)
    _check_known(lowered, READ_OPTIONS, "read")
    max_files = _int(lowered, "maxFilesPerTrigger")
    max_bytes = _int(lowered, "maxBytesPerTrigger")
    for key, value in (("maxFilesPerTrigger", max_files), ("maxBytesPerTrigger", max_bytes)):
        if value is not None and value <= 0:
            raise InvalidOptionError(f"Option '{key}' must be positive, not {value}.", option=key)
    raw_version = lowered.get("startingversion")
    starting_version: int | Literal["latest"] | None = None
    if raw_version is not None and raw_version.strip().lower() == "latest":
        starting_version = "latest"
    elif raw_version is not None:
        starting_version = _int(lowered, "startingVersion")
        if starting_version is not None and starting_version < 0:
            raise InvalidOptionError(
                f"startingVersion must be 'latest' or a version >= 0, not {raw_version!r}.",
                option="startingVersion",
            )
    timestamp = lowered.get("startingtimestamp")
    if starting_version is not None and timestamp is not None:
        raise InvalidOptionError(
            "Give either startingVersion or startingTimestamp, not both.",
            option="startingTimestamp",
        )
    return StreamReadOptions(
        path=_path(lowered),
        max_files_per_trigger=max_files or 1000,
        max_bytes_per_trigger=max_bytes,
        starting_version=starting_version,
        starting_timestamp=timestamp,
        skip_change_commits=_bool(lowered, "skipChangeCommits"),
        ignore_deletes=_bool(lowered, "ignoreDeletes"),
        read_change_feed=_bool(lowered, "readChangeFeed") or _bool(lowered, "readChangeData"),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    lowered = _lower(options)
    _check_known(lowered, WRITE_OPTIONS, "write")
    partition_raw = lowered.get("partitionby") or lowered.get("__partition_columns") or ""
    partition_by = tuple(
        p.strip().strip("`") for p in partition_raw.strip("[]").split(",") if p.strip()
    )
    partition_by = tuple(p.strip('"') for p in partition_by)
    app_id, app_version = lowered.get("txnappid"), _int(lowered, "txnVersion")
    if (app_id is None) != (app_version is None):
        raise InvalidOptionError(
            "txnAppId and txnVersion go together: set both for an idempotent write, or neither.",
            option="txnAppId" if app_id is None else "txnVersion",
        )
    properties = {
        _CANONICAL.get(key.lower(), key): value
        for key, value in options.items()
        if key.lower().startswith("delta.") and value is not None
    }
    overwrite_mode = (lowered.get("partitionoverwritemode") or "static").strip().lower()
    if overwrite_mode not in ("static", "dynamic"):
        raise InvalidOptionError(
            f"partitionOverwriteMode must be 'static' or 'dynamic', got {overwrite_mode!r}.",
            option="partitionOverwriteMode",
            valid=("static", "dynamic"),
        )
    if overwrite_mode == "dynamic" and lowered.get("replacewhere"):
        raise InvalidOptionError(
            "replaceWhere and partitionOverwriteMode=dynamic cannot be used together: one"
            " names the rows to replace, the other replaces the partitions written to. Use"
            " one of them.",
            option="partitionOverwriteMode",
        )
    comment = None
    clustering = None
    create_mode = None
    create_managed = False
    create_replaces_metadata = False
    create_v1_overwrite = False
    if CREATE_SPEC_OPTION in lowered:
        create = json.loads(lowered[CREATE_SPEC_OPTION])
        create_mode = create.get("mode")
        create_managed = bool(create.get("managed"))
        create_replaces_metadata = bool(create.get("replaceMetadata"))
        create_v1_overwrite = bool(create.get("v1Overwrite"))
        properties.update(checked_table_properties(create.get("properties") or {}))
        comment = create.get("comment")
        if create.get("clusteringColumns") is not None:
            clustering = tuple(str(c) for c in create["clusteringColumns"])
    return WriteOptions(
        path=_path(lowered),
        partition_by=partition_by,
        merge_schema=bool(_optional_bool(lowered, "mergeSchema", AUTO_MERGE_CONF)),
        overwrite_schema=_bool(lowered, "overwriteSchema"),
        replace_where=lowered.get("replacewhere"),
        txn_app_id=app_id,
        txn_version=app_version,
        user_metadata=lowered.get("usermetadata"),
        max_records_per_file=_int(lowered, "maxRecordsPerFile") or 0,
        compression=lowered.get("compression", "snappy"),
        table_properties=properties,
        table_comment=comment,
        clustering_columns=clustering,
        checked_constraints=lowered.get(CHECKED_CONSTRAINTS_OPTION),
        identity_generated=tuple(
            c for c in (lowered.get(IDENTITY_GENERATED_OPTION) or "").split(",") if c
        ),
        partition_overwrite_mode=overwrite_mode,
        optimize_write=_optional_bool(lowered, "optimizeWrite", OPTIMIZE_WRITE_CONF),
        optimize_write_bin_size=_bin_size(lowered.get(OPTIMIZE_WRITE_BIN_SIZE_CONF.lower())),
        auto_compact=AutoCompactSettings.from_conf(lowered),
        create_mode=create_mode,
        create_managed=create_managed,
        create_replaces_metadata=create_replaces_metadata,
        create_v1_overwrite=create_v1_overwrite,
    )


def checked_table_properties(
    raw: Mapping[str, str], where: str = "in TBLPROPERTIES"
) -> dict[str, str]:
    """Table properties as the table keeps them (a statement's TBLPROPERTIES, a builder's
    ``property``): Delta's names spelled canonically, an unknown ``delta.*`` name refused
    before anything is written; ``where`` says where it was given, for the error."""
    out = {}
    for key, value in raw.items():
        name = _CANONICAL.get(key.lower(), key)
        lowered = name.lower()
        if (
            lowered.startswith("delta.")
            and name not in TABLE_PROPERTIES
            and not lowered.startswith("delta.feature.")
        ):
            raise InvalidOptionError(
                f"Unknown Delta table property '{key}' {where}. Known:"
                f" {', '.join(TABLE_PROPERTIES)}. Properties not starting with 'delta.' are"
                " stored as given.",
                option=key,
                valid=TABLE_PROPERTIES,
            )
        if name == CHECKPOINT_POLICY and str(value).lower() not in CHECKPOINT_POLICIES:
            raise InvalidOptionError(
                f"{CHECKPOINT_POLICY} {where} must be one of {', '.join(CHECKPOINT_POLICIES)},"
                f" not {value!r}: 'v2' writes V2 checkpoints (the v2Checkpoint table feature),"
                " 'classic' the classic ones.",
                option=key,
                valid=CHECKPOINT_POLICIES,
            )
        out[name] = str(value)
    return out


def session_auto_merge(get_conf: Callable[[str, str], str | None]) -> bool:
    """The session's :data:`AUTO_MERGE_CONF` (``get_conf``: ``spark.conf.get``), checked."""
    return _bool({AUTO_MERGE_CONF.lower(): get_conf(AUTO_MERGE_CONF, "false") or "false"},
                 AUTO_MERGE_CONF)  # fmt: skip


def _optional_bool(options: dict[str, str], *keys: str) -> bool | None:
    """The first of ``keys`` that is set, as a boolean (None when none is)."""
    for key in keys:
        if options.get(key.lower()) is not None:
            return _bool(options, key)
    return None


def _bin_size(raw: str | None) -> int:
    """delta-spark's binSize: mebibytes, or a size with a unit suffix (k, m, g)."""
    if raw is None:
        return DEFAULT_OPTIMIZE_WRITE_BIN_SIZE
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = raw.strip().lower().removesuffix("b").removesuffix("i")
    unit = units.get(text[-1:], 0)
    number = text[:-1] if unit else text
    if not number.isdigit() or int(number) <= 0:
        raise InvalidOptionError(
            f"{OPTIMIZE_WRITE_BIN_SIZE_CONF} must be a size above 0 (mebibytes, or with a unit"
            f" such as 512m or 1g), got {raw!r}.",
            option=OPTIMIZE_WRITE_BIN_SIZE_CONF,
        )
    return int(number) * (unit or units["m"])
