"""Landing files to Arrow record batches, keeping whatever does not fit.

Runs in executors. Every value is checked against the stream's schema: a value that
does not fit its column's type becomes null and its original text goes to the rescued
data column, as JSON ``{"column": original, ..., "_file_path": uri}``; a line that is
not a JSON object (or a CSV row with the wrong number of fields) is kept whole as
``{"_corrupt_record": line, "_file_path": uri}``. Columns the schema lacks are handled
by the schema evolution mode (see :func:`_evolve`).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from deltaflow.ingest.cloudfiles import _schemas
from deltaflow.ingest.cloudfiles._discovery import LandingFile
from deltaflow.ingest.cloudfiles._options import METADATA_COLUMN, CloudFilesOptions
from deltaflow.ingest.cloudfiles._values import Misfit, convert
from deltaflow.ingest.cloudfiles.errors import (
    CloudFilesError,
    MalformedRecordError,
    NewColumnsError,
)
from deltaflow.table import _uri

BATCH_ROWS = 10_000
# Larger JSON files are read in chunks, row by row, so memory stays bounded.
FAST_JSON_MAX_BYTES = 256 * 1024 * 1024
# Spark types whose JSON values Arrow's reader parses exactly as :func:`convert` does
# (integers are read as int64 and then cast safely, so an overflow falls back).
_FAST_JSON_TYPES: dict[type[DataType], pa.DataType] = {
    StringType: pa.string(),
    LongType: pa.int64(),
    IntegerType: pa.int64(),
    ShortType: pa.int64(),
    ByteType: pa.int64(),
    DoubleType: pa.float64(),
    FloatType: pa.float64(),
    BooleanType: pa.bool_(),
}
# Strings that Arrow's cast and ``datetime.fromisoformat`` (Python >= 3.11) read alike:
# both reject the same impossible dates, times and offsets within these shapes, so a
# file whose values all match is cast whole and any other file goes row by row. Years
# from 1000 only (Arrow accepts year 0, Python does not); no surrounding spaces.
_FAST_DATE = r"^[1-9]\d{3}-\d{2}-\d{2}$"
_FAST_TIMESTAMP = (
    r"^[1-9]\d{3}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)?$"
)
_ZONED = r"(Z|[+-]\d{2}:\d{2})$"
READ_CHUNK = 8 * 1024 * 1024
# Values kept per new column to infer its type (cloudFiles.inferColumnTypes).
NEW_COLUMN_SAMPLE = 1000
CORRUPT_KEY = "_corrupt_record"
FILE_PATH_KEY = "_file_path"


@dataclass(frozen=True)
class RecordLayout:
    """What a task needs to shape rows: travels inside each input partition."""

    options: CloudFilesOptions
    schema_json: dict[str, Any]  # the stream's output schema (Spark struct JSON)
    data_columns: tuple[str, ...]

    @property
    def schema(self) -> StructType:
        return StructType.fromJson(self.schema_json)


def read_landing_file(file: LandingFile, layout: RecordLayout) -> Iterator[pa.RecordBatch]:
    from deltaflow.spark._compat import to_arrow_schema

    schema = layout.schema
    arrow_schema = to_arrow_schema(schema)
    if layout.options.format == "parquet":
        table = _open_parquet(file, layout)
        fast = _parquet_batches(table, file, layout, arrow_schema)
        if fast is not None:
            yield from fast
            return
        rows = _parquet_rows(table, file, layout, schema)
    elif layout.options.format == "text":
        rows = _plain_text_rows(file, layout, schema)
    else:
        parsed = _json_table(file, layout, schema) if layout.options.format == "json" else None
        fast = None if parsed is None else _parquet_batches(parsed, file, layout, arrow_schema)
        if fast is not None:
            yield from fast
            return
        rows = _text_rows(file, layout, schema)
    columns: list[list[Any]] = [[] for _ in schema.fields]
    for row in rows:
        for i, value in enumerate(row):
            columns[i].append(value)
        if len(columns[0]) >= BATCH_ROWS:
            yield _batch(columns, arrow_schema)
            columns = [[] for _ in schema.fields]
    if columns and columns[0]:
        yield _batch(columns, arrow_schema)


def _batch(columns: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    arrays = [
        pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---- JSON and CSV ----------------------------------------------------------------------


def _text_rows(file: LandingFile, layout: RecordLayout, schema: StructType) -> Iterator[list[Any]]:
    """Rows of a JSON or CSV file, read in chunks so memory stays bounded by a batch.

    Columns the schema lacks are collected on the way and handed to :func:`_evolve` at
    the end of the file: if that stops the stream, the task fails and none of the rows
    already yielded are committed.
    """
    from_text = layout.options.format == "csv"
    known = {c.lower() for c in layout.data_columns}
    if layout.options.rescued_data_column:
        known.add(layout.options.rescued_data_column.lower())
    new: dict[str, list[Any]] = {}
    meta = _metadata_value(file)
    fs, path = _uri.filesystem(file.uri)
    with fs.open_input_stream(path) as handle:
        lines = read_lines(handle)
        records = _csv_lines(lines, layout.options.header) if from_text else _json_lines(lines)
        for index, (record, raw) in enumerate(records):
            for key, value in (record or {}).items():
                if key.lower() not in known:
                    seen = new.setdefault(key, [])
                    if len(seen) < NEW_COLUMN_SAMPLE:
                        seen.append(value)
            yield _shape(record, raw, schema, layout, file, index, meta, from_text=from_text)
    if new:
        _evolve(new, file, layout, from_text=from_text)


def _plain_text_rows(
    file: LandingFile, layout: RecordLayout, schema: StructType
) -> Iterator[list[Any]]:
    """format text: a ``value`` row per line (or per file with ``wholeText``), as
    ``spark.read.text``; the only other column a text stream can have is ``_metadata``."""
    meta = _metadata_value(file)
    fs, path = _uri.filesystem(file.uri)
    with fs.open_input_stream(path) as handle:
        if layout.options.whole_text:
            lines: Iterable[str] = [handle.read().decode("utf-8", errors="replace")]
        else:
            lines = read_lines(handle)
        for line in lines:
            yield [meta if f.name == METADATA_COLUMN else line for f in schema.fields]


def _json_table(file: LandingFile, layout: RecordLayout, schema: StructType) -> pa.Table | None:
    """The file parsed whole by Arrow's JSON reader, or None when the row-by-row path must
    decide: a column type the fast path does not parse exactly as that path would, a
    record that is not one object on one line, a value of another JSON type, an unknown
    or case-mismatched key, invalid UTF-8. Every such file falls back as a whole, so
    both paths give the same rows (tests compare them)."""
    if file.size > FAST_JSON_MAX_BYTES or file.size == 0:
        return None
    fields = []
    temporal: dict[str, DataType] = {}  # parsed as strings, cast below
    for field in schema.fields:
        if field.name not in layout.data_columns:
            continue
        parse_type = _FAST_JSON_TYPES.get(type(field.dataType))
        if isinstance(field.dataType, (TimestampType, DateType)):
            parse_type = pa.string()
            temporal[field.name] = field.dataType
        if parse_type is None:
            return None
        fields.append(pa.field(field.name, parse_type))
    fs, path = _uri.filesystem(file.uri)
    with fs.open_input_stream(path) as handle:
        data = handle.read()
    records = _count_object_lines(data)
    if not records:
        return None
    from pyarrow import json as pa_json

    try:
        table = pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(block_size=max(len(data) + 1, 1 << 20)),
            parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema(fields), unexpected_field_behavior="error"
            ),
        )
        table.validate(full=True)  # Arrow's reader lets invalid UTF-8 through
        for name, data_type in temporal.items():
            index = table.schema.get_field_index(name)
            table = table.set_column(index, name, _cast_iso_strings(table[name], data_type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table if table.num_rows == records else None


def _count_object_lines(data: bytes) -> int | None:
    """The number of non-blank lines, or None when one of them does not start with ``{``
    and end with ``}`` (surrounding whitespace aside): Arrow reads ``{..} {..}`` as two
    records and a bare ``null`` line as a row of nulls, where the row-by-row path rescues
    such lines, so they leave the fast path here."""
    body = data[:-1] if data.endswith(b"\n") else data
    newlines = body.count(b"\n")
    if (
        body.startswith(b"{")
        and body.endswith(b"}")
        and body.count(b"\n{") == newlines
        and body.count(b"}\n") == newlines
    ):
        return newlines + 1  # the usual file: every line exactly one "{...}", no blanks
    records = 0
    for line in data.split(b"\n"):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[:1] != b"{" or stripped[-1:] != b"}":
            return None
        records += 1
    return records


def _cast_iso_strings(column: pa.ChunkedArray, data_type: DataType) -> pa.ChunkedArray:
    """ISO 8601 strings as dates or UTC timestamps, as :func:`convert` reads them (a naive
    timestamp is UTC); raises ``ArrowInvalid`` when any value needs the row-by-row path."""
    is_date = isinstance(data_type, DateType)
    shaped = pc.match_substring_regex(column, _FAST_DATE if is_date else _FAST_TIMESTAMP)
    if pc.all(shaped).as_py() is False:  # None: every value is null
        raise pa.ArrowInvalid("a value is not a plain ISO 8601 date or timestamp")
    if is_date:
        return column.cast(pa.date32())
    naive_as_utc = pc.binary_join_element_wise(column, "Z", "")
    zoned = pc.if_else(pc.match_substring_regex(column, _ZONED), column, naive_as_utc)
    return zoned.cast(pa.timestamp("us", tz="UTC"))


def read_lines(handle: Any) -> Iterator[str]:
    """The lines of a binary stream. Only ``\\n`` ends a line (``\\r\\n`` too): JSON
    strings may hold U+2028 and friends, which ``str.splitlines`` would split on."""
    rest = b""
    while True:
        chunk = handle.read(READ_CHUNK)
        if not chunk:
            break
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for part in parts:
            yield part.removesuffix(b"\r").decode("utf-8", errors="replace")
    if rest:
        yield rest.removesuffix(b"\r").decode("utf-8", errors="replace")


def _json_lines(lines: Iterable[str]) -> Iterator[tuple[dict[str, Any] | None, str]]:
    for line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            yield None, line
            continue
        yield (value, line) if isinstance(value, dict) else (None, line)


def _csv_lines(lines: Iterable[str], header: bool) -> Iterator[tuple[dict[str, Any] | None, str]]:
    # Huge fields are data to keep, not an error (the csv module's default cap is 128 KiB).
    csv.field_size_limit(2**31 - 1)
    names: list[str] | None = None
    for row in csv.reader(line + "\n" for line in lines):  # keeps quoted newlines
        if names is None:
            if header:
                names = row
                continue
            names = [f"_c{i}" for i in range(len(row))]
        if not row:
            continue
        if len(row) != len(names):
            yield None, _csv_text(row)
        else:
            yield {n: (v if v != "" else None) for n, v in zip(names, row, strict=True)}, ""


def _csv_text(row: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(row)
    return out.getvalue()


def _shape(
    record: dict[str, Any] | None,
    raw: str,
    schema: StructType,
    layout: RecordLayout,
    file: LandingFile,
    index: int,
    meta: dict[str, Any],
    *,
    from_text: bool,
) -> list[Any]:
    rescued_name = layout.options.rescued_data_column
    rescued: dict[str, Any] = {}
    if record is None:
        rescued[CORRUPT_KEY] = raw
        record = {}
    lowered = {k.lower(): k for k in record}
    used: set[str] = set()
    out: list[Any] = []
    for field in schema.fields:
        if field.name == rescued_name:
            out.append(None)  # filled below
            continue
        if field.name == METADATA_COLUMN and field.name not in layout.data_columns:
            out.append(meta)
            continue
        key = field.name if field.name in record else lowered.get(field.name.lower())
        value = record.get(key) if key is not None else None
        if key is not None:
            used.add(key)
        try:
            out.append(convert(value, field.dataType, from_text=from_text))
        except Misfit:
            out.append(None)
            rescued[key or field.name] = value
    if layout.options.evolution_mode == "rescue":
        for key, value in record.items():
            if key not in used and key != rescued_name:
                rescued[key] = value
    if rescued:
        if rescued_name is None or rescued_name not in schema.names:
            raise MalformedRecordError(
                f"Record {index} of {file.uri} does not fit the stream's schema"
                f" ({', '.join(sorted(rescued))}) and the schema has no rescued-data column"
                " to keep it. Add '_rescued_data STRING' to the schema you pass to"
                " .schema(...), or let the source infer the schema.",
                file_path=file.uri,
                record_index=index,
            )
        rescued[FILE_PATH_KEY] = file.uri
        out[schema.names.index(rescued_name)] = json.dumps(rescued, default=str)
    return out


# ---- Parquet ---------------------------------------------------------------------------


def _open_parquet(file: LandingFile, layout: RecordLayout) -> pa.Table:
    """The file's table, once its columns passed the schema evolution mode."""
    fs, path = _uri.filesystem(file.uri)
    with fs.open_input_file(path) as handle:
        table = pq.read_table(handle)
    new = _new_parquet_columns(table, layout)
    if new:
        values = {name: table.column(name).slice(0, NEW_COLUMN_SAMPLE).to_pylist() for name in new}
        _evolve(values, file, layout, from_text=False, arrow=table.schema)
    return table


def _new_parquet_columns(table: pa.Table, layout: RecordLayout) -> list[str]:
    known = {c.lower() for c in layout.data_columns}
    rescued = layout.options.rescued_data_column
    return [n for n in table.column_names if n.lower() not in known and n != rescued]


def _parquet_batches(
    table: pa.Table, file: LandingFile, layout: RecordLayout, arrow_schema: pa.Schema
) -> list[pa.RecordBatch] | None:
    """The file as batches by whole-column casts; None when some value needs rescuing
    (a failed safe cast, a column only matched ignoring case, unexpected columns in
    rescue mode): then the row-by-row path decides value by value."""
    if layout.options.evolution_mode == "rescue" and _new_parquet_columns(table, layout):
        return None
    present = set(table.column_names)
    arrays = []
    for field in arrow_schema:
        if field.name == layout.options.rescued_data_column:
            arrays.append(pa.nulls(table.num_rows, field.type))
        elif field.name == METADATA_COLUMN and field.name not in layout.data_columns:
            meta = _metadata_value(file)
            arrays.append(pa.array([meta] * table.num_rows, type=field.type))
        elif field.name in present:
            try:
                arrays.append(table.column(field.name).cast(field.type, safe=True))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
        elif field.name.lower() in {n.lower() for n in present}:
            return None
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    combined = pa.Table.from_arrays(arrays, schema=arrow_schema)
    return combined.combine_chunks().to_batches(max_chunksize=BATCH_ROWS * 10)


def _parquet_rows(
    table: pa.Table, file: LandingFile, layout: RecordLayout, schema: StructType
) -> Iterator[list[Any]]:
    meta = _metadata_value(file)
    for index, record in enumerate(table.to_pylist()):
        yield _shape(record, "", schema, layout, file, index, meta, from_text=False)


# ---- schema evolution ------------------------------------------------------------------


def _evolve(
    new: dict[str, list[Any]],
    file: LandingFile,
    layout: RecordLayout,
    *,
    from_text: bool,
    arrow: pa.Schema | None = None,
) -> None:
    """``addNewColumns``: record a schema version with the new columns, then stop the
    stream (raise); ``failOnNewColumns``: stop without recording; else carry on."""
    options = layout.options
    if options.evolution_mode in ("rescue", "none"):
        return
    names = tuple(new)
    version: int | None = None
    if options.evolution_mode == "addNewColumns":
        version = _record_new_columns(new, layout, from_text=from_text, arrow=arrow)
        advice = (
            f"The new schema is recorded as version {version} under"
            f" {options.schema_location}/_schemas: restart the query to read them."
        )
    else:
        advice = (
            "cloudFiles.schemaEvolutionMode is failOnNewColumns: give the stream a schema"
            " with these columns, or set the mode to addNewColumns or rescue."
        )
    raise NewColumnsError(
        f"{file.uri} has columns the stream's schema lacks: {', '.join(names)}. {advice}",
        columns=names,
        file_path=file.uri,
        schema_location=options.schema_location,
        schema_version=version,
        mode=options.evolution_mode,
    )


def _record_new_columns(
    new: dict[str, list[Any]], layout: RecordLayout, *, from_text: bool, arrow: pa.Schema | None
) -> int:
    options = layout.options
    for _ in range(10):  # another task may record a version at the same time
        latest = _schemas.latest_schema(options.schema_location)
        version, current = latest if latest else (-1, StructType([]))
        present = {f.name.lower() for f in current.fields}
        added = []
        for name, values in new.items():
            if name.lower() in present:
                continue
            if arrow is not None:
                data_type = _schemas.from_arrow(arrow.field(name).type)
            elif options.infer_column_types:
                data_type = _schemas.infer_type(values, from_text=from_text)
            else:
                data_type = StringType()
            added.append(StructField(name, data_type, True))
        if not added:
            return version
        merged = StructType([*current.fields, *added])
        if _schemas.record_schema(options.schema_location, version + 1, merged):
            return version + 1
    raise CloudFilesError(
        f"Could not record a new schema version in {options.schema_location} after 10"
        " attempts: other tasks kept recording versions at the same time. Nothing was"
        " committed; restart the query.",
        schema_location=options.schema_location,
    )


# ---- values ----------------------------------------------------------------------------


def _metadata_value(file: LandingFile) -> dict[str, Any]:
    return {
        "file_path": file.uri,
        "file_name": os.path.basename(file.uri),
        "file_size": file.size,
        "file_modification_time": dt.datetime.fromtimestamp(file.mtime_ns / 1e9, dt.timezone.utc),
    }
