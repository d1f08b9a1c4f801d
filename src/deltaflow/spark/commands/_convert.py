"""CONVERT TO DELTA (a Parquet directory becomes a Delta table in place) and GENERATE
symlink_format_manifest, through delta-rs."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import Schema, convert_to_deltalake
from deltalake.exceptions import DeltaError

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _uri
from deltaflow.table._snapshot import load_snapshot, table_exists
from deltaflow.table.errors import TableNotFoundError, UnsupportedFeatureError

# Spark type names (StructType JSON) of the partition columns delta-rs can convert.
_PARTITION_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "boolean": pa.bool_(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}

MANIFEST_MODE = "symlink_format_manifest"


def convert(uri: str, partition_schema: dict[str, Any] | None = None) -> bool:
    """Make the Parquet files under ``uri`` a Delta table in one commit; Hive-style
    partition directories need ``partition_schema`` (Spark StructType JSON). A Delta
    table is left as it is (as delta-spark does). Returns whether a table was made."""
    if table_exists(uri):
        return False
    fs, root = _uri.filesystem(uri)
    info = fs.get_file_info(root)
    if info.type != pafs.FileType.Directory:
        raise TableNotFoundError(
            f"CONVERT TO DELTA parquet.`{uri}`: there is no directory there. Check the path.",
            table_uri=uri,
        )
    fields = (partition_schema or {}).get("fields") or []
    partitioned = _partition_directories(fs, root)
    if partitioned and not fields:
        raise InvalidOptionError(
            f"CONVERT TO DELTA parquet.`{uri}`: the files are in partition directories"
            f" ({', '.join(sorted(partitioned))}), so the statement must name the partition"
            f" columns: CONVERT TO DELTA parquet.`{uri}` PARTITIONED BY (col type, ...).",
            option="partitionedBy",
            valid=tuple(sorted(partitioned)),
        )
    try:
        convert_to_deltalake(
            _uri.delta_rs_uri(uri),
            partition_by=Schema.from_arrow(pa.schema([_partition_field(uri, f) for f in fields]))
            if fields
            else None,
            partition_strategy="hive" if fields else None,
        )
    except DeltaError as exc:
        raise InvalidOptionError(
            f"CONVERT TO DELTA parquet.`{uri}` failed: {exc}. Check that the directory holds"
            f" only Parquet files (Hive-style partition directories matching PARTITIONED BY).",
            option="path",
        ) from exc
    return True


def generate(uri: str, mode: str) -> None:
    """Write the table's ``_symlink_format_manifest`` (GENERATE symlink_format_manifest)."""
    if mode.lower() != MANIFEST_MODE:
        raise InvalidOptionError(
            f"GENERATE {mode} FOR TABLE on {uri}: the only mode is {MANIFEST_MODE}.",
            option="mode",
            valid=(MANIFEST_MODE,),
        )
    snapshot = load_snapshot(uri)
    if snapshot.deleted_rows():
        raise UnsupportedFeatureError(
            f"GENERATE {MANIFEST_MODE} for {snapshot.uri}: some files have deletion vectors,"
            f" which a manifest of whole files cannot express (readers would see deleted rows)."
            f" Rewrite those files first (OPTIMIZE), then generate the manifest.",
            table_uri=snapshot.uri,
            feature="deletionVectors",
        )
    if snapshot.column_mapping_mode != "none":
        raise UnsupportedFeatureError(
            f"GENERATE {MANIFEST_MODE} for {snapshot.uri}: the table uses column mapping, so"
            f" its Parquet files carry physical column names that manifest readers would not"
            f" map back.",
            table_uri=snapshot.uri,
            feature="columnMapping",
        )
    snapshot.delta_table.generate()


def _partition_field(uri: str, field: dict[str, Any]) -> pa.Field:
    kind = field.get("type")
    arrow = _PARTITION_TYPES.get(kind) if isinstance(kind, str) else None
    if arrow is None:
        raise InvalidOptionError(
            f"CONVERT TO DELTA parquet.`{uri}` PARTITIONED BY {field.get('name')}: partition"
            f" columns of type {kind} cannot be converted; use one of"
            f" {', '.join(_PARTITION_TYPES)}.",
            option="partitionedBy",
            valid=tuple(_PARTITION_TYPES),
        )
    return pa.field(str(field["name"]), arrow)


def _partition_directories(fs: pafs.FileSystem, root: str) -> set[str]:
    """The partition column names of the top-level ``name=value`` directories."""
    selector = pafs.FileSelector(root, recursive=False)
    return {
        info.base_name.split("=", 1)[0]
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.Directory
        and "=" in info.base_name
        and not info.base_name.startswith(("_", "."))
    }
