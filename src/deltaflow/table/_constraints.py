"""What every write must hold: CHECK constraints and NOT NULL columns of a Delta table.

A CHECK constraint lives in the table's configuration as ``delta.constraints.<name>`` =
the SQL expression (delta-spark's format; names are stored lower case). A NOT NULL
column is a schema field with ``nullable: false``; a nested field is checked only where
its parent struct is not null, as delta-spark does. A row breaks a CHECK constraint when
the expression is false *or null* (delta-spark's ``CheckDeltaInvariant``).

Every check is described once here, as :class:`RowCheck`, and enforced in two ways:

* in Spark (the JVM write, the stream sink, DML): :func:`guard_sql` is a ``CASE`` over
  the first written column that raises (``raise_error``) on the first violating row with
  a marker :func:`violation_from_text` turns back into a typed
  :class:`~deltaflow.table.errors.ConstraintViolationError`; it is a projection on a
  written column, so Spark never prunes it and it runs after the query's own filters;
* in Arrow (the Python writer): :class:`ArrowChecks`, for the predicates
  :mod:`deltaflow.table._predicates` reads.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _predicates
from deltaflow.table.errors import ConstraintViolationError, UnsupportedFeatureError

CONSTRAINT_PREFIX = "delta.constraints."
_MARK = re.compile(r"\[deltaflow-check#(\d+)\](.*?)\[/deltaflow-check\]", re.DOTALL)
_IDENTIFIER = re.compile(r"`((?:[^`]|``)+)`|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|([A-Za-z_]\w*)")

ColumnPath = tuple[str, ...]


@dataclass(frozen=True)
class RowCheck:
    """One rule every row of the table holds.

    ``kind``: ``check`` (``name`` is the constraint's) or ``notNull`` (``name`` is the
    column path). ``holds``: Spark SQL that is true exactly for the rows that keep it.
    ``columns``: the top-level columns whose values a violation reports.
    """

    kind: str
    name: str
    expression: str
    holds: str
    columns: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "expression": self.expression,
            "holds": self.holds,
            "violation": f"NOT ({self.holds})",
            "columns": list(self.columns),
            "values": values_sql(self.columns),
        }


def check_constraints(configuration: Mapping[str, str | None]) -> dict[str, str]:
    """Constraint name -> expression, in the order the configuration lists them."""
    return {
        key[len(CONSTRAINT_PREFIX) :]: value
        for key, value in configuration.items()
        if key.lower().startswith(CONSTRAINT_PREFIX) and value is not None
    }


def not_null_paths(schema: Mapping[str, Any]) -> list[ColumnPath]:
    """Paths of every NOT NULL field reachable through structs only (delta-spark does not
    enforce nullability inside arrays and maps through invariants either)."""
    found: list[ColumnPath] = []

    def walk(fields: Iterable[Mapping[str, Any]], prefix: ColumnPath) -> None:
        for field in fields:
            path = (*prefix, field["name"])
            if not field.get("nullable", True):
                found.append(path)
            t = field["type"]
            if isinstance(t, dict) and t.get("type") == "struct":
                walk(t["fields"], path)

    walk(schema["fields"], ())
    return found


def quote(path: Sequence[str]) -> str:
    """A column path as Spark SQL (each part in backquotes)."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in path)


def referenced_columns(expression: str, schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The table's top-level columns ``expression`` mentions, in schema order (string
    literals skipped; names match case-insensitively)."""
    mentioned = set()
    for match in _IDENTIFIER.finditer(expression):
        name = match.group(1) or match.group(2)
        if name:
            mentioned.add(name.replace("``", "`").lower())
    return tuple(f["name"] for f in schema["fields"] if f["name"].lower() in mentioned)


def not_null_check(path: ColumnPath) -> RowCheck:
    holds = f"{quote(path)} IS NOT NULL"
    if len(path) > 1:
        holds = f"{quote(path[:-1])} IS NULL OR {holds}"
    return RowCheck("notNull", ".".join(path), f"{'.'.join(path)} IS NOT NULL", holds, (path[0],))


def constraint_check(name: str, expression: str, schema: Mapping[str, Any]) -> RowCheck:
    return RowCheck(
        "check",
        name,
        expression,
        f"coalesce(({expression}), false)",
        referenced_columns(expression, schema),
    )


def table_checks(
    schema: Mapping[str, Any], configuration: Mapping[str, str | None]
) -> list[RowCheck]:
    """Every check a write to the table must pass (schema is logical): NOT NULL columns,
    CHECK constraints, generated columns equal to their expressions."""
    from deltaflow.table._generated import generated_checks

    checks = [not_null_check(path) for path in not_null_paths(schema)]
    checks.extend(
        constraint_check(name, expr, schema)
        for name, expr in check_constraints(configuration).items()
    )
    checks.extend(generated_checks(schema))
    return checks


def fingerprint(checks: Sequence[RowCheck]) -> str:
    """Identifies a set of checks (to tell that a write was checked against these)."""
    text = json.dumps([[c.kind, c.name, c.holds] for c in checks])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def values_sql(columns: Sequence[str]) -> str:
    """Spark SQL text of ``col = value, ...`` for the row at hand."""
    if not columns:
        return "''"
    parts = []
    for name in columns:
        label = _sql_string(f"{name} = ")
        parts.append(f"concat({label}, coalesce(cast({quote([name])} AS STRING), 'null'))")
    return f"concat_ws(', ', {', '.join(parts)})"


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def guard_sql(checks: Sequence[RowCheck], column: str, *, only_if: str | None = None) -> str:
    """Spark SQL for ``column`` that raises on the first row breaking one of ``checks``
    (only rows where ``only_if`` holds are checked)."""
    cases = []
    for index, check in enumerate(checks):
        broken = f"NOT ({check.holds})"
        if only_if is not None:
            broken = f"({only_if}) AND {broken}"
        values = values_sql(check.columns)
        message = f"concat('[deltaflow-check#{index}]', {values}, '[/deltaflow-check]')"
        cases.append(f"WHEN {broken} THEN raise_error({message})")
    return f"CASE {' '.join(cases)} ELSE {quote([column])} END"


def violation_from_text(
    text: str, checks: Sequence[RowCheck], table_uri: str
) -> ConstraintViolationError | None:
    """The typed error a :func:`guard_sql` failure's text describes (None if none)."""
    match = _MARK.search(text)
    if match is None or int(match.group(1)) >= len(checks):
        return None
    return violation(table_uri, checks[int(match.group(1))], match.group(2))


def violation(
    table_uri: str, check: RowCheck, values: str, rows: int | None = None
) -> ConstraintViolationError:
    if check.kind == "notNull":
        what = f"NOT NULL constraint on column {check.name} of table {table_uri} violated"
        fix = "Write a value for it, or drop the constraint: ALTER TABLE ... ALTER COLUMN"
        fix += f" {check.name} DROP NOT NULL."
    elif check.kind == "generated":
        what = (
            f"Generated column {check.name} of table {table_uri} does not equal its generation"
            f" expression ({check.expression})"
        )
        fix = f"Leave {check.name} out of the write to have it computed, or write the values"
        fix += " the expression gives."
    else:
        what = f"CHECK constraint {check.name} ({check.expression}) of table {table_uri} violated"
        fix = f"Fix the data, or drop the constraint: ALTER TABLE ... DROP CONSTRAINT {check.name}."
    counted = f" by {rows} row(s), for example" if rows is not None else ""
    shown = f" with values: {values}" if values else ""
    return ConstraintViolationError(
        f"{what}{counted} by a row{shown}. {fix}",
        table_uri=table_uri,
        constraint=check.name,
        kind=check.kind,
        expression=check.expression,
        values=values,
        columns=check.columns if check.kind != "notNull" else (check.name,),
        rows=rows,
    )


class ArrowChecks:
    """``checks`` evaluated on Arrow batches of the table's logical shape."""

    def __init__(self, table_uri: str, checks: Sequence[RowCheck], schema: pa.Schema) -> None:
        self.table_uri = table_uri
        self.checks = list(checks)
        self.schema = schema
        self.expressions = [self._expression(c) for c in self.checks]

    def _expression(self, check: RowCheck) -> pc.Expression:
        if check.kind == "generated":
            raise UnsupportedFeatureError(
                f"Generated column {check.name} of table {self.table_uri} cannot be computed"
                " or checked by deltaflow's Python writer. Write through the connector"
                " (format('delta') in a Spark session, deltaflow.write.nativeWrite not false).",
                table_uri=self.table_uri,
                feature="generatedColumns",
            )
        text = check.expression
        if check.kind == "notNull":
            path = check.name.split(".")
            text = f"{quote(path)} IS NOT NULL"
            if len(path) > 1:
                text = f"{quote(path[:-1])} IS NULL OR {text}"
        try:
            node = _predicates.parse(text, option=f"constraint {check.name}")
            return _predicates.is_true(
                _predicates.to_expression(node, self.schema, option=f"constraint {check.name}")
            )
        except InvalidOptionError as exc:
            raise UnsupportedFeatureError(
                f"CHECK constraint {check.name} ({check.expression}) of table {self.table_uri}"
                " cannot be evaluated by deltaflow's Python writer, which reads comparisons,"
                f" IN, IS [NOT] NULL, BETWEEN, AND/OR/NOT only ({exc.message}). Write through"
                " the connector (deltaflow.write.nativeWrite not false, a local or HDFS"
                " table), or replace the constraint by one of that form.",
                table_uri=self.table_uri,
                feature="checkConstraints",
            ) from None

    def check(self, batch: pa.RecordBatch) -> None:
        for check, expression in zip(self.checks, self.expressions, strict=True):
            holds = _predicates.evaluate(expression, batch)
            broken = pc.invert(holds.combine_chunks())
            if not pc.any(broken).as_py():
                continue
            row = pc.index(broken, True).as_py()
            values = ", ".join(
                f"{name} = {_text(batch.column(batch.schema.get_field_index(name))[row].as_py())}"
                for name in check.columns
                if batch.schema.get_field_index(name) >= 0
            )
            raise violation(self.table_uri, check, values)


def _text(value: Any) -> str:
    return "null" if value is None else str(value)
