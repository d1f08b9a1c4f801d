"""SQL predicate strings (``replaceWhere``) parsed into Arrow expressions.

delta-spark takes predicates as Spark SQL text. We cannot ask the JVM to parse
them for us inside a Python data source, so this module parses the grammar such
predicates use in practice: comparisons, ``IN``, ``IS [NOT] NULL``, ``BETWEEN``,
``AND`` / ``OR`` / ``NOT`` and typed literals. Anything else is refused with an
:class:`InvalidOptionError` naming the option and the part we could not read,
never guessed at.

The parsed tree becomes a ``pyarrow.compute.Expression`` with SQL's three-valued
logic (a comparison with null is null; ``AND`` / ``OR`` are Kleene), and can
also be checked against a file's min/max statistics (:func:`may_match`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from deltaflow.errors import InvalidOptionError

ColumnPath = tuple[str, ...]


@dataclass(frozen=True)
class Column:
    path: ColumnPath


@dataclass(frozen=True)
class Literal:
    value: Any  # None, bool, int, Decimal, float, str, date, datetime


Operand = Column | Literal


@dataclass(frozen=True)
class Compare:
    op: str  # one of _COMPARISONS
    left: Operand
    right: Operand


@dataclass(frozen=True)
class IsNull:
    operand: Operand
    negated: bool = False


@dataclass(frozen=True)
class InList:
    operand: Operand
    values: tuple[Operand, ...]
    negated: bool = False


@dataclass(frozen=True)
class Between:
    operand: Operand
    low: Operand
    high: Operand
    negated: bool = False


@dataclass(frozen=True)
class And:
    left: Node
    right: Node


@dataclass(frozen=True)
class Or:
    left: Node
    right: Node


@dataclass(frozen=True)
class Not:
    child: Node


Node = Compare | IsNull | InList | Between | And | Or | Not | Literal | Column

_COMPARISONS = ("=", "<=>", "<>", "<", "<=", ">", ">=")
_FLIP = {"=": "=", "<=>": "<=>", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NEGATE = {"=": "<>", "<>": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
    | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[dDlL]?)
    | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
    | (?P<quoted>`(?:[^`]|``)+`)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=>|<=|>=|<>|!=|==|=|<|>)
    | (?P<punct>[(),.\-])
    """,
    re.VERBOSE,
)
_KEYWORDS = {
    "and",
    "or",
    "not",
    "in",
    "is",
    "null",
    "between",
    "true",
    "false",
    "date",
    "timestamp",
    "timestamp_ntz",
    "timestamp_ltz",
    "like",
}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    position: int


class _Parser:
    def __init__(self, text: str, option: str) -> None:
        self.text = text
        self.option = option
        self.tokens = self._tokenize(text)
        self.index = 0

    def fail(self, what: str, position: int | None = None) -> InvalidOptionError:
        where = len(self.text) if position is None else position
        return InvalidOptionError(
            f"Option '{self.option}' = {self.text!r}: {what} (at character {where}). Supported:"
            " comparisons (=, <>, !=, <, <=, >, >=, <=>), IN / NOT IN, IS [NOT] NULL,"
            " [NOT] BETWEEN, AND, OR, NOT, parentheses, column names, and string, number,"
            " boolean, NULL, DATE'...' and TIMESTAMP'...' literals.",
            option=self.option,
        )

    def _tokenize(self, text: str) -> list[_Token]:
        tokens: list[_Token] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                raise self.fail(f"unsupported syntax {text[position : position + 10]!r}", position)
            kind = match.lastgroup or ""
            if kind != "ws":
                tokens.append(_Token(kind, match.group(), position))
            position = match.end()
        return tokens

    def peek(self, offset: int = 0) -> _Token | None:
        i = self.index + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def keyword(self, word: str, offset: int = 0) -> bool:
        token = self.peek(offset)
        return token is not None and token.kind == "word" and token.text.lower() == word

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise self.fail("unexpected end of the predicate")
        self.index += 1
        return token

    def expect(self, text: str) -> None:
        token = self.take()
        if token.text.lower() != text:
            raise self.fail(f"expected {text!r}, found {token.text!r}", token.position)

    def parse(self) -> Node:
        if not self.tokens:
            raise self.fail("the predicate is empty", 0)
        node = self.parse_or()
        token = self.peek()
        if token is not None:
            raise self.fail(f"unsupported syntax {token.text!r}", token.position)
        return node

    def parse_or(self) -> Node:
        node = self.parse_and()
        while self.keyword("or"):
            self.take()
            node = Or(node, self.parse_and())
        return node

    def parse_and(self) -> Node:
        node = self.parse_not()
        while self.keyword("and"):
            self.take()
            node = And(node, self.parse_not())
        return node

    def parse_not(self) -> Node:
        if self.keyword("not"):
            self.take()
            return Not(self.parse_not())
        return self.parse_predicate()

    def parse_predicate(self) -> Node:
        token = self.peek()
        if token is not None and token.text == "(":
            self.take()
            inner = self.parse_or()
            self.expect(")")
            return inner
        left = self.parse_operand()
        token = self.peek()
        if token is None or token.text == ")" or self.keyword("and") or self.keyword("or"):
            return left  # a bare boolean column or literal
        if token.kind == "op":
            self.take()
            op = {"!=": "<>", "==": "="}.get(token.text, token.text)
            return Compare(op, left, self.parse_operand())
        negated = False
        if self.keyword("is"):
            self.take()
            if self.keyword("not"):
                self.take()
                negated = True
            self.expect("null")
            return IsNull(left, negated)
        if self.keyword("not"):
            self.take()
            negated = True
        if self.keyword("in"):
            self.take()
            self.expect("(")
            values = [self.parse_operand()]
            while self.peek() is not None and self.peek().text == ",":  # type: ignore[union-attr]
                self.take()
                values.append(self.parse_operand())
            self.expect(")")
            return InList(left, tuple(values), negated)
        if self.keyword("between"):
            self.take()
            low = self.parse_operand()
            self.expect("and")
            return Between(left, low, self.parse_operand(), negated)
        bad = self.peek() or token
        raise self.fail(f"unsupported syntax {bad.text!r}", bad.position)

    def parse_operand(self) -> Operand:
        token = self.take()
        if token.text == "-":
            number = self.take()
            if number.kind != "number":
                raise self.fail("unsupported syntax '-' (arithmetic)", token.position)
            value = _number(number.text)
            return Literal(-value)
        if token.kind == "number":
            return Literal(_number(token.text))
        if token.kind == "string":
            return Literal(_unquote(token.text))
        if token.kind == "quoted":
            return Column(self.column_path(token.text[1:-1].replace("``", "`")))
        if token.kind == "word":
            lowered = token.text.lower()
            if lowered == "null":
                return Literal(None)
            if lowered in ("true", "false"):
                return Literal(lowered == "true")
            nxt = self.peek()
            if lowered in ("date", "timestamp", "timestamp_ntz", "timestamp_ltz") and (
                nxt is not None and nxt.kind == "string"
            ):
                self.take()
                return Literal(self.typed_literal(lowered, _unquote(nxt.text), nxt.position))
            if nxt is not None and nxt.text == "(":
                raise self.fail(f"unsupported function call {token.text}(...)", token.position)
            if lowered in _KEYWORDS:
                raise self.fail(f"unsupported syntax {token.text!r}", token.position)
            return Column(self.column_path(token.text))
        raise self.fail(f"unsupported syntax {token.text!r}", token.position)

    def column_path(self, first: str) -> ColumnPath:
        path = [first]
        while self.peek() is not None and self.peek().text == ".":  # type: ignore[union-attr]
            self.take()
            part = self.take()
            if part.kind not in ("word", "quoted"):
                raise self.fail(f"unsupported syntax {part.text!r}", part.position)
            path.append(part.text[1:-1].replace("``", "`") if part.kind == "quoted" else part.text)
        return tuple(path)

    def typed_literal(self, kind: str, raw: str, position: int) -> Any:
        try:
            if kind == "date":
                return dt.date.fromisoformat(raw.strip()[:10])
            value = dt.datetime.fromisoformat(raw.strip().replace("T", " ").replace("Z", "+00:00"))
        except ValueError:
            raise self.fail(f"{kind.upper()} literal {raw!r} is not valid", position) from None
        if kind == "timestamp_ntz":
            return value.replace(tzinfo=None)
        # Spark reads a zone-less TIMESTAMP literal in the session time zone; deltaflow
        # sessions run in UTC, so zone-less means UTC here.
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _number(text: str) -> int | float | decimal.Decimal:
    suffix = text[-1].lower()
    if suffix in ("d",):
        return float(text[:-1])
    if suffix == "l":
        return int(text[:-1])
    if "e" in text.lower():
        return float(text)
    if "." in text:
        return decimal.Decimal(text)
    return int(text)


def _unquote(text: str) -> str:
    quote = text[0]
    body = text[1:-1].replace(quote * 2, quote)
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def parse(text: str, *, option: str = "replaceWhere") -> Node:
    """Parse SQL predicate ``text``; errors are :class:`InvalidOptionError` naming ``option``."""
    return _Parser(text, option).parse()


def columns(node: Node) -> set[ColumnPath]:
    """Every column path ``node`` mentions."""
    if isinstance(node, Column):
        return {node.path}
    if isinstance(node, Literal):
        return set()
    if isinstance(node, Compare):
        return columns(node.left) | columns(node.right)
    if isinstance(node, IsNull):
        return columns(node.operand)
    if isinstance(node, InList):
        return columns(node.operand).union(*(columns(v) for v in node.values))
    if isinstance(node, Between):
        return columns(node.operand) | columns(node.low) | columns(node.high)
    if isinstance(node, (And, Or)):
        return columns(node.left) | columns(node.right)
    return columns(node.child)


# ---- Arrow expressions ----------------------------------------------------------------


def to_expression(node: Node, schema: pa.Schema, *, option: str = "replaceWhere") -> pc.Expression:
    """``node`` as an Arrow expression over ``schema`` (column names match case-insensitively)."""
    return _Builder(schema, option).build(node)


class _Builder:
    def __init__(self, schema: pa.Schema, option: str) -> None:
        self.schema = schema
        self.option = option

    def fail(self, what: str) -> InvalidOptionError:
        return InvalidOptionError(f"Option '{self.option}': {what}.", option=self.option)

    def resolve(self, path: ColumnPath) -> tuple[ColumnPath, pa.DataType]:
        fields: Any = self.schema
        resolved: list[str] = []
        t: pa.DataType | None = None
        for part in path:
            names = [f.name for f in fields] if fields is not None else []
            match = next((n for n in names if n.lower() == part.lower()), None)
            if match is None:
                raise self.fail(
                    f"column {'.'.join(path)} does not exist;"
                    f" columns: {', '.join(self.schema.names)}"
                )
            resolved.append(match)
            t = fields.field(match).type
            fields = t if pa.types.is_struct(t) else None
        assert t is not None
        return tuple(resolved), t

    def build(self, node: Node) -> pc.Expression:
        if isinstance(node, And):
            return pc.Expression._call(
                "and_kleene", [self.build(node.left), self.build(node.right)]
            )
        if isinstance(node, Or):
            return pc.Expression._call("or_kleene", [self.build(node.left), self.build(node.right)])
        if isinstance(node, Not):
            return pc.Expression._call("invert", [self.build(node.child)])
        if isinstance(node, IsNull):
            operand = self.operand(node.operand, None)
            return operand.is_valid() if node.negated else operand.is_null()
        if isinstance(node, Compare):
            return self.compare(node.op, node.left, node.right)
        if isinstance(node, InList):
            # An OR of equalities has SQL's IN semantics with nulls for free.
            result: pc.Expression | None = None
            for value in node.values:
                equal = self.compare("=", node.operand, value)
                result = (
                    equal if result is None else pc.Expression._call("or_kleene", [result, equal])
                )
            assert result is not None
            return pc.Expression._call("invert", [result]) if node.negated else result
        if isinstance(node, Between):
            inside = pc.Expression._call(
                "and_kleene",
                [
                    self.compare(">=", node.operand, node.low),
                    self.compare("<=", node.operand, node.high),
                ],
            )
            return pc.Expression._call("invert", [inside]) if node.negated else inside
        if isinstance(node, Column):
            path, t = self.resolve(node.path)
            if not pa.types.is_boolean(t):
                raise self.fail(f"column {'.'.join(path)} is not boolean, so it is not a predicate")
            return pc.field(*path)
        if isinstance(node.value, bool) or node.value is None:
            return pc.scalar(pa.scalar(node.value, pa.bool_()))
        raise self.fail(f"literal {node.value!r} is not a predicate")

    def operand(self, operand: Operand, like: pa.DataType | None) -> pc.Expression:
        if isinstance(operand, Column):
            path, _ = self.resolve(operand.path)
            return pc.field(*path)
        return pc.scalar(self.literal(operand.value, like))

    def literal(self, value: Any, like: pa.DataType | None) -> pa.Scalar:
        if value is None:
            return pa.scalar(None, like or pa.null())
        scalar = pa.scalar(value)
        if like is None or scalar.type.equals(like):
            return scalar
        try:
            return scalar.cast(like)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise self.fail(
                f"literal {value!r} cannot be compared with a column of type {like}"
            ) from None

    def compare(self, op: str, left: Operand, right: Operand) -> pc.Expression:
        if isinstance(left, Literal) and isinstance(right, Column):
            left, right, op = right, left, _FLIP[op]
        like: pa.DataType | None = None
        if isinstance(left, Column):
            _, like = self.resolve(left.path)
        if (
            isinstance(right, Literal)
            and like is not None
            and pa.types.is_integer(like)
            and isinstance(right.value, (float, decimal.Decimal))
            and right.value != int(right.value)
        ):
            # `int_col > 1.5` must not round the literal: compare as doubles instead.
            a: pc.Expression = self.operand(left, None).cast(pa.float64())
            b = pc.scalar(pa.scalar(float(right.value)))
        else:
            a, b = self.operand(left, None), self.operand(right, like)
        if op == "<=>":
            both_null = pc.Expression._call("and_kleene", [a.is_null(), b.is_null()])
            equal = pc.Expression._call("coalesce", [a == b, pc.scalar(False)])
            return pc.Expression._call("or_kleene", [both_null, equal])
        functions = {
            "=": "equal",
            "<>": "not_equal",
            "<": "less",
            "<=": "less_equal",
            ">": "greater",
            ">=": "greater_equal",
        }
        return pc.Expression._call(functions[op], [a, b])


def evaluate(expression: pc.Expression, data: pa.Table | pa.RecordBatch) -> pa.ChunkedArray:
    """The predicate's value (true / false / null) for every row of ``data``."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    return pads.dataset(table).to_table(columns={"_p": expression}, use_threads=False).column("_p")


def is_true(expression: pc.Expression) -> pc.Expression:
    """``expression`` with null turned into false: SQL's WHERE keeps only true rows."""
    return pc.Expression._call("coalesce", [expression, pc.scalar(False)])


# ---- statistics -------------------------------------------------------------------------

_TIMESTAMP_SLACK = dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class ColumnStats:
    """What a file's stats say about one column; None means unknown."""

    min: Any = None
    max: Any = None
    null_count: int | None = None
    num_records: int | None = None


StatsLookup = Callable[[ColumnPath], ColumnStats | None]


def may_match(node: Node, stats: StatsLookup) -> bool:
    """False only when ``stats`` prove no row of a file can make ``node`` true."""
    return _may(node, stats, negated=False)


def _may(node: Node, stats: StatsLookup, *, negated: bool) -> bool:
    if isinstance(node, Not):
        return _may(node.child, stats, negated=not negated)
    if isinstance(node, (And, Or)):
        # De Morgan: NOT (a AND b) is (NOT a) OR (NOT b).
        conjunction = isinstance(node, And) != negated
        left = _may(node.left, stats, negated=negated)
        right = _may(node.right, stats, negated=negated)
        return (left and right) if conjunction else (left or right)
    if isinstance(node, IsNull):
        if not isinstance(node.operand, Column):
            return True
        s = stats(node.operand.path)
        if s is None or s.null_count is None:
            return True
        wants_null = node.negated == negated
        if wants_null:
            return s.null_count > 0
        return s.num_records is None or s.null_count < s.num_records
    if isinstance(node, Compare):
        return _may_compare(
            _NEGATE.get(node.op, node.op) if negated else node.op,
            node.left,
            node.right,
            stats,
            exact_negation=negated and node.op == "<=>",
        )
    if isinstance(node, InList):
        if node.negated != negated:  # NOT IN: every inequality must be possible
            return all(_may_compare("<>", node.operand, v, stats) for v in node.values)
        return any(_may_compare("=", node.operand, v, stats) for v in node.values)
    if isinstance(node, Between):
        if node.negated != negated:
            return _may_compare("<", node.operand, node.low, stats) or _may_compare(
                ">", node.operand, node.high, stats
            )
        return _may_compare(">=", node.operand, node.low, stats) and _may_compare(
            "<=", node.operand, node.high, stats
        )
    return True


def _may_compare(
    op: str, left: Operand, right: Operand, stats: StatsLookup, *, exact_negation: bool = False
) -> bool:
    if exact_negation:
        return True  # NOT (a <=> b) can be true on nulls; not worth modelling
    if isinstance(left, Literal) and isinstance(right, Column):
        left, right, op = right, left, _FLIP[op]
    if not isinstance(left, Column) or not isinstance(right, Literal):
        return True
    value = right.value
    s = stats(left.path)
    if s is None:
        return True
    if value is None:
        # `x = NULL` is never true; `x <=> NULL` needs a null.
        return op == "<=>" and (s.null_count is None or s.null_count > 0)
    if s.num_records is not None and s.null_count is not None and s.null_count >= s.num_records:
        return False  # every value is null: no comparison is true
    low, high = s.min, s.max
    if isinstance(high, dt.datetime):
        # The log keeps timestamps at millisecond precision: a max of 12:00:00.123 may
        # stand for 12:00:00.123999, so a file is kept while the lost digits could match.
        high = high + _TIMESTAMP_SLACK
    try:
        checks: Mapping[str, Callable[[], bool]] = {
            "=": lambda: _le(low, value) and _le(value, high),
            "<=>": lambda: _le(low, value) and _le(value, high),
            "<>": lambda: not (low is not None and low == high == value),
            "<": lambda: low is None or _cmp(low) < _cmp(value),
            "<=": lambda: low is None or _cmp(low) <= _cmp(value),
            ">": lambda: high is None or _cmp(high) > _cmp(value),
            ">=": lambda: high is None or _cmp(high) >= _cmp(value),
        }
        return checks[op]()
    except TypeError:
        return True  # stats and literal of incomparable Python types: cannot prune


def _le(a: Any, b: Any) -> bool:
    return a is None or b is None or _cmp(a) <= _cmp(b)


def _cmp(value: Any) -> Any:
    # Dates compare with datetimes (date literal vs timestamp column) at midnight UTC.
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value
