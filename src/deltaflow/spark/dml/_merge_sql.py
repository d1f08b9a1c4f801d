"""A MERGE's conditions and assignments as DataFusion SQL, exactly, or not at all.

The delta-rs MERGE route (:mod:`._merge_native`) hands delta-rs its predicates as
DataFusion SQL text. Spark SQL and DataFusion agree only on a small core, so an expression
is translated only when every node of its tree is in that core; anything else raises
:class:`Untranslatable` and the MERGE runs as Spark jobs instead.

The tree is Spark's own: SQL text through the session's parser
(``sqlParser().parseExpression``), a Column through the session's column converter, both
unresolved and read in one call (``toJSON``). The core, and why each part is exact:

* column references qualified by the target's or the source's alias (Spark resolves
  names case-insensitively: the real name is looked up and double-quoted);
* literals of type int, bigint, string and boolean (no floating point, decimals, dates or
  timestamps, whose literal typing and time zones differ);
* ``AND``, ``OR``, ``NOT``, ``IS [NOT] NULL``: SQL's three-valued logic in both;
* ``=``, ``<=>`` (``IS NOT DISTINCT FROM``), ``<``, ``<=``, ``>``, ``>=``, ``<>`` and
  ``IN (literals)`` between operands of one family (integers, strings, booleans, dates,
  timestamps of one kind): no implicit casts between families, and no floating point
  (DataFusion orders -0.0 below 0.0 and Spark does not);
* no arithmetic: Spark 4 raises on integer overflow (ANSI mode) where DataFusion wraps;
  no functions, UDFs or non-deterministic expressions.

The ON clause is rewritten once more for speed, with the same matches
(:func:`join_condition`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

# The aliases the translated SQL uses (delta-rs's source_alias / target_alias).
TARGET = "t"
SOURCE = "s"

# Column names the route accepts: plain identifiers (DataFusion and delta-rs read the
# names of updated columns unquoted).
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_FAMILIES = {
    "tinyint": "int",
    "smallint": "int",
    "int": "int",
    "bigint": "int",
    "string": "string",
    "boolean": "bool",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
}
_LITERALS = {"integer": "int", "long": "int", "string": "string", "boolean": "bool"}
_COMPARISONS = {
    "EqualTo": "=",
    "=": "=",
    "==": "=",
    "EqualNullSafe": "IS NOT DISTINCT FROM",
    "<=>": "IS NOT DISTINCT FROM",
    "LessThan": "<",
    "<": "<",
    "LessThanOrEqual": "<=",
    "<=": "<=",
    "GreaterThan": ">",
    ">": ">",
    "GreaterThanOrEqual": ">=",
    ">=": ">=",
    "!=": "<>",
    "<>": "<>",
}
_LOGICAL = {"And": "AND", "and": "AND", "Or": "OR", "or": "OR"}
_NOT = {"Not", "not", "!"}
_NULL_TESTS = {
    "IsNull": "IS NULL",
    "isNull": "IS NULL",
    "isnull": "IS NULL",
    "IsNotNull": "IS NOT NULL",
    "isNotNull": "IS NOT NULL",
    "isnotnull": "IS NOT NULL",
}
_IN = {"In", "in"}


class Untranslatable(Exception):
    """The expression has a part outside the exact core; the reason says which."""


@dataclass(frozen=True)
class Scope:
    """The names an expression may use: alias (lower case) -> {column (lower) -> (name,
    Spark type)} for each side the clause sees."""

    sides: Mapping[str, tuple[str, Mapping[str, tuple[str, str]]]]

    def column(self, parts: list[str]) -> tuple[str, str]:
        """The quoted SQL reference and Spark type of ``alias.column``."""
        if len(parts) != 2:
            raise Untranslatable(f"column {'.'.join(parts)!r} is not alias.column")
        side = self.sides.get(parts[0].lower())
        if side is None:
            raise Untranslatable(f"{parts[0]!r} is not an alias this clause may use")
        quoted_alias, columns = side
        found = columns.get(parts[1].lower())
        if found is None:
            raise Untranslatable(f"no column {parts[1]!r} on {parts[0]!r}")
        name, spark_type = found
        return f'"{quoted_alias}"."{name}"', spark_type


def columns_of(fields: Any) -> dict[str, tuple[str, str]]:
    """{lower name: (name, simple type)} of a StructType; Untranslatable for odd names."""
    out: dict[str, tuple[str, str]] = {}
    for f in fields:
        if not _IDENTIFIER.match(f.name):
            raise Untranslatable(f"column name {f.name!r} is not a plain identifier")
        out[f.name.lower()] = (f.name, f.dataType.simpleString())
    return out


def tree(spark: SparkSession, expression: str | Column) -> list[dict[str, Any]]:
    """Spark's unresolved expression tree, flattened in pre-order (one JVM call)."""
    session = spark._jsparkSession  # type: ignore[attr-defined]
    try:
        if isinstance(expression, str):
            parsed = session.sessionState().sqlParser().parseExpression(expression)
        else:
            parsed = session.expression(expression._jc)
        nodes: list[dict[str, Any]] = json.loads(parsed.toJSON())
    except Exception as exc:  # unparseable here: the Spark route reports it properly
        raise Untranslatable(f"Spark could not parse it: {type(exc).__name__}") from exc
    return nodes


def condition(spark: SparkSession, expression: str | Column, scope: Scope) -> str:
    """A boolean condition as DataFusion SQL."""
    sql, family = _Walk(tree(spark, expression), scope).expression()
    if family != "bool":
        raise Untranslatable("the condition is not a boolean expression")
    return sql


@dataclass(frozen=True)
class JoinKey:
    """A top-level ``target.a = source.b`` of an ON clause, rewritten null-safe."""

    target: str  # quoted SQL reference
    source: str  # the source column's name
    family: str


def join_condition(
    spark: SparkSession, expression: str | Column, scope: Scope
) -> tuple[str, tuple[JoinKey, ...]]:
    """The ON clause as DataFusion SQL, and the ``=`` keys it rewrote.

    DataFusion hash-joins on the top-level ``=`` pairs, or, when there are none, on the
    ``IS NOT DISTINCT FROM`` pairs, never on both. With a mix, the null-safe pairs become a
    filter over every pair the ``=`` keys match, close to a cross join when those are few
    values (a region, a date): 12.6 s where the null-safe keys alone take 0.06 s. So when the
    clause has a top-level null-safe pair, each top-level ``t.a = s.b`` becomes
    ``t.a IS NOT DISTINCT FROM s.b AND t.a IS NOT NULL AND s.b IS NOT NULL``, which matches
    the same rows, and every key is hashed. delta-rs derives its file-skipping filter only
    from ``=`` pairs, so the caller adds :func:`key_bounds` for the rewritten keys.
    """
    nodes = tree(spark, expression)
    parts = _conjuncts(nodes, 0, len(nodes))
    pairs = [_target_source_pair(nodes[a:b], scope) for a, b in parts]
    if not any(p is not None and p[0] == "IS NOT DISTINCT FROM" for p in pairs):
        return condition(spark, expression, scope), ()
    sqls: list[str] = []
    keys: list[JoinKey] = []
    for (a, b), pair in zip(parts, pairs, strict=True):
        if pair is not None and pair[0] == "=":
            _, target, source, key_family = pair
            source_ref = f'"{SOURCE}"."{source}"'
            # Every part in parentheses: DataFusion binds IS NOT DISTINCT FROM looser
            # than AND.
            sqls.append(
                f"(({target} IS NOT DISTINCT FROM {source_ref}) AND ({target} IS NOT NULL)"
                f" AND ({source_ref} IS NOT NULL))"
            )
            keys.append(JoinKey(target, source, key_family))
            continue
        sql, family = _Walk(nodes[a:b], scope).expression()
        if family != "bool":
            raise Untranslatable("the condition is not a boolean expression")
        sqls.append(sql)
    return "(" + " AND ".join(sqls) + ")", tuple(keys)


def key_bounds(keys: tuple[JoinKey, ...], source: Any) -> str:
    """``AND (t.a BETWEEN lo AND hi)`` for each rewritten key over the source's values
    (a pyarrow Table): implied by the key's equality, and the shape delta-rs skips target
    files by. Integer keys, and string keys whose bounds are plain printable ASCII (no
    quoting question); others go without, which costs time, never rows."""
    import pyarrow.compute as pc

    out = []
    for key in keys:
        if key.family not in ("int", "string"):
            continue
        bounds = pc.min_max(source.column(key.source)).as_py()
        low, high = bounds["min"], bounds["max"]
        if low is None or high is None:
            continue
        if key.family == "string":
            if not all(_PLAIN_TEXT.fullmatch(str(v)) for v in (low, high)):
                continue
            low, high = f"'{low}'", f"'{high}'"
        out.append(f" AND ({key.target} BETWEEN {low} AND {high})")
    return "".join(out)


_PLAIN_TEXT = re.compile(r"[ -&(-\[\]-~]*")  # printable ASCII but quote and backslash


def _conjuncts(nodes: list[dict[str, Any]], start: int, end: int) -> list[tuple[int, int]]:
    """The [start, end) spans of the top-level AND's operands in a pre-order list."""
    if _kind(nodes[start]) in ("And", "and") and int(nodes[start].get("num-children", 0)) == 2:
        middle = _subtree_end(nodes, start + 1)
        return _conjuncts(nodes, start + 1, middle) + _conjuncts(nodes, middle, end)
    return [(start, end)]


def _subtree_end(nodes: list[dict[str, Any]], at: int) -> int:
    if at >= len(nodes):
        raise Untranslatable("malformed expression tree")
    at, pending = at + 1, int(nodes[at].get("num-children", 0))
    for _ in range(pending):
        at = _subtree_end(nodes, at)
    return at


def _target_source_pair(
    nodes: list[dict[str, Any]], scope: Scope
) -> tuple[str, str, str, str] | None:
    """(operator, target SQL, source column name, family) when ``nodes`` is a ``=`` or a
    ``<=>`` between a target and a source column of one family, else None."""
    if len(nodes) != 3 or int(nodes[0].get("num-children", 0)) != 2:
        return None
    operator = _COMPARISONS.get(_kind(nodes[0]))
    if operator not in ("=", "IS NOT DISTINCT FROM"):
        return None
    if any(_kind(n) != "UnresolvedAttribute" for n in nodes[1:]):
        return None
    columns = [scope.column(_name_parts(n)) for n in nodes[1:]]
    families = {_FAMILIES.get(t) for _, t in columns}
    if None in families or len(families) != 1:
        return None
    by_side = {sql.split(".", 1)[0].strip('"'): sql for sql, _ in columns}
    if set(by_side) != {TARGET, SOURCE}:
        return None
    source_name = by_side[SOURCE].split(".", 1)[1].strip('"')
    return operator, by_side[TARGET], source_name, families.pop() or ""


# A source column assigned to a wider target column: the lossless widenings Spark's MERGE
# applies implicitly, as DataFusion's CAST (the same values: integers, and float to double).
_WIDENS_TO = {
    "tinyint": {"smallint": "SMALLINT", "int": "INT", "bigint": "BIGINT"},
    "smallint": {"int": "INT", "bigint": "BIGINT"},
    "int": {"bigint": "BIGINT"},
    "float": {"double": "DOUBLE"},
}


def widened(sql: str, spark_type: str, target_type: str) -> str | None:
    """``sql`` (a column of ``spark_type``) as a value of ``target_type``: itself, a CAST
    when the type widens without loss, or None (a cast that could change a value)."""
    if spark_type == target_type:
        return sql
    cast = _WIDENS_TO.get(spark_type, {}).get(target_type)
    return None if cast is None else f"CAST({sql} AS {cast})"


def value(spark: SparkSession, expression: str | Column, scope: Scope, target_type: str) -> str:
    """A value assigned to a column of ``target_type``: a column of that type or of one
    that widens to it without loss, or a literal that fits it without a narrowing cast."""
    nodes = tree(spark, expression)
    if len(nodes) != 1:
        raise Untranslatable("an assigned value is not a column or a literal")
    node = nodes[0]
    kind = _kind(node)
    if kind == "UnresolvedAttribute":
        sql, spark_type = scope.column(_name_parts(node))
        cast = widened(sql, spark_type, target_type)
        if cast is None:
            raise Untranslatable(f"assigning {spark_type} to a {target_type} column casts")
        return cast
    if kind == "Literal":
        sql, family = _literal(node)
        fits = {
            "integer": ("int", "bigint"),
            "long": ("bigint",),
            "string": ("string",),
            "boolean": ("boolean",),
        }
        if target_type not in fits.get(str(node.get("dataType")), ()):
            raise Untranslatable(f"a {family} literal assigned to a {target_type} column")
        return sql
    raise Untranslatable(f"an assigned value is a {kind}")


class _Walk:
    """Rebuilds the pre-order list into SQL, node by node."""

    def __init__(self, nodes: list[dict[str, Any]], scope: Scope) -> None:
        self._nodes = nodes
        self._at = 0
        self._scope = scope

    def _next(self) -> dict[str, Any]:
        if self._at >= len(self._nodes):
            raise Untranslatable("malformed expression tree")
        node = self._nodes[self._at]
        self._at += 1
        return node

    def expression(self) -> tuple[str, str | None]:
        """(SQL, family) of the next subtree; family None: a type no comparison takes."""
        node = self._next()
        kind = _kind(node)
        count = int(node.get("num-children", 0))
        if kind == "UnresolvedAttribute":
            sql, spark_type = self._scope.column(_name_parts(node))
            return sql, _FAMILIES.get(spark_type)
        if kind == "Literal":
            return _literal(node)
        children = [self.expression() for _ in range(count)]
        if kind in _LOGICAL and count == 2:
            _require_bool(children)
            return f"({children[0][0]} {_LOGICAL[kind]} {children[1][0]})", "bool"
        if kind in _NOT and count == 1:
            _require_bool(children)
            return f"(NOT {children[0][0]})", "bool"
        if kind in _NULL_TESTS and count == 1:
            return f"({children[0][0]} {_NULL_TESTS[kind]})", "bool"
        if kind in _COMPARISONS and count == 2:
            _require_comparable(children)
            return f"({children[0][0]} {_COMPARISONS[kind]} {children[1][0]})", "bool"
        if kind in _IN and count >= 2:
            items = children[1:]
            if any(not _is_literal_sql(s) for s, _ in items):
                raise Untranslatable("IN with a non-literal list item")
            _require_comparable(children)
            return f"({children[0][0]} IN ({', '.join(s for s, _ in items)}))", "bool"
        raise Untranslatable(f"{kind} is outside the exact core")


def _kind(node: Mapping[str, Any]) -> str:
    cls = str(node.get("class", ""))
    short = cls.rsplit(".", 1)[-1]
    if short == "UnresolvedFunction":
        name = _name_parts(node)
        return name[0] if len(name) == 1 else ".".join(name)
    return short


def _name_parts(node: Mapping[str, Any]) -> list[str]:
    """``nameParts`` ("[t, id]" in toJSON): alias first, the column name whole (names
    are plain identifiers here, so the ", " join is unambiguous)."""
    text = str(node.get("nameParts", ""))
    if not (text.startswith("[") and text.endswith("]")):
        raise Untranslatable("a name the tree does not spell out")
    return text[1:-1].split(", ")


def _literal(node: Mapping[str, Any]) -> tuple[str, str]:
    data_type = node.get("dataType")
    family = _LITERALS.get(str(data_type))
    raw = node.get("value")
    if family is None or raw is None:
        raise Untranslatable(f"a {data_type} literal")
    text = str(raw)
    if family == "string":
        return "'" + text.replace("'", "''") + "'", family
    if family == "bool":
        if text.lower() not in ("true", "false"):
            raise Untranslatable("a malformed boolean literal")
        return text.upper(), family
    if not re.fullmatch(r"-?[0-9]+", text):
        raise Untranslatable("a malformed integer literal")
    return text, family


def _is_literal_sql(sql: str) -> bool:
    return not sql.startswith('"') and not sql.startswith("(")


def _require_bool(children: list[tuple[str, str | None]]) -> None:
    if any(family != "bool" for _, family in children):
        raise Untranslatable("a logical operator over a non-boolean operand")


def _require_comparable(children: list[tuple[str, str | None]]) -> None:
    families = {family for _, family in children}
    if None in families or len(families) != 1:
        raise Untranslatable("a comparison across types (an implicit cast) or of floats")
