"""Arrow data shaping: make what a Parquet file holds look exactly like the table.

Files may lack columns added later, hold narrower types (type widening), use
physical column names (column mapping) or other timestamp units. ``conform``
rebuilds an array to the target type, matching struct children by the physical
name tree, so the batch Spark receives always has the table's Arrow schema.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

_CAST = pc.CastOptions  # alias keeps lines short


def read_stream(source: object) -> pa.Table:
    """A pyarrow table of an Arrow C stream (delta-rs hands back arro3 tables and readers).

    ``pa.table(source)`` would do too, but it first checks whether ``source`` is a pandas
    DataFrame and so imports pandas: ~0.25 s in a fresh Python worker (a stream's
    source runner is one per query).
    """
    return pa.RecordBatchReader.from_stream(source).read_all()


def conform(
    array: pa.Array | None, physical: pa.DataType, target: pa.DataType, length: int
) -> pa.Array:
    """``array`` (stored with ``physical`` names) as an array of ``target`` type.

    ``physical`` and ``target`` have the same shape; they differ only in field names
    (column mapping) and possibly in primitive types. A missing array becomes nulls.
    """
    if array is None:
        return pa.nulls(length, target)
    if pa.types.is_struct(target):
        if array.type.equals(target):
            return _required_children_filled(array)
        return _conform_struct(array, physical, target)
    if array.type.equals(target):
        return array
    if pa.types.is_map(target):
        return _conform_map(array, physical, target)
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        return _conform_list(array, physical, target)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
        if array.type.equals(target):
            return array
    return pc.cast(array, options=_CAST(target, allow_time_truncate=True))


def _validity(array: pa.Array) -> pa.Array | None:
    return pc.is_null(array) if array.null_count else None


def _conform_struct(array: pa.Array, physical: pa.DataType, target: pa.DataType) -> pa.Array:
    if not pa.types.is_struct(array.type):
        raise TypeError(f"expected a struct, found {array.type}")
    children = array.flatten()
    index = {array.type.field(i).name: i for i in range(array.type.num_fields)}
    lowered = {name.lower(): i for name, i in index.items()}
    conformed = []
    for i in range(target.num_fields):
        physical_field = physical.field(i)
        position = index.get(physical_field.name, lowered.get(physical_field.name.lower()))
        child = children[position] if position is not None else None
        conformed.append(conform(child, physical_field.type, target.field(i).type, len(array)))
    return pa.StructArray.from_arrays(conformed, fields=list(target), mask=_validity(array))


def _required_children_filled(array: pa.Array) -> pa.Array:
    """``array`` with a value in each required child under a null row.

    A NULL VARIANT reaches us from Spark as a null struct whose required ``value`` and
    ``metadata`` children hold nulls too; Parquet writers refuse nulls in a required
    column even where the parent is null. Those slots are never read, so an empty value
    fills them. A null under a *valid* row stays, and the writer still refuses it.
    """
    if not array.null_count or all(f.nullable for f in array.type):
        return array
    parent_null = pc.is_null(array)
    children = []
    for i, field in enumerate(array.type):
        child = array.field(i)
        if not field.nullable and child.null_count:
            filler = _empty_scalar(field.type)
            if filler is not None:
                child = pc.if_else(parent_null, filler, child)
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(array.type), mask=parent_null)


def _empty_scalar(kind: pa.DataType) -> pa.Scalar | None:
    """A placeholder value of ``kind``, or None where no plain one exists (nested types)."""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.scalar(b"", kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar("", kind)
    if pa.types.is_boolean(kind):
        return pa.scalar(False)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return pa.scalar(0, kind)
    return None


def _conform_list(array: pa.Array, physical: pa.DataType, target: pa.DataType) -> pa.Array:
    values = conform(array.values, physical.value_type, target.value_type, len(array.values))
    offsets = array.offsets
    cls = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
    return cls.from_arrays(offsets, values, type=target, mask=_validity(array))


def _conform_map(array: pa.Array, physical: pa.DataType, target: pa.DataType) -> pa.Array:
    keys = conform(array.keys, physical.key_type, target.key_type, len(array.keys))
    items = conform(array.items, physical.item_type, target.item_type, len(array.items))
    return pa.MapArray.from_arrays(array.offsets, keys, items, type=target, mask=_validity(array))


def constant_array(value: object, target: pa.DataType, length: int) -> pa.Array:
    """``length`` copies of ``value`` (a partition value) without a Python loop."""
    if value is None:
        return pa.nulls(length, target)
    single = pa.array([value], type=target)
    return single.take(_zeros(length))


def _zeros(length: int) -> pa.Array:
    import numpy as np

    return pa.array(np.zeros(length, dtype=np.int32))


# Parquet field ids let readers that resolve columns by id (delta-rs; delta-spark in
# column-mapping mode 'id') find our columns; Delta keeps them in the field metadata.
PARQUET_FIELD_ID = b"PARQUET:field_id"
_DELTA_FIELD_ID = "delta.columnMapping.id"


def with_field_ids(field: pa.Field, delta_field: dict[str, object]) -> pa.Field:
    """``field`` (and the struct fields nested in it, inside arrays and maps too) tagged
    with the Delta column-mapping ids."""
    tagged = pa.field(
        field.name, _with_nested_ids(field.type, delta_field.get("type")), field.nullable
    )
    metadata = delta_field.get("metadata")
    field_id = metadata.get(_DELTA_FIELD_ID) if isinstance(metadata, dict) else None
    return (
        tagged.with_metadata({PARQUET_FIELD_ID: str(field_id)}) if field_id is not None else tagged
    )


def _with_nested_ids(arrow_type: pa.DataType, delta_type: object) -> pa.DataType:
    """``arrow_type`` with the ids of the struct fields inside it. An array's element and a
    map's key and value carry none themselves (as in delta-spark's files), but a struct in
    them does: delta-spark in mode 'id' reads its fields by id, and reads nulls without."""
    if not isinstance(delta_type, dict):
        return arrow_type
    kind = delta_type.get("type")
    if kind == "struct" and pa.types.is_struct(arrow_type):
        children = delta_type.get("fields")
        if isinstance(children, list) and len(children) == arrow_type.num_fields:
            return pa.struct(
                [with_field_ids(arrow_type.field(i), children[i]) for i in range(len(children))]
            )
    elif kind == "array" and (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
        element = arrow_type.value_field
        element = element.with_type(_with_nested_ids(element.type, delta_type.get("elementType")))
        return pa.large_list(element) if pa.types.is_large_list(arrow_type) else pa.list_(element)
    elif kind == "map" and pa.types.is_map(arrow_type):
        key, item = arrow_type.key_field, arrow_type.item_field
        return pa.map_(
            key.with_type(_with_nested_ids(key.type, delta_type.get("keyType"))),
            item.with_type(_with_nested_ids(item.type, delta_type.get("valueType"))),
            keys_sorted=arrow_type.keys_sorted,
        )
    return arrow_type
