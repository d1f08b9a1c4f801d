"""Partition values: Delta's string encoding and Hive-style directory names.

Delta stores every partition value as a string (or null) in the log; the table
schema gives its type. Directory names follow Spark's escaping so that tables we
write look like the ones delta-spark writes.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

# Characters Spark's ExternalCatalogUtils.escapePathName escapes in directory names.
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^") | {chr(c) for c in range(0x20)}


def escape_path_name(value: str) -> str:
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


def partition_dir(columns: list[str], values: dict[str, str | None]) -> str:
    """``a=1/b=x%3Ay`` for the given serialized values (null -> Hive's default name)."""
    parts = []
    for column in columns:
        value = values.get(column)
        encoded = HIVE_NULL if value is None or value == "" else escape_path_name(value)
        parts.append(f"{escape_path_name(column)}={encoded}")
    return "/".join(parts)


def serialize_partition_value(value: Any) -> str | None:
    """Delta's string form of a typed partition value (protocol: Partition Value Serialization)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_partition_value(raw: str | None, type_name: str) -> Any:
    """The Python value of a serialized partition value of Delta primitive type ``type_name``."""
    if raw is None:
        return None
    if raw == "" and type_name != "string":
        return None
    if type_name == "string":
        return raw
    if type_name in ("long", "integer", "short", "byte"):
        return int(raw)
    if type_name in ("double", "float"):
        return float(raw)
    if type_name == "boolean":
        return raw.lower() == "true"
    if type_name == "date":
        return dt.date.fromisoformat(raw[:10])
    if type_name in ("timestamp", "timestamp_ntz"):
        return _parse_timestamp(raw, utc=type_name == "timestamp")
    if type_name.startswith("decimal"):
        return decimal.Decimal(raw)
    if type_name == "binary":
        return raw.encode("latin-1")
    raise ValueError(f"unsupported partition column type {type_name!r}")


def _parse_timestamp(raw: str, *, utc: bool) -> dt.datetime:
    text = raw.strip().replace("T", " ")
    offset = None
    if text.endswith("Z"):
        text, offset = text[:-1], dt.timezone.utc
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is None and offset is not None:
        value = value.replace(tzinfo=offset)
    if utc:
        # Delta writes timestamp partition values in UTC; naive strings mean UTC.
        value = value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value
        return value.astimezone(dt.timezone.utc)
    return value.replace(tzinfo=None)
