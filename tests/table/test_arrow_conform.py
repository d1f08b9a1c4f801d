"""``_arrow.conform`` on structs with required children (the shape of a VARIANT)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltaflow.table import _arrow

VARIANT = pa.struct(
    [
        pa.field("value", pa.binary(), nullable=False),
        pa.field("metadata", pa.binary(), nullable=False),
    ]
)


def _struct(values: list[bytes | None], null_rows: list[bool]) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [pa.array(values, pa.binary()), pa.array(values, pa.binary())],
        fields=list(VARIANT),
        mask=pa.array(null_rows),
    )


def _written(array: pa.Array) -> pa.Table:
    sink = io.BytesIO()
    pq.write_table(pa.table({"v": array}), sink)
    return pq.read_table(io.BytesIO(sink.getvalue()))


def test_a_null_row_over_required_children_is_written_and_read_back_null():
    array = _struct([b"a", None, b"c"], [False, True, False]).slice(0)
    with pytest.raises(pa.ArrowInvalid, match="non-nullable"):
        _written(array)
    conformed = _arrow.conform(array, VARIANT, VARIANT, len(array))
    assert conformed.type.equals(VARIANT)
    back = _written(conformed).column("v").to_pylist()
    assert back == [{"value": b"a", "metadata": b"a"}, None, {"value": b"c", "metadata": b"c"}]


def test_a_slice_keeps_its_rows():
    array = _struct([b"a", None, b"c", None], [False, True, False, True]).slice(1, 3)
    conformed = _arrow.conform(array, VARIANT, VARIANT, len(array))
    assert conformed.to_pylist() == [None, {"value": b"c", "metadata": b"c"}, None]


def test_a_null_under_a_valid_row_is_left_for_the_writer_to_refuse():
    array = _struct([b"a", None], [False, False])
    conformed = _arrow.conform(array, VARIANT, VARIANT, len(array))
    with pytest.raises(pa.ArrowInvalid, match="non-nullable"):
        _written(conformed)
