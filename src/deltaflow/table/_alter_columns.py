"""ALTER TABLE rules for columns and column mapping (see :mod:`._alter`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from deltaflow.table import _constraints, _schema
from deltaflow.table._alter_state import (
    Change,
    Field,
    Work,
    column_at,
    dotted,
    fields_at,
    find_field,
    no_column,
    path_of,
)
from deltaflow.table.errors import (
    InvalidConstraintError,
    SchemaMismatchError,
    UnsupportedFeatureError,
)

_MAPPING_HINT = "ALTER TABLE {table} SET TBLPROPERTIES ('delta.columnMapping.mode'='name')"
_TYPE_CHANGES_KEY = "delta.typeChanges"
_CHAR_VARCHAR_KEY = "__CHAR_VARCHAR_TYPE_STRING"
_INTEGRAL = ("byte", "short", "integer", "long")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def _require_mapping(work: Work, what: str) -> None:
    if not work.mapped:
        hint = _MAPPING_HINT.format(table=work.state.label)
        raise UnsupportedFeatureError(
            f"{what} on {work.state.label} needs column mapping, which this table does not use"
            " (data files name columns by their names). Turn it on first, without rewriting"
            f" data: {hint}.",
            table_uri=work.state.uri,
            feature="columnMapping",
        )


def constraint_users(work: Work, top_level: str) -> list[str]:
    return [
        name
        for name, expr in _constraints.check_constraints(work.configuration).items()
        if top_level.lower()
        in {c.lower() for c in _constraints.referenced_columns(expr, work.schema)}
    ]


def _refuse_if_constrained(work: Work, path: Sequence[str], what: str) -> None:
    users = constraint_users(work, path[0])
    if users:
        raise InvalidConstraintError(
            f"Cannot {what} {dotted(path)} of {work.state.label}: CHECK constraint"
            f" {', '.join(users)} uses it. Drop the constraint first (ALTER TABLE ... DROP"
            " CONSTRAINT name), then add it back in terms of the new columns.",
            table_uri=work.state.uri,
            constraint=users[0],
            expression=_constraints.check_constraints(work.configuration)[users[0]],
        )


def add_column(work: Work, change: Change) -> None:
    path = path_of(change)
    fields = fields_at(work, path[:-1], path)
    if find_field(fields, path[-1]) is not None:
        raise SchemaMismatchError(
            f"ALTER TABLE {work.state.label} ADD COLUMNS: column {dotted(path)} already exists.",
            table_uri=work.state.uri,
            columns=(dotted(path),),
        )
    if change.get("default") is not None:
        raise _no_defaults(work, path)
    if change.get("nullable") is False:
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label} ADD COLUMNS ({dotted(path)} ... NOT NULL): a new"
            " column of an existing table has no values, so it cannot be NOT NULL (delta-spark"
            " refuses it too). Add it nullable, fill it (UPDATE), then ALTER TABLE ... ALTER"
            f" COLUMN {dotted(path)} SET NOT NULL.",
            table_uri=work.state.uri,
            feature="addNotNullColumn",
        )
    new = _field_from_spark(path[-1], change["type"], True, change.get("comment"))
    if work.mapped:
        _assign_ids(work, new, fresh_names=True)
    _insert(work, fields, new, change.get("position"), path)
    logged = {"name": dotted(path), "type": new["type"], "nullable": True, "metadata": {}}
    if change.get("comment") is not None:
        logged["metadata"] = {"comment": change["comment"]}
    entry: dict[str, Any] = {"column": logged}
    if change.get("position"):
        entry["position"] = _position_text(change["position"])
    work.log_columns.append(entry)


def _no_defaults(work: Work, path: Sequence[str]) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(
        f"ALTER TABLE {work.state.label}: column {dotted(path)} DEFAULT values are not"
        " supported by deltaflow (the allowColumnDefaults table feature). Add the column"
        " without DEFAULT and fill it with UPDATE, or write the value in the query that"
        " writes the table.",
        table_uri=work.state.uri,
        feature="allowColumnDefaults",
    )


def _field_from_spark(name: str, data_type: Any, nullable: bool, comment: Any) -> Field:
    metadata: dict[str, Any] = {}
    if isinstance(data_type, str) and re.fullmatch(r"(var)?char\(\d+\)", data_type):
        metadata[_CHAR_VARCHAR_KEY] = data_type
        data_type = "string"
    if comment is not None:
        metadata["comment"] = str(comment)
    return {"name": name, "type": data_type, "nullable": nullable, "metadata": metadata}


def _position_text(position: Mapping[str, Any]) -> str:
    return "FIRST" if position.get("first") else f"AFTER {position.get('after')}"


def _insert(
    work: Work, fields: list[Field], new: Field, position: Any, path: Sequence[str]
) -> None:
    if not position:
        fields.append(new)
    elif position.get("first"):
        fields.insert(0, new)
    else:
        after = find_field(fields, str(position["after"]))
        if after is None:
            raise no_column(work, (*path[:-1], str(position["after"])))
        fields.insert(after + 1, new)


def rename_column(work: Work, change: Change) -> None:
    path = path_of(change)
    _require_mapping(work, f"RENAME COLUMN {dotted(path)}")
    fields, index = column_at(work, path)
    new_name = str(change["newName"])
    clash = find_field(fields, new_name)
    if clash is not None and clash != index:
        raise SchemaMismatchError(
            f"ALTER TABLE {work.state.label} RENAME COLUMN: {dotted((*path[:-1], new_name))}"
            " already exists.",
            table_uri=work.state.uri,
            columns=(new_name,),
        )
    _refuse_if_constrained(work, path, "rename column")
    old = fields[index]["name"]
    fields[index]["name"] = new_name
    if len(path) == 1:
        work.partition_columns = [new_name if p == old else p for p in work.partition_columns]
    work.parameters.update(
        {
            "oldColumnPath": dotted((*path[:-1], old)),
            "newColumnPath": dotted((*path[:-1], new_name)),
        }
    )


def drop_column(work: Work, change: Change) -> None:
    path = path_of(change)
    _require_mapping(work, f"DROP COLUMN {dotted(path)}")
    try:
        fields, index = column_at(work, path)
    except SchemaMismatchError:
        if change.get("ifExists"):
            return
        raise
    if len(path) == 1 and fields[index]["name"] in work.partition_columns:
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label} DROP COLUMN {dotted(path)}: it is a partition"
            " column, which Delta cannot drop. Rewrite the table without it (CREATE OR REPLACE"
            " TABLE ... AS SELECT).",
            table_uri=work.state.uri,
            feature="dropPartitionColumn",
        )
    if len(fields) == 1 or (len(path) == 1 and len(fields) - len(work.partition_columns) <= 1):
        raise SchemaMismatchError(
            f"ALTER TABLE {work.state.label} DROP COLUMN {dotted(path)}: it is the last"
            f" {'field of its struct' if len(path) > 1 else 'data column'}, and a table or"
            " struct needs at least one.",
            table_uri=work.state.uri,
            columns=(dotted(path),),
        )
    _refuse_if_constrained(work, path, "drop column")
    dropped = fields.pop(index)["name"]
    dropped_list = json.loads(work.parameters.get("columns", "[]"))
    dropped_list.append(dotted((*path[:-1], dropped)))
    work.parameters["columns"] = json.dumps(dropped_list)


def update_type(work: Work, change: Change) -> None:
    path = path_of(change)
    fields, index = column_at(work, path)
    target = fields[index]
    new_type = change["type"]
    old_type = target["type"]
    char_of = target.get("metadata", {}).get(_CHAR_VARCHAR_KEY)
    if new_type == old_type or (char_of is not None and new_type == char_of):
        _log_change_column(work, path, target)
        return
    if char_of is not None and new_type == "string":
        target["metadata"].pop(_CHAR_VARCHAR_KEY)  # CHAR/VARCHAR -> STRING: a wider string
        _log_change_column(work, path, target)
        return
    if len(path) == 1 and target["name"] in work.partition_columns:
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label}: partition column {dotted(path)} cannot change"
            f" type ({_schema.type_to_string(old_type)} -> {_schema.type_to_string(new_type)}).",
            table_uri=work.state.uri,
            feature="typeWidening",
        )
    if not _widens(old_type, new_type):
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label}: column {dotted(path)} cannot change type from"
            f" {_schema.type_to_string(old_type)} to {_schema.type_to_string(new_type)}. Delta"
            " allows only type widening (byte -> short -> int -> long, float -> double,"
            " byte/short/int -> double, date -> timestamp_ntz, wider decimals); anything else"
            " needs a rewrite (CREATE OR REPLACE TABLE ... AS SELECT with a cast).",
            table_uri=work.state.uri,
            feature="typeChange",
        )
    if (work.configuration.get("delta.enableTypeWidening") or "").lower() != "true":
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label}: widening column {dotted(path)} from"
            f" {_schema.type_to_string(old_type)} to {_schema.type_to_string(new_type)} needs"
            f" type widening: ALTER TABLE {work.state.label} SET TBLPROPERTIES"
            " ('delta.enableTypeWidening'='true') first.",
            table_uri=work.state.uri,
            feature="typeWidening",
        )
    metadata = target.setdefault("metadata", {})
    history = list(metadata.get(_TYPE_CHANGES_KEY) or [])
    history.append({"fromType": old_type, "toType": new_type})
    metadata[_TYPE_CHANGES_KEY] = history
    target["type"] = new_type
    work.features.add("typeWidening")
    _log_change_column(work, path, target)


def _widens(old: Any, new: Any) -> bool:
    if not (isinstance(old, str) and isinstance(new, str)):
        return False
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL.index(old) < _INTEGRAL.index(new)
    if (old, new) in (("float", "double"), ("date", "timestamp_ntz")):
        return True
    if old in ("byte", "short", "integer") and new == "double":
        return True
    old_dec, new_dec = _DECIMAL.match(old), _DECIMAL.match(new)
    if old_dec and new_dec:
        p, s = map(int, old_dec.groups())
        q, t = map(int, new_dec.groups())
        return t >= s and q - t >= p - s
    return False


def _log_change_column(work: Work, path: Sequence[str], target: Field) -> None:
    logged = {
        "name": target["name"],
        "type": target["type"],
        "nullable": target.get("nullable", True),
        "metadata": {
            k: v
            for k, v in (target.get("metadata") or {}).items()
            if not k.startswith("delta.columnMapping.")
        },
    }
    work.parameters["column"] = json.dumps(logged)
    work.touched_metadata = True


def update_nullability(work: Work, change: Change) -> None:
    path = path_of(change)
    fields, index = column_at(work, path)
    target = fields[index]
    nullable = bool(change["nullable"])
    if not nullable and target.get("nullable", True):
        work.new_not_null.append(tuple(_resolved_path(work, path)))
        work.checks.append(_constraints.not_null_check(tuple(_resolved_path(work, path))))
    target["nullable"] = nullable
    _log_change_column(work, path, target)


def _resolved_path(work: Work, path: Sequence[str]) -> list[str]:
    """``path`` with the table's own spelling of each name (structs only)."""
    out: list[str] = []
    fields: Any = work.schema["fields"]
    for part in path:
        index = find_field(fields or [], part) if fields is not None else None
        if index is None:
            raise UnsupportedFeatureError(
                f"ALTER TABLE {work.state.label}: SET NOT NULL on {dotted(path)}, a field"
                " inside an array or map, is not supported (delta-spark does not enforce it"
                " either).",
                table_uri=work.state.uri,
                feature="notNullInCollection",
            )
        field_ = fields[index]
        out.append(field_["name"])
        t = field_["type"]
        fields = t["fields"] if isinstance(t, dict) and t.get("type") == "struct" else None
    return out


def update_comment(work: Work, change: Change) -> None:
    path = path_of(change)
    fields, index = column_at(work, path)
    target = fields[index]
    metadata = target.setdefault("metadata", {})
    comment = change.get("comment")
    if comment is None:
        metadata.pop("comment", None)
    else:
        metadata["comment"] = str(comment)
    _log_change_column(work, path, target)


def update_position(work: Work, change: Change) -> None:
    path = path_of(change)
    fields, index = column_at(work, path)
    moved = fields.pop(index)
    position = change.get("position") or {}
    if (
        position.get("after") is not None
        and str(position["after"]).lower() == moved["name"].lower()
    ):
        fields.insert(index, moved)
        raise SchemaMismatchError(
            f"ALTER TABLE {work.state.label}: column {dotted(path)} cannot go after itself.",
            table_uri=work.state.uri,
            columns=(dotted(path),),
        )
    _insert(work, fields, moved, position, path)
    _log_change_column(work, path, moved)
    work.parameters["position"] = _position_text(position)


def update_default(work: Work, change: Change) -> None:
    raise _no_defaults(work, path_of(change))


def cluster_by(work: Work, change: Change) -> None:
    """``CLUSTER BY (cols)`` / ``CLUSTER BY NONE``: a new ``delta.clustering`` domain and the
    ``clustering`` + ``domainMetadata`` features. Files are reclustered by OPTIMIZE."""
    from deltaflow.table import _clustering

    _clustering.refuse_object_store(work.state.uri, work.state.label)
    requested = [tuple(str(p) for p in path) for path in change.get("columns") or []]
    columns = _clustering.resolve_columns(
        work.schema,
        work.configuration,
        requested,
        label=work.state.label,
        uri=work.state.uri,
        partition_columns=work.partition_columns,
    )
    clustered = _clustering.is_clustered(tuple(work.state.protocol.writer_features))
    if clustered and columns == _clustering.physical_columns(work.state.uri):
        return  # the same columns: nothing to commit
    work.features.update(_clustering.FEATURES)
    work.domains.append(_clustering.domain_action(columns))
    names = _clustering.logical_names(work.schema, columns)
    work.parameters["newClusteringColumns"] = ",".join(names)
    work.parameters["oldClusteringColumns"] = ",".join(
        _clustering.clustering_columns(
            work.state.uri, work.state.schema, tuple(work.state.protocol.writer_features)
        )
    )


# ---- column mapping ---------------------------------------------------------------------


def _assign_ids(work: Work, top: Field, *, fresh_names: bool) -> None:
    """Give ``top`` and every field nested in it a column id and a physical name."""
    _schema.assign_column_ids(top, work.configuration, fresh_names=fresh_names)


def enable_column_mapping(work: Work, mode: str) -> None:
    current = _schema.column_mapping_mode(dict(work.configuration))
    if mode == current:
        return
    if mode == "name" and current == "none":
        # Physical names are the current names: every data file stays readable as it is.
        for f in work.schema["fields"]:
            _assign_ids(work, f, fresh_names=False)
        work.features.add("columnMapping")
        work.configuration["delta.columnMapping.mode"] = "name"
        return
    raise UnsupportedFeatureError(
        f"ALTER TABLE {work.state.label}: delta.columnMapping.mode cannot change from"
        f" '{current}' to '{mode}'. Only 'none' -> 'name' is possible in place (as in"
        " delta-spark); anything else needs a rewrite into a new table.",
        table_uri=work.state.uri,
        feature="columnMapping",
    )
