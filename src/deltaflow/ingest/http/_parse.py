"""Request bodies to Arrow tables of a table's schema, or per-record errors.

The hot path does no per-event Python work: the whole body goes through Arrow's JSON
reader with the table's schema as explicit schema (``pyarrow.json``), then whole-column
casts for the types that reader cannot produce from JSON text (dates, binary).
Only when that fails is the body searched for the offending records: bisection by the
same reader narrows it to single lines, and each bad line is diagnosed field by field
(``RecordError``: record index, line, field, reason). A request is all or nothing: one
bad record rejects the request (clients fix and resend it whole; no partial commits to
track on retry).

Accepted bodies: NDJSON (one JSON object per line, blank lines ignored), a JSON array
of objects, or a single JSON object (``Content-Type: application/json``). Field names
are matched case-sensitively. Unknown top-level fields are an error, or, for tables
configured with ``unknown_fields = "rescue"``, moved as JSON into ``_rescued_data``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from deltaflow.errors import DeltaflowError
from deltaflow.ingest.http._config import RESCUED_DATA_COLUMN
from deltaflow.table.errors import UnsupportedFeatureError

# A rejected request reports at most this many records: enough to fix a systematic
# mistake, small enough that a body of 100k bad lines does not answer with megabytes.
MAX_RECORD_ERRORS = 100
_EXCERPT = 60


@dataclass(frozen=True)
class RecordError:
    index: int  # 0-based position of the record in the body
    line: int | None  # 1-based line (NDJSON bodies)
    field: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.line is not None:
            out["line"] = self.line
        out["field"] = self.field
        out["reason"] = self.reason
        return out


class BodyError(DeltaflowError):
    """The body was refused; ``code`` is machine-readable, ``records`` says where."""

    code: str
    records: tuple[RecordError, ...]
    truncated: bool
    status: int

    def __init__(
        self,
        code: str,
        message: str,
        records: tuple[RecordError, ...] = (),
        *,
        truncated: bool = False,
        status: int = 400,
    ) -> None:
        super().__init__(message, code=code, records=records, truncated=truncated, status=status)


def check_supported(schema: pa.Schema, table_uri: str) -> None:
    """Refuse, at start-up, column types the JSON reader cannot fill."""
    for field in schema:
        if _contains(field.type, pa.types.is_map):
            raise UnsupportedFeatureError(
                f"column {field.name!r} of {table_uri} is a map: HTTP ingest cannot fill map"
                " columns yet. Use a struct or a JSON string column instead.",
                table_uri=table_uri,
                feature="map columns in HTTP ingest",
            )


def _contains(t: pa.DataType, predicate: Any) -> bool:
    if predicate(t):
        return True
    if pa.types.is_struct(t):
        return any(_contains(t.field(i).type, predicate) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _contains(t.value_type, predicate)
    return False


def _wire_type(t: pa.DataType) -> pa.DataType:
    """The type Arrow's JSON reader reads a column as (text for dates and binary)."""
    if pa.types.is_date(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_wire_type(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_wire_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_wire_type(t.value_type)))
    return t


class _Invalid(Exception):
    pass


class RecordParser:
    """Parses bodies for one table. Thread-safe (no mutable state)."""

    def __init__(
        self, schema: pa.Schema, *, unknown_fields: str = "reject", max_event_bytes: int
    ) -> None:
        self.schema = schema
        self.rescue = unknown_fields == "rescue" and RESCUED_DATA_COLUMN in schema.names
        self.max_event_bytes = max_event_bytes
        # Nullability is checked after parsing so each missing value gets a record error.
        self._wire = pa.schema([pa.field(f.name, _wire_type(f.type)) for f in schema])
        self._names = set(schema.names)
        self._required = [f.name for f in schema if not f.nullable]

    # ---- entry point -----------------------------------------------------------------

    def parse(self, body: bytes, content_type: str = "") -> pa.Table:
        if not body.strip():
            raise BodyError(
                "empty_body",
                "The request body is empty: send NDJSON (one JSON object per line) or a"
                " JSON array of objects.",
            )
        _check_utf8(body)
        first = body.lstrip()[:1]
        if first == b"[":
            lines, numbered = self._array_lines(body), False
            ndjson = b"\n".join(lines)
        elif first == b"{" and "application/json" in content_type and _single_object(body):
            lines, numbered = [orjson.dumps(orjson.loads(body))], False
            ndjson = lines[0]
        else:
            ndjson, numbered, lines = body, True, []
            if len(body) > self.max_event_bytes:
                lines = body.split(b"\n")
                self._check_line_sizes(lines)
        try:
            return self._read(ndjson)
        except _Invalid:
            pass
        if not lines:
            lines = ndjson.split(b"\n")
        if self.rescue:
            lines = self._rescue(lines, numbered)
            try:
                return self._read(b"\n".join(lines))
            except _Invalid:
                pass
        raise self._explain(lines, numbered)

    # ---- fast path -------------------------------------------------------------------

    def _read(self, ndjson: bytes) -> pa.Table:
        """The table of ``ndjson``; raises :class:`_Invalid` on any bad record."""
        try:
            table = pj.read_json(
                io.BytesIO(ndjson),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(ndjson) + 1),
                parse_options=pj.ParseOptions(
                    explicit_schema=self._wire, unexpected_field_behavior="error"
                ),
            )
            columns = []
            for field, column in zip(self.schema, table.columns, strict=True):
                if field.name in self._required and column.null_count:
                    raise _Invalid()
                columns.append(column if column.type == field.type else column.cast(field.type))
            return pa.Table.from_arrays(columns, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise _Invalid() from exc

    def _parses(self, ndjson: bytes) -> bool:
        if not ndjson.strip():
            return True
        try:
            self._read(ndjson)
        except _Invalid:
            return False
        return True

    # ---- shapes of bodies ------------------------------------------------------------

    def _array_lines(self, body: bytes) -> list[bytes]:
        try:
            items = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BodyError(
                "malformed_json",
                f"The body starts with '[' but is not valid JSON: {exc}. Send a JSON array"
                " of objects, or NDJSON (one object per line).",
            ) from exc
        if not isinstance(items, list):
            raise BodyError("malformed_json", "The body is not a JSON array of objects.")
        if not items:
            raise BodyError("empty_body", "The JSON array is empty: send at least one record.")
        errors: list[RecordError] = []
        lines = []
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                reason = f"a record must be a JSON object, not {_kind(item)}"
                errors.append(RecordError(index, None, None, reason))
                continue
            line = orjson.dumps(item)
            if len(line) > self.max_event_bytes:
                errors.append(RecordError(index, None, None, self._too_big(len(line))))
            lines.append(line)
        if errors:
            raise _record_errors(errors)
        return lines

    def _check_line_sizes(self, lines: list[bytes]) -> None:
        errors = []
        index = 0
        for number, line in enumerate(lines, start=1):
            if len(line) > self.max_event_bytes:
                errors.append(RecordError(index, number, None, self._too_big(len(line))))
            if line.strip():
                index += 1
        if errors:
            raise _record_errors(errors)

    def _too_big(self, size: int) -> str:
        return (
            f"the record is {size} bytes, above the limit of {self.max_event_bytes}"
            " (server option max_event_bytes)"
        )

    def _rescue(self, lines: list[bytes], numbered: bool) -> list[bytes]:
        """Lines with unknown top-level fields moved into ``_rescued_data`` (JSON)."""
        out = []
        for line in lines:
            if not line.strip():
                out.append(line)
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                out.append(line)  # reported by _explain
                continue
            if not isinstance(record, dict):
                out.append(line)
                continue
            unknown = {k: v for k, v in record.items() if k not in self._names}
            if unknown:
                kept = {k: v for k, v in record.items() if k in self._names}
                kept[RESCUED_DATA_COLUMN] = orjson.dumps(unknown).decode()
                line = orjson.dumps(kept)
            out.append(line)
        return out

    # ---- slow path: find and explain the bad records ---------------------------------

    def _explain(self, lines: list[bytes], numbered: bool) -> BodyError:
        bad: list[int] = []
        self._bisect(lines, 0, len(lines), bad)
        index_of: dict[int, int] = {}
        index = 0
        for number, line in enumerate(lines):
            if line.strip():
                index_of[number] = index
                index += 1
        errors: list[RecordError] = []
        for position in bad:
            line_no = position + 1 if numbered else None
            for field, reason in self._diagnose(lines[position]):
                errors.append(RecordError(index_of.get(position, 0), line_no, field, reason))
        if not errors:  # the whole failed but no part did: report what the reader said
            errors.append(RecordError(0, None, None, self._whole_error(b"\n".join(lines))))
        return _record_errors(errors, truncated=len(bad) >= MAX_RECORD_ERRORS)

    def _bisect(self, lines: list[bytes], low: int, high: int, bad: list[int]) -> None:
        if len(bad) >= MAX_RECORD_ERRORS or high <= low:
            return
        if self._parses(b"\n".join(lines[low:high])):
            return
        if high - low == 1:
            bad.append(low)
            return
        middle = (low + high) // 2
        self._bisect(lines, low, middle, bad)
        self._bisect(lines, middle, high, bad)

    def _whole_error(self, ndjson: bytes) -> str:
        try:
            self._read(ndjson)
        except _Invalid as exc:
            return f"the records do not fit the table schema: {exc.__cause__}"
        return "the records do not fit the table schema"

    def _diagnose(self, line: bytes) -> list[tuple[str | None, str]]:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return [(None, f"not valid JSON: {exc}")]
        if not isinstance(record, dict):
            return [(None, f"a record must be a JSON object, not {_kind(record)}")]
        problems: list[tuple[str | None, str]] = []
        for key in record:
            if key not in self._names:
                problems.append(
                    (key, "unknown field: the table has no such column (names are case-sensitive)")
                )
        for field in self.schema:
            value = record.get(field.name)
            if value is None:
                if not field.nullable:
                    problems.append((field.name, "required field is missing or null"))
                continue
            reason = self._field_problem(field, value)
            if reason is not None:
                problems.append((field.name, reason))
        return problems or [(None, self._whole_error(line))]

    def _field_problem(self, field: pa.Field, value: Any) -> str | None:
        single = pa.schema([pa.field(field.name, _wire_type(field.type))])
        text = orjson.dumps({field.name: value})
        try:
            table = pj.read_json(
                io.BytesIO(text),
                parse_options=pj.ParseOptions(
                    explicit_schema=single, unexpected_field_behavior="error"
                ),
            )
            if table.column(0).type != field.type:
                pc.cast(table.column(0), field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            detail = str(exc).split("\n")[0].removeprefix("JSON parse error: ")
            return (
                f"expected {_type_name(field.type)}, got {_kind(value)} {_excerpt(value)}"
                f" ({detail})"
            )
        return None


def _record_errors(errors: list[RecordError], *, truncated: bool = False) -> BodyError:
    shown = tuple(errors[:MAX_RECORD_ERRORS])
    first = shown[0]
    where = f"line {first.line}" if first.line is not None else f"record {first.index}"
    field = f", field {first.field!r}" if first.field else ""
    return BodyError(
        "invalid_records",
        f"{len(shown)}{'+' if truncated or len(errors) > len(shown) else ''} record(s) do not"
        f" fit the table (first: {where}{field}: {first.reason}). Nothing was written: fix"
        " the records listed in 'records' and resend the whole request.",
        shown,
        truncated=truncated or len(errors) > len(shown),
    )


def _check_utf8(body: bytes) -> None:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        reason = f"not valid UTF-8 (byte offset {exc.start} of the body)"
        raise _record_errors([RecordError(line - 1, line, None, reason)]) from None


def _single_object(body: bytes) -> bool:
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _excerpt(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _type_name(t: pa.DataType) -> str:
    names = {
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.string(): "STRING",
        pa.bool_(): "BOOLEAN",
        pa.date32(): "DATE (YYYY-MM-DD)",
        pa.binary(): "BINARY (a string)",
    }
    if t in names:
        return names[t]
    if pa.types.is_timestamp(t):
        return "TIMESTAMP (ISO 8601 text)" if t.tz else "TIMESTAMP_NTZ (ISO 8601 text)"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    return str(t)
