"""One value of a landing file as a Python value of a Spark type, or a misfit.

JSON values arrive typed (numbers, booleans, objects), CSV values as text
(``from_text``); a value that does not fit its column raises :class:`Misfit`, and the
caller rescues it (``rescuedDataColumn``) or fails the file.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pyarrow as pa
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
    TimestampNTZType,
    TimestampType,
)

_INT_RANGES = {
    ByteType: (-(2**7), 2**7 - 1),
    ShortType: (-(2**15), 2**15 - 1),
    IntegerType: (-(2**31), 2**31 - 1),
    LongType: (-(2**63), 2**63 - 1),
}


class Misfit(Exception):
    """A value that does not fit its column's type (control flow, never leaves ingest)."""


def convert(value: Any, data_type: DataType, *, from_text: bool) -> Any:
    """``value`` as a Python value of ``data_type``; raises :class:`Misfit`."""
    if value is None:
        return None
    try:
        return _CONVERTERS[type(data_type)](value, data_type, from_text)
    except KeyError:
        return _complex(value, data_type)
    except (ValueError, TypeError, ArithmeticError, OverflowError) as exc:
        raise Misfit() from exc


def _string(value: Any, _: DataType, __: bool) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _integral(value: Any, data_type: DataType, from_text: bool) -> int:
    if isinstance(value, str) and from_text:
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise Misfit()
    low, high = _INT_RANGES[type(data_type)]
    if not low <= value <= high:
        raise Misfit()
    return value


def _fractional(value: Any, _: DataType, from_text: bool) -> float:
    if isinstance(value, str) and from_text:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Misfit()
    return float(value)


def _boolean(value: Any, _: DataType, from_text: bool) -> bool:
    if isinstance(value, str) and from_text and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise Misfit()
    return value


def _date(value: Any, _: DataType, __: bool) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if not isinstance(value, str):
        raise Misfit()
    return dt.date.fromisoformat(value.strip())


def _timestamp(value: Any, _: DataType, __: bool) -> dt.datetime:
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.strip())
    else:
        raise Misfit()
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _timestamp_ntz(value: Any, _: DataType, __: bool) -> dt.datetime:
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.strip())
    else:
        raise Misfit()
    if parsed.tzinfo:
        raise Misfit()
    return parsed


def _decimal(value: Any, data_type: DataType, __: bool) -> decimal.Decimal:
    assert isinstance(data_type, DecimalType)
    if isinstance(value, bool) or not isinstance(value, (str, int, float, decimal.Decimal)):
        raise Misfit()
    number = decimal.Decimal(str(value).strip())
    quantized = number.quantize(decimal.Decimal(1).scaleb(-data_type.scale))
    if quantized != number or len(quantized.as_tuple().digits) > data_type.precision:
        raise Misfit()
    return quantized


def _binary(value: Any, _: DataType, __: bool) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise Misfit()
    return value.encode("utf-8")


def _complex(value: Any, data_type: DataType) -> Any:
    from deltaflow.spark._compat import to_arrow_type

    try:
        pa.scalar(value, type=to_arrow_type(data_type))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise Misfit() from exc
    return value


_CONVERTERS: dict[type[DataType], Any] = {
    StringType: _string,
    ByteType: _integral,
    ShortType: _integral,
    IntegerType: _integral,
    LongType: _integral,
    FloatType: _fractional,
    DoubleType: _fractional,
    BooleanType: _boolean,
    DateType: _date,
    TimestampType: _timestamp,
    TimestampNTZType: _timestamp_ntz,
    DecimalType: _decimal,
    BinaryType: _binary,
}
