"""Spark Connect ``Column`` expressions as exact Spark SQL text.

A Connect ``Column`` is a tree of ``spark.connect.Expression`` protos (the wire format
the client sends the server). ``DeltaTable``'s conditions and assignments reach the
server inside a SQL statement, so each proto node is written as the SQL that Spark's
parser turns back into the same expression: column names quoted part by part as the
Connect planner splits them, literals with their exact type and value, operators infix.
A node with no exact SQL form (a Python UDF, a window, a DataFrame-bound column that is
not the MERGE source's, a lambda, an interval literal) is refused with
:class:`~deltaflow.errors.InvalidOptionError` saying what to pass instead (a SQL
string); nothing is ever guessed.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltaflow.errors import InvalidOptionError

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.connect.proto import Expression
    from pyspark.sql.types import DataType

# Connect's operator names (pyspark/sql/connect/column.py) and their SQL spelling.
_INFIX = {
    "==": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "<=>": "<=>", "!=": "!=",
    "+": "+", "-": "-", "*": "*", "/": "/", "%": "%", "and": "AND", "or": "OR",
    "&": "&", "|": "|", "^": "^",
}  # fmt: skip
_PREFIX = {"not": "NOT ", "negative": "- ", "~": "~ "}
_POSTFIX = {"isnull": " IS NULL", "isnotnull": " IS NOT NULL"}
_EPOCH = dt.datetime(1970, 1, 1)


def sql_text(
    spark: SparkSession,
    value: str | Column,
    argument: str,
    *,
    plan_aliases: Mapping[int, str] | None = None,
) -> str:
    """``value`` as SQL: a string passes through (parenthesized), a Connect ``Column`` is
    written from its expression proto. ``plan_aliases`` maps the plan id of a DataFrame
    whose ``df["col"]`` columns may appear (the MERGE source) to the name that
    qualifies them in the statement."""
    if isinstance(value, str):
        return f"({value})"
    proto = _column_proto(spark, value, argument)
    return _Writer(argument, plan_aliases or {}).expression(proto)


def quote_identifier(name: str) -> str:
    """``name`` as one backtick-quoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def column_path(name: str) -> str:
    """A column name as Spark reads one from an API string (``"a.b"``, ``"`x.y`"``: dots
    split nested fields unless backtick-quoted), quoted part by part."""
    return ".".join(quote_identifier(part) for part in _name_parts(name))


def string_literal(value: str) -> str:
    """``value`` as a SQL string literal (Spark's default escaping)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def type_sql(data_type: DataType) -> str:
    """A Spark ``DataType`` as DDL text (field names quoted, comments kept)."""
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StructType

    if isinstance(data_type, StructType):
        fields = []
        for f in data_type.fields:
            text = f"{quote_identifier(f.name)}: {type_sql(f.dataType)}"
            if not f.nullable:
                text += " NOT NULL"
            comment = (f.metadata or {}).get("comment")
            if comment is not None:
                text += f" COMMENT {string_literal(str(comment))}"
            fields.append(text)
        return f"STRUCT<{', '.join(fields)}>"
    if isinstance(data_type, ArrayType):
        return f"ARRAY<{type_sql(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"MAP<{type_sql(data_type.keyType)}, {type_sql(data_type.valueType)}>"
    if isinstance(data_type, DecimalType):
        return f"DECIMAL({data_type.precision},{data_type.scale})"
    return data_type.simpleString().upper()


def _name_parts(name: str) -> list[str]:
    # Spark's UnresolvedAttribute.parseAttributeName: dots split, backticks quote, a
    # doubled backtick inside quotes is one backtick.
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    i = 0
    while i < len(name):
        char = name[i]
        if quoted:
            if char == "`" and name[i + 1 : i + 2] == "`":
                current.append("`")
                i += 1
            elif char == "`":
                quoted = False
            else:
                current.append(char)
        elif char == "`":
            quoted = True
        elif char == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    if quoted:
        raise InvalidOptionError(
            f"Column name {name!r} has an unclosed backtick: quote a name that contains dots"
            " as `a.b`, with `` for a backtick inside.",
            option="column",
        )
    parts.append("".join(current))
    return parts


def _column_proto(spark: SparkSession, value: Column, argument: str) -> Expression:
    from pyspark.sql import Column

    if not isinstance(value, Column):
        raise TypeError(f"{argument} must be a SQL string or a Column, not {type(value)}.")
    to_plan = getattr(value, "to_plan", None)
    if to_plan is None:
        raise InvalidOptionError(
            f"{argument} is a classic pyspark Column, but the session is a Spark Connect"
            " session: build it with the Connect session's functions (pyspark.sql.functions"
            " while the Connect session is active), or pass a SQL string.",
            option=argument,
        )
    return to_plan(spark.client)  # type: ignore[attr-defined, no-any-return]


class _Writer:
    def __init__(self, argument: str, plan_aliases: Mapping[int, str]) -> None:
        self._argument = argument
        self._plan_aliases = plan_aliases

    def refuse(self, what: str) -> InvalidOptionError:
        return InvalidOptionError(
            f"{self._argument}: {what} has no exact SQL form, and on a Spark Connect session"
            " DeltaTable sends its conditions and values to the server as SQL. Pass this"
            ' condition or value as a SQL string instead (e.g. "t.id = s.id",'
            ' {"name": "upper(s.name)"}).',
            option=self._argument,
        )

    def expression(self, e: Expression) -> str:
        kind = e.WhichOneof("expr_type")
        if kind == "literal":
            return self.literal(e.literal)
        if kind == "unresolved_attribute":
            return self.attribute(e.unresolved_attribute)
        if kind == "unresolved_function":
            return self.function(e.unresolved_function)
        if kind == "expression_string":
            return f"({e.expression_string.expression})"
        if kind == "cast":
            return self.cast(e.cast)
        if kind == "unresolved_extract_value":
            extract = e.unresolved_extract_value
            child = self.expression(extract.child)
            return f"({child})[{self.expression(extract.extraction)}]"
        if kind == "call_function":
            call = e.call_function
            arguments = ", ".join(self.expression(a) for a in call.arguments)
            return f"{column_path(call.function_name)}({arguments})"
        names = {
            "common_inline_user_defined_function": "a user-defined function",
            "window": "a window expression",
            "lambda_function": "a lambda function",
            "unresolved_star": "a * (star)",
            "alias": "an aliased column (.alias())",
            "subquery_expression": "a subquery",
        }
        raise self.refuse(names.get(kind or "", f"a {kind} expression"))

    def attribute(self, a: Any) -> str:
        if getattr(a, "is_metadata_column", False):
            raise self.refuse(f"the metadata column {a.unparsed_identifier!r}")
        name = column_path(a.unparsed_identifier)
        if not a.HasField("plan_id"):
            return name
        alias = self._plan_aliases.get(a.plan_id)
        if alias is None:
            raise self.refuse(
                f"the column {a.unparsed_identifier!r} bound to a DataFrame (df[...] / df.col)"
            )
        return f"{quote_identifier(alias)}.{name}"

    def function(self, f: Any) -> str:
        name = f.function_name
        args = [self.expression(a) for a in f.arguments]
        if getattr(f, "is_internal", False):  # not in every pyspark's proto
            raise self.refuse(f"the internal function {name!r}")
        lower = name.lower()
        if not f.is_distinct and not f.is_user_defined_function:
            if name in _INFIX and len(args) == 2:
                return f"({args[0]} {_INFIX[name]} {args[1]})"
            if lower in _PREFIX and len(args) == 1:
                return f"({_PREFIX[lower]}{args[0]})"
            if lower in _POSTFIX and len(args) == 1:
                return f"({args[0]}{_POSTFIX[lower]})"
            if lower == "in" and len(args) >= 2:
                return f"({args[0]} IN ({', '.join(args[1:])}))"
            if lower == "when" and len(args) >= 2:
                branches = "".join(
                    f" WHEN {args[i]} THEN {args[i + 1]}" for i in range(0, len(args) - 1, 2)
                )
                otherwise = f" ELSE {args[-1]}" if len(args) % 2 else ""
                return f"(CASE{branches}{otherwise} END)"
        if name in _INFIX or lower in ("in", "when"):
            raise self.refuse(f"the operator {name!r} with {len(args)} operands")
        head = column_path(name) if f.is_user_defined_function else quote_identifier(name)
        distinct = "DISTINCT " if f.is_distinct else ""
        return f"{head}({distinct}{', '.join(args)})"

    def cast(self, c: Any) -> str:
        from pyspark.sql.connect.proto import Expression
        from pyspark.sql.connect.types import proto_schema_to_pyspark_data_type

        modes = Expression.Cast.EvalMode
        if c.eval_mode not in (modes.EVAL_MODE_UNSPECIFIED, modes.EVAL_MODE_TRY):
            raise self.refuse("a cast with an explicit ANSI/legacy evaluation mode")
        target = (
            c.type_str
            if c.WhichOneof("cast_to_type") == "type_str"
            else type_sql(proto_schema_to_pyspark_data_type(c.type))
        )
        keyword = "TRY_CAST" if c.eval_mode == modes.EVAL_MODE_TRY else "CAST"
        return f"{keyword}({self.expression(c.expr)} AS {target})"

    def literal(self, lit: Any) -> str:
        kind = lit.WhichOneof("literal_type")
        if kind == "null":
            from pyspark.sql.connect.types import proto_schema_to_pyspark_data_type
            from pyspark.sql.types import NullType

            data_type = proto_schema_to_pyspark_data_type(lit.null)
            return (
                "NULL"
                if isinstance(data_type, NullType)
                else f"CAST(NULL AS {type_sql(data_type)})"
            )
        if kind == "boolean":
            return "TRUE" if lit.boolean else "FALSE"
        integral = {"byte": "TINYINT", "short": "SMALLINT", "integer": "INT", "long": "BIGINT"}
        if kind in integral:
            value = int(getattr(lit, kind))
            suffix = {"byte": "Y", "short": "S", "integer": "", "long": "L"}[kind]
            return f"{value}{suffix}" if value >= 0 else f"CAST({value} AS {integral[kind]})"
        if kind in ("float", "double"):
            number = float(getattr(lit, kind))
            text = "NaN" if math.isnan(number) else repr(number).replace("inf", "Infinity")
            return f"CAST('{text}' AS {kind.upper()})"
        if kind == "decimal":
            return self.decimal(lit.decimal)
        if kind == "string":
            return string_literal(lit.string)
        if kind == "binary":
            return f"X'{lit.binary.hex().upper()}'"
        if kind == "date":
            return f"DATE_FROM_UNIX_DATE({int(lit.date)})"
        if kind == "timestamp":
            return f"TIMESTAMP_MICROS({int(lit.timestamp)})"
        if kind == "timestamp_ntz":
            moment = _EPOCH + dt.timedelta(microseconds=int(lit.timestamp_ntz))
            return f"TIMESTAMP_NTZ '{moment.isoformat(sep=' ', timespec='microseconds')}'"
        raise self.refuse(f"a {kind} literal")

    def decimal(self, d: Any) -> str:
        # The Connect server types a decimal literal DECIMAL(max(precision of the value,
        # the proto's precision, scale), max(scale of the value, the proto's scale)),
        # the value's digits and scale as Java's BigDecimal counts them.
        try:
            value = decimal.Decimal(d.value)
        except decimal.InvalidOperation:
            raise self.refuse(f"the decimal literal {d.value!r}") from None
        if not value.is_finite():
            raise self.refuse(f"the decimal literal {d.value!r}")
        digits, exponent = value.as_tuple().digits, int(value.as_tuple().exponent)
        if exponent > 0:  # Spark keeps no negative scale: 1E+3 is 1000
            digits, exponent = (*digits, *([0] * exponent)), 0
        scale = max(-exponent, d.scale if d.HasField("scale") else 0)
        precision = max(len(digits), d.precision if d.HasField("precision") else 0, scale)
        if precision > 38:
            raise self.refuse(f"the decimal literal {d.value!r} (over 38 digits)")
        return f"CAST('{value:f}' AS DECIMAL({precision},{scale}))"
