"""The state an ALTER TABLE works on, and finding columns in it (see :mod:`._alter`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deltaflow.table import _constraints, _schema
from deltaflow.table._protocol import (
    Protocol,
)
from deltaflow.table.errors import (
    SchemaMismatchError,
)

Field = dict[str, Any]
Change = Mapping[str, Any]


@dataclass(frozen=True)
class TableState:
    """The parts of a table an ALTER may change (schema with column-mapping metadata)."""

    uri: str
    label: str  # how the user named the table, for messages
    schema: dict[str, Any]
    partition_columns: tuple[str, ...]
    configuration: dict[str, str]
    protocol: Protocol
    description: str | None = None


@dataclass
class Work:
    state: TableState
    schema: dict[str, Any]
    configuration: dict[str, str]
    partition_columns: list[str]
    description: str | None
    features: set[str] = field(default_factory=set)
    minimum: tuple[int, int] = (0, 0)
    checks: list[_constraints.RowCheck] = field(default_factory=list)
    new_not_null: list[tuple[str, ...]] = field(default_factory=list)
    log_columns: list[dict[str, Any]] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    touched_metadata: bool = False
    # domainMetadata actions the commit writes (ALTER TABLE ... CLUSTER BY).
    domains: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mapped(self) -> bool:
        return _schema.column_mapping_mode(dict(self.configuration)) != "none"


def path_of(change: Change) -> tuple[str, ...]:
    return tuple(str(p) for p in change["field"])


def dotted(path: Sequence[str]) -> str:
    return ".".join(path)


def fields_at(work: Work, parent: Sequence[str], whole: Sequence[str]) -> list[Field]:
    """The field list of the struct at ``parent`` (``element`` / ``key`` / ``value`` step
    into arrays and maps, as Spark names them)."""
    current: Any = work.schema
    walked: list[str] = []
    for part in parent:
        if isinstance(current, dict) and current.get("type") == "array" and part == "element":
            current = current["elementType"]
        elif (
            isinstance(current, dict) and current.get("type") == "map" and part in ("key", "value")
        ):
            current = current[f"{part}Type"]
        else:
            fields = current.get("fields") if isinstance(current, dict) else None
            found = find_field(fields or [], part)
            if found is None:
                raise no_column(work, whole)
            current = fields[found]["type"]  # type: ignore[index]
        walked.append(part)
    if not (isinstance(current, dict) and current.get("type") == "struct"):
        raise SchemaMismatchError(
            f"ALTER TABLE {work.state.label}: {dotted(parent) or 'the table'} is not a struct,"
            f" so it has no field {whole[-1]}.",
            table_uri=work.state.uri,
            columns=(dotted(whole),),
        )
    return current["fields"]  # type: ignore[no-any-return]


def find_field(fields: Sequence[Field], name: str) -> int | None:
    lowered = name.lower()
    return next((i for i, f in enumerate(fields) if f["name"].lower() == lowered), None)


def no_column(work: Work, path: Sequence[str]) -> SchemaMismatchError:
    names = ", ".join(f["name"] for f in work.schema["fields"])
    return SchemaMismatchError(
        f"ALTER TABLE {work.state.label}: there is no column {dotted(path)} (columns: {names}).",
        table_uri=work.state.uri,
        columns=(dotted(path),),
    )


def column_at(work: Work, path: Sequence[str]) -> tuple[list[Field], int]:
    fields = fields_at(work, path[:-1], path)
    index = find_field(fields, path[-1])
    if index is None:
        raise no_column(work, path)
    return fields, index
