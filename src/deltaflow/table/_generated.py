"""Generated columns and identity columns: the Delta log's rules (no Spark here).

Delta keeps both in a column's field metadata (PROTOCOL.md, "Generated Columns" and
"Identity Columns"):

- ``delta.generationExpression``: the SQL expression a generated column always equals;
  the table needs the ``generatedColumns`` writer feature (legacy writer version 4);
- ``delta.identity.start`` / ``.step`` / ``.allowExplicitInsert`` and
  ``delta.identity.highWaterMark`` (the highest value handed out so far, lowest for a
  negative step): the ``identityColumns`` writer feature (legacy writer version 6).

Computing values is the engine's business (Spark, through the connector); this module
says what the log declares, checks a declaration, and moves the high water mark.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltaflow.table.errors import GeneratedColumnError

GENERATION_EXPRESSION = "delta.generationExpression"
IDENTITY_START = "delta.identity.start"
IDENTITY_STEP = "delta.identity.step"
IDENTITY_ALLOW_EXPLICIT_INSERT = "delta.identity.allowExplicitInsert"
IDENTITY_HIGH_WATER_MARK = "delta.identity.highWaterMark"


@dataclass(frozen=True)
class GeneratedColumn:
    name: str
    expression: str
    type_json: Any


@dataclass(frozen=True)
class IdentityColumn:
    name: str
    start: int
    step: int
    allow_explicit_insert: bool
    high_water_mark: int | None = None

    @property
    def always(self) -> bool:
        return not self.allow_explicit_insert

    def next_value(self) -> int:
        """The first value the next write may hand out."""
        if self.high_water_mark is None:
            return self.start
        return self.high_water_mark + self.step


def generated_columns(schema: Mapping[str, Any]) -> list[GeneratedColumn]:
    """The table's generated columns (top level, as Delta allows), in schema order."""
    return [
        GeneratedColumn(f["name"], str(meta[GENERATION_EXPRESSION]), f["type"])
        for f in schema.get("fields", ())
        if GENERATION_EXPRESSION in (meta := f.get("metadata") or {})
    ]


def identity_columns(schema: Mapping[str, Any]) -> list[IdentityColumn]:
    """The table's identity columns, in schema order."""
    out = []
    for f in schema.get("fields", ()):
        meta = f.get("metadata") or {}
        if IDENTITY_START not in meta:
            continue
        mark = meta.get(IDENTITY_HIGH_WATER_MARK)
        out.append(
            IdentityColumn(
                name=f["name"],
                start=int(meta[IDENTITY_START]),
                step=int(meta.get(IDENTITY_STEP, 1)),
                allow_explicit_insert=_truthy(meta.get(IDENTITY_ALLOW_EXPLICIT_INSERT, False)),
                high_water_mark=int(mark) if mark is not None else None,
            )
        )
    return out


def features_of(schema: Mapping[str, Any]) -> frozenset[str]:
    """The writer features the schema's generated and identity columns need."""
    found = set()
    if generated_columns(schema):
        found.add("generatedColumns")
    if identity_columns(schema):
        found.add("identityColumns")
    return frozenset(found)


def identity_metadata(start: int, step: int, *, always: bool) -> dict[str, Any]:
    """The field metadata of an identity column, typed as delta-spark writes it
    (numbers and a boolean, not strings)."""
    return {
        IDENTITY_START: int(start),
        IDENTITY_STEP: int(step),
        IDENTITY_ALLOW_EXPLICIT_INSERT: not always,
    }


def validate_declaration(
    fields: Sequence[Mapping[str, Any]], partition_columns: Sequence[str], table_uri: str
) -> None:
    """Delta's rules on declared generated / identity columns that need no engine:
    identity columns are BIGINT, step non-zero, not partition columns, not also
    generated; a generation expression is non-empty and refers to no identity column.
    (Whether an expression resolves, is deterministic and fits the type is checked by
    Spark: ``deltaflow/spark/catalog/_columns.py``.)"""
    partitions = {p.lower() for p in partition_columns}
    identities = {f["name"].lower() for f in fields if IDENTITY_START in (f.get("metadata") or {})}
    for f in fields:
        meta = f.get("metadata") or {}
        name = f["name"]
        if IDENTITY_START in meta:
            if f["type"] != "long":
                raise _error(
                    table_uri,
                    name,
                    "identityType",
                    f"Identity column '{name}' is of type {f['type']}; Delta identity columns"
                    " are BIGINT. Declare it as BIGINT.",
                )
            if int(meta.get(IDENTITY_STEP, 1)) == 0:
                raise _error(
                    table_uri,
                    name,
                    "identityStep",
                    f"Identity column '{name}' has INCREMENT BY 0; the step must be a non-zero"
                    " integer (negative steps count down).",
                )
            if name.lower() in partitions:
                raise _error(
                    table_uri,
                    name,
                    "identityPartition",
                    f"Identity column '{name}' cannot be a partition column. Partition by"
                    " another column.",
                )
            if GENERATION_EXPRESSION in meta:
                raise _error(
                    table_uri,
                    name,
                    "identityGenerated",
                    f"Column '{name}' cannot be both an identity column and generated by an"
                    " expression. Keep one of the two.",
                )
        if GENERATION_EXPRESSION in meta:
            expression = str(meta[GENERATION_EXPRESSION]).strip()
            if not expression:
                raise _error(
                    table_uri,
                    name,
                    "emptyExpression",
                    f"Generated column '{name}' has an empty generation expression.",
                )
            lowered = expression.lower()
            used = sorted(i for i in identities if mentions(lowered, i))
            if used:
                raise _error(
                    table_uri,
                    name,
                    "referencesIdentity",
                    f"Generated column '{name}' refers to identity column '{used[0]}'; a"
                    " generation expression may refer only to the table's plain columns.",
                )


def mentions(expression: str, column: str) -> bool:
    """Whether SQL ``expression`` names ``column`` (case-insensitive, plain or quoted)."""
    name = re.escape(column.lower())
    found = re.search(rf"(?<![\w`.]){name}(?![\w`])|`{name}`", expression.lower())
    return found is not None


def with_high_water_marks(schema: Mapping[str, Any], marks: Mapping[str, int]) -> dict[str, Any]:
    """``schema`` with ``delta.identity.highWaterMark`` of each column in ``marks`` set."""
    out = copy.deepcopy(dict(schema))
    lowered = {k.lower(): v for k, v in marks.items()}
    for f in out["fields"]:
        if f["name"].lower() in lowered:
            f.setdefault("metadata", {})[IDENTITY_HIGH_WATER_MARK] = int(lowered[f["name"].lower()])
    return out


def high_water_marks(
    identities: Iterable[IdentityColumn], generated: Iterable[str], stats: Iterable[str | None]
) -> dict[str, int]:
    """The new high water mark of each identity column whose values this write generated
    (``generated``), from the added files' stats (``maxValues`` for a positive step,
    ``minValues`` for a negative one); a column with no value written keeps its mark."""
    names = {g.lower() for g in generated}
    wanted = {i.name.lower(): i for i in identities if i.name.lower() in names}
    seen: dict[str, int] = {}
    for text in stats:
        parsed = json.loads(text) if text else {}
        for lowered, identity in wanted.items():
            key = "maxValues" if identity.step > 0 else "minValues"
            values = {k.lower(): v for k, v in (parsed.get(key) or {}).items()}
            value = values.get(lowered)
            if value is None:
                continue
            value = int(value)
            current = seen.get(identity.name)
            if current is None or (value > current if identity.step > 0 else value < current):
                seen[identity.name] = value
    out = {}
    for name, value in seen.items():
        identity = wanted[name.lower()]
        previous = identity.high_water_mark
        if previous is None or (value > previous if identity.step > 0 else value < previous):
            out[name] = value
    return out


def generated_checks(schema: Mapping[str, Any]) -> list[Any]:
    """The row rule of each generated column (its value equals its expression, nulls
    alike), as the row checks every write path enforces (``table/_constraints.py``)."""
    from deltaflow.table import _constraints, _schema

    checks = []
    for column in generated_columns(schema):
        quoted = _constraints.quote([column.name])
        typed = f"CAST(({column.expression}) AS {_schema.type_to_string(column.type_json)})"
        checks.append(
            _constraints.RowCheck(
                "generated",
                column.name,
                column.expression,
                f"{quoted} <=> {typed}",
                (
                    column.name,
                    *(
                        f["name"]
                        for f in schema["fields"]
                        if f["name"] != column.name and mentions(column.expression, f["name"])
                    ),
                ),
            )
        )
    return checks


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() == "true"


def _error(table_uri: str, column: str, reason: str, message: str) -> GeneratedColumnError:
    return GeneratedColumnError(
        f"{message} (table {table_uri})", table_uri=table_uri, column=column, reason=reason
    )
