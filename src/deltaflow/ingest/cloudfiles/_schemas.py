"""Schemas of a landing zone: inference from sample files, schema hints, and the
versioned schema files under ``<schemaLocation>/_schemas/`` (``0``, ``1``, ...).

A schema file holds the data columns only (Spark's struct JSON); the rescued-data and
``_metadata`` columns are added from the options each time. Versions are created with
exclusive create, so two writers of the same version cannot overwrite each other: the
loser re-reads and finds its columns there or reports them again on the next run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from deltaflow._atomic import put_if_absent
from deltaflow.errors import InvalidOptionError
from deltaflow.ingest.cloudfiles._options import METADATA_COLUMN, CloudFilesOptions
from deltaflow.table import _uri

SCHEMAS_DIR = "_schemas"
# Inference reads at most this much of each sample file: enough lines to see the
# columns, without letting one huge file stall query start.
SAMPLE_BYTES_PER_FILE = 4 * 1024 * 1024

_SIMPLE_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "str": StringType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "double": DoubleType(),
    "float": FloatType(),
    "real": FloatType(),
    "boolean": BooleanType(),
    "bool": BooleanType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
    "binary": BinaryType(),
}
_DECIMAL = re.compile(r"^decimal\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$")

METADATA_TYPE = StructType(
    [
        StructField("file_path", StringType()),
        StructField("file_name", StringType()),
        StructField("file_size", LongType()),
        StructField("file_modification_time", TimestampType()),
    ]
)


# ---- hints -----------------------------------------------------------------------------


def parse_hints(text: str) -> list[StructField]:
    """``"a INT, b DECIMAL(10, 2)"`` as fields (top-level columns, simple types)."""
    fields: list[StructField] = []
    for part in _split_top_level(text):
        name, _, type_text = part.strip().partition(" ")
        name = name.strip("`")
        data_type = _simple_type(type_text.strip())
        if not name or data_type is None:
            raise InvalidOptionError(
                f"cloudFiles.schemaHints: cannot read {part.strip()!r}. Write hints as"
                " 'column TYPE, ...' with a simple type (STRING, INT, BIGINT, DOUBLE, FLOAT,"
                " BOOLEAN, DATE, TIMESTAMP, TIMESTAMP_NTZ, BINARY, DECIMAL(p,s)).",
                option="cloudFiles.schemaHints",
            )
        fields.append(StructField(name, data_type, True))
    return fields


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _simple_type(text: str) -> DataType | None:
    lowered = text.lower()
    match = _DECIMAL.match(lowered)
    if match:
        return DecimalType(int(match.group(1)), int(match.group(2) or 0))
    return _SIMPLE_TYPES.get(lowered)


def apply_hints(schema: StructType, hints: Sequence[StructField]) -> StructType:
    """Hinted columns take the hint's type; hinted columns not in ``schema`` are added."""
    by_name = {h.name.lower(): h for h in hints}
    fields = []
    for field in schema.fields:
        hint = by_name.pop(field.name.lower(), None)
        fields.append(StructField(field.name, hint.dataType, True) if hint else field)
    fields.extend(by_name.values())
    return StructType(fields)


# ---- versions --------------------------------------------------------------------------


def _schemas_dir(schema_location: str) -> str:
    return os.path.join(_uri.local_path(schema_location), SCHEMAS_DIR)


def latest_schema(schema_location: str) -> tuple[int, StructType] | None:
    """The newest recorded schema version and its data columns, or None."""
    folder = _schemas_dir(schema_location)
    try:
        versions = [int(n) for n in os.listdir(folder) if n.isdigit()]
    except FileNotFoundError:
        return None
    if not versions:
        return None
    version = max(versions)
    with open(os.path.join(folder, str(version)), encoding="utf-8") as handle:
        record = json.load(handle)
    return version, StructType.fromJson(record["dataSchema"])


def record_schema(schema_location: str, version: int, data_schema: StructType) -> bool:
    """Write schema ``version``; False when that version exists already."""
    folder = _schemas_dir(schema_location)
    os.makedirs(folder, exist_ok=True)
    record = {"formatVersion": 1, "version": version, "dataSchema": data_schema.jsonValue()}
    return put_if_absent(os.path.join(folder, str(version)), json.dumps(record).encode())


def output_schema(data_schema: StructType, options: CloudFilesOptions) -> StructType:
    """The stream's schema: data columns, then the rescued-data and metadata columns."""
    fields = list(data_schema.fields)
    names = {f.name.lower() for f in fields}
    rescued = options.rescued_data_column
    if rescued and rescued.lower() not in names:
        fields.append(StructField(rescued, StringType(), True))
    if options.include_file_metadata and METADATA_COLUMN not in names:
        fields.append(StructField(METADATA_COLUMN, METADATA_TYPE, True))
    return StructType(fields)


# ---- inference -------------------------------------------------------------------------


def infer_data_schema(files: Iterable[str], options: CloudFilesOptions) -> StructType:
    """The data columns of the sample ``files`` (URIs), hints not yet applied."""
    columns: dict[str, list[Any]] = {}
    parquet_fields: dict[str, DataType] = {}
    for uri in files:
        if options.format == "parquet":
            for field in _parquet_fields(uri):
                parquet_fields.setdefault(field.name, field.dataType)
            continue
        text = _read_sample(uri)
        rows = json_records(text) if options.format == "json" else csv_records(text)
        for row in rows:
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
    if options.format == "parquet":
        return StructType([StructField(n, t, True) for n, t in parquet_fields.items()])
    fields = []
    for name, values in columns.items():
        data_type = (
            infer_type(values, from_text=options.format == "csv")
            if options.infer_column_types
            else StringType()
        )
        fields.append(StructField(name, data_type, True))
    return StructType(fields)


def infer_type(values: Sequence[Any], *, from_text: bool) -> DataType:
    """The narrowest of boolean / bigint / double / string that holds every value."""
    present = [v for v in values if v is not None and v != ""]
    if not present:
        return StringType()
    if from_text:
        present = [_typed_text(v) if isinstance(v, str) else v for v in present]
    kinds = {type(v) for v in present}
    if kinds == {bool}:
        return BooleanType()
    if kinds == {int}:
        return LongType()
    if kinds <= {int, float}:
        return DoubleType()
    if kinds <= {dict, list} and not from_text:
        try:
            return from_arrow(pa.array(present).type)
        except (pa.ArrowException, TypeError, ValueError):
            return StringType()
    return StringType()


def _typed_text(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    return text


def from_arrow(arrow_type: pa.DataType) -> DataType:
    from deltaflow.spark._compat import from_arrow_type

    if pa.types.is_null(arrow_type):
        return StringType()
    if pa.types.is_struct(arrow_type):
        return StructType(
            [
                StructField(arrow_type.field(i).name, from_arrow(arrow_type.field(i).type), True)
                for i in range(arrow_type.num_fields)
            ]
        )
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        from pyspark.sql.types import ArrayType

        return ArrayType(from_arrow(arrow_type.value_type), True)
    if pa.types.is_large_string(arrow_type):
        return StringType()
    if pa.types.is_timestamp(arrow_type):
        return TimestampType() if arrow_type.tz else TimestampNTZType()
    return from_arrow_type(arrow_type)


def _parquet_fields(uri: str) -> list[StructField]:
    fs, path = _uri.filesystem(uri)
    with fs.open_input_file(path) as handle:
        schema = pq.read_schema(handle)
    return [StructField(f.name, from_arrow(f.type), True) for f in schema]


def _read_sample(uri: str) -> str:
    fs, path = _uri.filesystem(uri)
    with fs.open_input_stream(path) as handle:
        data = handle.read(SAMPLE_BYTES_PER_FILE)
    if len(data) == SAMPLE_BYTES_PER_FILE:  # drop the last, probably cut, line
        data = data[: data.rfind(b"\n") + 1] or data
    return data.decode("utf-8", errors="replace")


# ---- records, shared by inference and reading -------------------------------------------


def json_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects of NDJSON ``text``; lines that are not objects are skipped."""
    found = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def csv_records(text: str) -> list[dict[str, Any]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        return []
    return [dict(zip(header, row, strict=False)) for row in reader if len(row) == len(header)]
