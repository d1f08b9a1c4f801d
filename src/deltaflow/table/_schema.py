"""Delta schemas as JSON trees: the common language of Delta, Spark and Arrow.

A Delta ``schemaString`` uses Spark's StructType JSON format, so a schema moves
between the two without a lossy mapping. This module works on those JSON trees
(plain dicts) so that the table layer never imports Spark: column-mapping
physical names, schema enforcement and ``mergeSchema`` live here.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator, MutableMapping
from typing import Any

JsonType = Any  # str for primitives, dict for struct / array / map
Field = dict[str, Any]

PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
FIELD_ID_KEY = "delta.columnMapping.id"
MAX_COLUMN_ID_KEY = "delta.columnMapping.maxColumnId"
MAPPING_MODE_KEY = "delta.columnMapping.mode"
MAPPING_MODES = ("none", "name", "id")
# Metadata keys that describe storage, not the logical column; hidden from Spark.
_INTERNAL_METADATA = re.compile(r"^delta\.(columnMapping\.|identity\.)")
# A generated column's expression (table/_generated.py): kept in the log for writers.
_GENERATION_EXPRESSION = "delta.generationExpression"

_INTEGRAL_WIDTH = {"byte": 1, "short": 2, "integer": 4, "long": 8}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def column_mapping_mode(configuration: dict[str, str | None]) -> str:
    mode = (configuration.get("delta.columnMapping.mode") or "none").lower()
    return mode


def assign_column_ids(
    field: Field,
    configuration: MutableMapping[str, str],
    *,
    fresh_names: bool,
    seed: str | None = None,
) -> None:
    """Give ``field`` and every field nested in it that lacks one a column id (counting on
    from ``delta.columnMapping.maxColumnId``, which moves on in ``configuration``) and a
    physical name: ``col-<uuid>`` when ``fresh_names`` (new columns, as delta-spark names
    them), else the field's current name (data files written without mapping stay
    readable as they are). ``seed`` (the table's location) makes the uuid a function of it
    and the id instead of random: a write planned twice (by the connector, then by the
    Python writer; a stream's batch, then its commit) names its new columns alike."""
    next_id = int(configuration.get(MAX_COLUMN_ID_KEY) or 0)

    def visit_type(t: JsonType) -> None:
        if isinstance(t, dict):
            if t.get("type") == "struct":
                for f in t["fields"]:
                    visit(f)
            elif t.get("type") == "array":
                visit_type(t["elementType"])
            elif t.get("type") == "map":
                visit_type(t["keyType"])
                visit_type(t["valueType"])

    def visit(f: Field) -> None:
        nonlocal next_id
        metadata = f.setdefault("metadata", {})
        if FIELD_ID_KEY not in metadata:
            next_id += 1
            metadata[FIELD_ID_KEY] = next_id
            metadata[PHYSICAL_NAME_KEY] = (
                f["name"] if not fresh_names else f"col-{_physical_uuid(seed, next_id)}"
            )
        visit_type(f["type"])

    visit(field)
    configuration[MAX_COLUMN_ID_KEY] = str(next_id)


def _physical_uuid(seed: str | None, column_id: int) -> uuid.UUID:
    if seed is None:
        return uuid.uuid4()
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}#columnMapping.id={column_id}")


def mapped_new_schema(
    schema: dict[str, Any], configuration: dict[str, str], label: str, first_id: int = 0
) -> tuple[dict[str, Any], dict[str, str]]:
    """A new table's schema and configuration with column mapping set up, as delta-spark
    creates a table whose ``delta.columnMapping.mode`` is ``name`` or ``id``: every field
    (nested ones too) gets an id and a fresh ``col-<uuid>`` physical name, and
    ``delta.columnMapping.maxColumnId`` the highest id. ``first_id``: ids start above it
    (a replaced table's old maximum, so an id never names two columns in one history).
    Unmapped tables come back unchanged. ``label`` names the table in errors."""
    from deltaflow.errors import InvalidOptionError

    mode = column_mapping_mode(dict(configuration))
    if mode == "none":
        return schema, configuration
    if mode not in MAPPING_MODES:
        raise InvalidOptionError(
            f"delta.columnMapping.mode of {label} is {mode!r}; it is one of"
            f" {', '.join(MAPPING_MODES)}.",
            option=MAPPING_MODE_KEY,
            valid=MAPPING_MODES,
        )
    if configuration.get(MAX_COLUMN_ID_KEY) is not None:
        raise InvalidOptionError(
            f"{label}: {MAX_COLUMN_ID_KEY} is maintained by Delta itself and cannot be set;"
            " drop it from the table properties.",
            option=MAX_COLUMN_ID_KEY,
        )
    mapped = copy.deepcopy(schema)
    out = {k: v for k, v in configuration.items() if k != MAPPING_MODE_KEY}
    out[MAPPING_MODE_KEY] = mode
    out[MAX_COLUMN_ID_KEY] = str(first_id)
    for f in mapped["fields"]:
        assign_column_ids(f, out, fresh_names=True)
    return mapped, out


def logical_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as Spark should see it: column-mapping metadata removed."""
    return _map_fields(schema, _strip_internal)


def read_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a read of the table shows (a DataFrame's, ``spark.table(t).schema``):
    the logical schema without the writers' generation expressions, as delta-spark's
    table schema drops them (``delta.generationExpression`` stays in the log and in
    DESCRIBE's generated-column details)."""
    logical = logical_schema(schema)
    fields = []
    for field in logical.get("fields", []):
        metadata = field.get("metadata") or {}
        if _GENERATION_EXPRESSION in metadata:
            kept = {k: v for k, v in metadata.items() if k != _GENERATION_EXPRESSION}
            field = {**field, "metadata": kept}
        fields.append(field)
    return {**logical, "fields": fields}


def physical_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every field renamed to its physical (in-file) name."""

    def rename(field: Field) -> Field:
        field = _strip_internal(field)
        physical = field.get("_physical")
        if physical:
            field["name"] = physical
        field.pop("_physical", None)
        return field

    annotated = _map_fields(schema, _annotate_physical)
    return _map_fields(annotated, rename)


def _annotate_physical(field: Field) -> Field:
    physical = field.get("metadata", {}).get(PHYSICAL_NAME_KEY)
    out = dict(field)
    if physical:
        out["_physical"] = physical
    return out


def _strip_internal(field: Field) -> Field:
    out = dict(field)
    metadata = {
        k: v for k, v in field.get("metadata", {}).items() if not _INTERNAL_METADATA.match(k)
    }
    out["metadata"] = metadata
    return out


def _map_fields(schema: dict[str, Any], fn: Any) -> dict[str, Any]:
    def visit_type(t: JsonType) -> JsonType:
        if isinstance(t, str):
            return t
        kind = t["type"]
        if kind == "struct":
            return {"type": "struct", "fields": [visit_field(f) for f in t["fields"]]}
        if kind == "array":
            return {**t, "elementType": visit_type(t["elementType"])}
        if kind == "map":
            return {
                **t,
                "keyType": visit_type(t["keyType"]),
                "valueType": visit_type(t["valueType"]),
            }
        return copy.deepcopy(t)

    def visit_field(field: Field) -> Field:
        mapped = fn(field)
        mapped["type"] = visit_type(field["type"])
        return mapped  # type: ignore[no-any-return]

    return visit_type(schema)  # type: ignore[no-any-return]


def top_level_physical_names(schema: dict[str, Any]) -> dict[str, str]:
    """Logical -> physical name of each top-level column (identity without column mapping)."""
    return {
        f["name"]: f.get("metadata", {}).get(PHYSICAL_NAME_KEY, f["name"]) for f in schema["fields"]
    }


def leaf_columns(schema: dict[str, Any], limit: int | None = None) -> list[tuple[str, ...]]:
    """Paths of primitive leaf columns in schema order, nested structs flattened."""
    out: list[tuple[str, ...]] = []

    def walk(fields: list[Field], prefix: tuple[str, ...]) -> None:
        for f in fields:
            t = f["type"]
            if isinstance(t, dict) and t["type"] == "struct":
                walk(t["fields"], (*prefix, f["name"]))
            else:
                out.append((*prefix, f["name"]))

    walk(schema["fields"], ())
    return out if limit is None else out[:limit]


def iter_fields(schema: dict[str, Any]) -> Iterator[Field]:
    yield from schema["fields"]


def type_to_string(t: JsonType) -> str:
    if isinstance(t, str):
        return t
    kind = t["type"]
    if kind == "struct":
        inner = ", ".join(f"{f['name']}: {type_to_string(f['type'])}" for f in t["fields"])
        return f"struct<{inner}>"
    if kind == "array":
        return f"array<{type_to_string(t['elementType'])}>"
    if kind == "map":
        return f"map<{type_to_string(t['keyType'])}, {type_to_string(t['valueType'])}>"
    return str(kind)


def holds_type(t: JsonType, name: str) -> bool:
    """Whether type ``t`` (or a schema: a struct) is ``name`` or has it in a field, element,
    key or value (``holds_type(schema, "variant")``)."""
    if isinstance(t, str):
        return t == name
    kind = t["type"]
    if kind == "struct":
        return any(holds_type(f["type"], name) for f in t["fields"])
    if kind == "array":
        return holds_type(t["elementType"], name)
    if kind == "map":
        return holds_type(t["keyType"], name) or holds_type(t["valueType"], name)
    return False


def is_widening(source: JsonType, target: JsonType) -> bool:
    """True when values of type ``source`` fit losslessly in ``target`` (a safe implicit cast)."""
    if source == target:
        return True
    if isinstance(source, str) and isinstance(target, str):
        if source in _INTEGRAL_WIDTH and target in _INTEGRAL_WIDTH:
            return _INTEGRAL_WIDTH[source] <= _INTEGRAL_WIDTH[target]
        if source == "float" and target == "double":
            return True
        if source in _INTEGRAL_WIDTH and target == "double" and source != "long":
            return True
        src_dec, tgt_dec = _DECIMAL.match(source), _DECIMAL.match(target)
        if src_dec and tgt_dec:
            sp, ss = map(int, src_dec.groups())
            tp, ts = map(int, tgt_dec.groups())
            return ss <= ts and (sp - ss) <= (tp - ts)
        return False
    if isinstance(source, dict) and isinstance(target, dict) and source["type"] == target["type"]:
        if source["type"] == "array":
            return is_widening(source["elementType"], target["elementType"])
        if source["type"] == "map":
            return is_widening(source["keyType"], target["keyType"]) and is_widening(
                source["valueType"], target["valueType"]
            )
        if source["type"] == "struct":
            return not struct_mismatches(source, target, allow_new=False)
    return False


def struct_mismatches(
    incoming: dict[str, Any], table: dict[str, Any], *, allow_new: bool, prefix: str = ""
) -> list[str]:
    """Human-readable problems writing ``incoming`` into ``table`` (empty when compatible).

    Names match case-insensitively, as in delta-spark. Columns the table has and the
    data lacks are fine (they are written as nulls). New columns are problems
    unless ``allow_new`` (``mergeSchema``).
    """
    problems: list[str] = []
    by_name = {f["name"].lower(): f for f in table["fields"]}
    for field in incoming["fields"]:
        path = prefix + field["name"]
        target = by_name.get(field["name"].lower())
        if target is None:
            if not allow_new:
                problems.append(f"{path} (new column of type {type_to_string(field['type'])})")
            continue
        problems.extend(_type_mismatches(field["type"], target["type"], allow_new, path))
    return problems


def _type_mismatches(source: JsonType, target: JsonType, allow_new: bool, path: str) -> list[str]:
    """:func:`struct_mismatches` for one column's type: structs at any depth (inside arrays
    and maps too) may gain fields under ``allow_new``; anything else must widen."""
    if isinstance(source, dict) and isinstance(target, dict) and source["type"] == target["type"]:
        kind = source["type"]
        if kind == "struct":
            return struct_mismatches(source, target, allow_new=allow_new, prefix=path + ".")
        if kind == "array":
            return _type_mismatches(
                source["elementType"], target["elementType"], allow_new, path + ".element"
            )
        if kind == "map":
            return _type_mismatches(
                source["keyType"], target["keyType"], allow_new, path + ".key"
            ) + _type_mismatches(
                source["valueType"], target["valueType"], allow_new, path + ".value"
            )
    if is_widening(source, target):
        return []
    return [f"{path} (data type {type_to_string(source)}, table type {type_to_string(target)})"]


def merge_schemas(table: dict[str, Any], incoming: dict[str, Any]) -> dict[str, Any]:
    """``table`` with the columns only ``incoming`` has appended (recursively, for structs,
    also inside arrays and maps)."""
    merged = copy.deepcopy(table)
    by_name = {f["name"].lower(): f for f in merged["fields"]}
    for field in incoming["fields"]:
        target = by_name.get(field["name"].lower())
        if target is None:
            new_field = copy.deepcopy(field)
            new_field["nullable"] = True
            merged["fields"].append(new_field)
            continue
        target["type"] = _merged_type(target["type"], field["type"])
    return merged


def merge_mapped_schemas(
    table: dict[str, Any],
    incoming: dict[str, Any],
    configuration: dict[str, str | None],
    seed: str,
) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`merge_schemas` for a column-mapped table, as delta-spark's ``mergeSchema``
    evolves one: ``table``'s fields keep their ids and physical names, and every field only
    ``incoming`` has (a column, or a field inside a struct at any depth) gets the next id
    and a fresh ``col-<uuid>`` physical name. Also the configuration entry that moves with
    it: ``delta.columnMapping.maxColumnId``, raised past every id handed out. ``seed``:
    see :func:`assign_column_ids` (planning the same write twice gives the same names)."""
    merged = merge_schemas(table, logical_schema(incoming))
    # Counted on from the highest id in use too: a table whose maxColumnId lags its schema
    # (written by an older writer) must not hand an id out twice.
    highest = max(int(configuration.get(MAX_COLUMN_ID_KEY) or 0), _highest_column_id(table))
    counter = {MAX_COLUMN_ID_KEY: str(highest)}
    for f in merged["fields"]:
        assign_column_ids(f, counter, fresh_names=True, seed=seed)
    return merged, counter


def _highest_column_id(schema: dict[str, Any]) -> int:
    highest = 0

    def visit(t: JsonType) -> None:
        nonlocal highest
        if isinstance(t, dict):
            for f in t.get("fields", ()):
                highest = max(highest, int(f.get("metadata", {}).get(FIELD_ID_KEY) or 0))
                visit(f["type"])
            for key in ("elementType", "keyType", "valueType"):
                if key in t:
                    visit(t[key])

    visit(schema)
    return highest


def _merged_type(table: JsonType, incoming: JsonType) -> JsonType:
    """``table`` with the struct fields only ``incoming`` has, inside arrays and maps too."""
    if not (isinstance(table, dict) and isinstance(incoming, dict)):
        return table
    if table["type"] != incoming["type"]:
        return table
    if table["type"] == "struct":
        return merge_schemas(table, incoming)
    if table["type"] == "array":
        return {**table, "elementType": _merged_type(table["elementType"], incoming["elementType"])}
    if table["type"] == "map":
        return {
            **table,
            "keyType": _merged_type(table["keyType"], incoming["keyType"]),
            "valueType": _merged_type(table["valueType"], incoming["valueType"]),
        }
    return table


def field_type(schema: dict[str, Any], name: str) -> JsonType:
    for f in schema["fields"]:
        if f["name"] == name:
            return f["type"]
    raise KeyError(name)
