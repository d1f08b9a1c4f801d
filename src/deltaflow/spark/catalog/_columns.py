"""Declaring generated and identity columns: delta-spark's ``IdentityGenerator`` and
``DeltaColumnBuilder`` (``DeltaTable.columnBuilder(spark, name)``), the field metadata
they put in the log, and the checks of generation expressions Spark makes for SQL.

The log side (metadata keys, identity rules, high water marks) is
``deltaflow/table/_generated.py``; this module is what needs Spark: turning Spark's own
column metadata (``CREATE TABLE ... GENERATED ...`` hands the catalog ``GENERATION_EXPRESSION``
and ``identity.*`` keys) into Delta's, and analysing an expression against the table's
columns the way Spark's ``GeneratedColumn`` does for SQL statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.table import _generated
from deltaflow.table.errors import GeneratedColumnError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructField

# Spark's names for the same things (CatalogV2Util puts a V2 column's generation
# expression and identity spec into its StructField's metadata under these keys).
SPARK_GENERATION_EXPRESSION = "GENERATION_EXPRESSION"
_SPARK_IDENTITY = {
    "identity.start": _generated.IDENTITY_START,
    "identity.step": _generated.IDENTITY_STEP,
    "identity.allowExplicitInsert": _generated.IDENTITY_ALLOW_EXPLICIT_INSERT,
}


@dataclass(frozen=True)
class IdentityGenerator:
    """An identity column's sequence: ``start`` and ``step`` (delta-spark's
    ``IdentityGenerator``); pass it as ``generatedAlwaysAs`` or ``generatedByDefaultAs``."""

    start: int = 1
    step: int = 1

    def __post_init__(self) -> None:
        for name in ("start", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"IdentityGenerator {name} must be an int, got {value!r}.")
        if self.step == 0:
            raise ValueError(
                "IdentityGenerator step must be a non-zero int (negative counts down)."
            )


def column_metadata(
    column: str, generated_always_as: Any = None, generated_by_default_as: Any = None
) -> dict[str, Any]:
    """The Delta field metadata ``addColumn``'s generation arguments declare."""
    if generated_always_as is not None and generated_by_default_as is not None:
        raise ValueError(
            f"Column '{column}': give generatedAlwaysAs or generatedByDefaultAs, not both."
        )
    if generated_by_default_as is not None:
        if not isinstance(generated_by_default_as, IdentityGenerator):
            raise TypeError(
                f"Column '{column}': generatedByDefaultAs takes an IdentityGenerator(start,"
                f" step), got {type(generated_by_default_as).__name__}."
            )
        gen = generated_by_default_as
        return _generated.identity_metadata(gen.start, gen.step, always=False)
    if generated_always_as is None:
        return {}
    if isinstance(generated_always_as, IdentityGenerator):
        gen = generated_always_as
        return _generated.identity_metadata(gen.start, gen.step, always=True)
    if not isinstance(generated_always_as, str):
        raise TypeError(
            f"Column '{column}': generatedAlwaysAs takes a SQL expression string or an"
            f" IdentityGenerator(start, step), got {type(generated_always_as).__name__}."
        )
    return {_generated.GENERATION_EXPRESSION: generated_always_as}


class DeltaColumnBuilder:
    """delta-spark's ``DeltaColumnBuilder``: ``DeltaTable.columnBuilder(spark, name)
    .dataType(...).generatedAlwaysAs(...).nullable(...).comment(...).build()`` gives a
    ``StructField`` for ``addColumn(s)``."""

    def __init__(self, sparkSession: SparkSession | None, colName: str) -> None:
        self._spark = sparkSession
        self._name = colName
        self._data_type: str | DataType | None = None
        self._nullable = True
        self._always: Any = None
        self._by_default: IdentityGenerator | None = None
        self._comment: str | None = None

    def dataType(self, dataType: str | DataType) -> DeltaColumnBuilder:
        self._data_type = dataType
        return self

    def nullable(self, nullable: bool) -> DeltaColumnBuilder:
        self._nullable = bool(nullable)
        return self

    def generatedAlwaysAs(self, expression: str) -> DeltaColumnBuilder:
        self._always = expression
        return self

    def generatedAlwaysAsIdentity(self, start: int = 1, step: int = 1) -> DeltaColumnBuilder:
        self._always = IdentityGenerator(start, step)
        return self

    def generatedByDefaultAsIdentity(self, start: int = 1, step: int = 1) -> DeltaColumnBuilder:
        self._by_default = IdentityGenerator(start, step)
        return self

    def comment(self, comment: str) -> DeltaColumnBuilder:
        self._comment = comment
        return self

    def build(self) -> StructField:
        from pyspark.sql.types import StructField

        from deltaflow.spark.catalog._builder_args import data_type

        if self._data_type is None:
            raise ValueError(f"Column '{self._name}': call dataType(...) before build().")
        metadata = column_metadata(self._name, self._always, self._by_default)
        if self._comment is not None:
            metadata["comment"] = self._comment
        return StructField(
            self._name, data_type(self._data_type, self._name), self._nullable, metadata
        )


def delta_field_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A field's metadata with Spark's generation / identity keys as Delta's (the SQL
    ``CREATE TABLE`` path); Delta's own keys and everything else kept as given."""
    out = {k: v for k, v in metadata.items() if k not in _SPARK_IDENTITY}
    out.pop(SPARK_GENERATION_EXPRESSION, None)
    if SPARK_GENERATION_EXPRESSION in metadata:
        out[_generated.GENERATION_EXPRESSION] = str(metadata[SPARK_GENERATION_EXPRESSION])
    if "identity.start" in metadata:
        for spark_key, delta_key in _SPARK_IDENTITY.items():
            if spark_key in metadata:
                value = metadata[spark_key]
                out[delta_key] = (
                    value if isinstance(value, bool) or delta_key.endswith("Insert") else int(value)
                )
        allow = out.get(_generated.IDENTITY_ALLOW_EXPLICIT_INSERT, False)
        out[_generated.IDENTITY_ALLOW_EXPLICIT_INSERT] = (
            allow if isinstance(allow, bool) else str(allow).lower() == "true"
        )
    return out


def check_expressions(spark: SparkSession, fields: Sequence[StructField], table_uri: str) -> None:
    """Each generation expression of ``fields`` analysed by Spark against the table's
    other plain columns, as Spark checks SQL's ``GENERATED ALWAYS AS``: it resolves,
    refers to no generated column (nor itself), is deterministic, and its type up-casts
    to the column's. A :class:`GeneratedColumnError` says which rule failed."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.types import StructType

    generated = [f for f in fields if _generated.GENERATION_EXPRESSION in (f.metadata or {})]
    if not generated:
        return
    plain = [
        f
        for f in fields
        if _generated.GENERATION_EXPRESSION not in (f.metadata or {})
        and _generated.IDENTITY_START not in (f.metadata or {})
    ]
    relation = spark.createDataFrame([], StructType(plain))
    others = {f.name.lower() for f in fields if f not in plain}
    for f in generated:
        expression = str(f.metadata[_generated.GENERATION_EXPRESSION])
        try:
            projected = relation.selectExpr(f"({expression}) AS `__generated`")
            result_type = projected.schema[0].dataType
        except AnalysisException as exc:
            named = [o for o in others if _generated.mentions(expression, o)]
            reason = "referencesGenerated" if named else "invalidExpression"
            detail = (
                f"it refers to generated or identity column '{named[0]}'; a generation"
                " expression may refer only to the table's plain columns"
                if named
                else f"Spark cannot analyse it against the table's columns: {_first_line(exc)}"
            )
            raise _invalid(table_uri, f.name, expression, reason, detail) from None
        analyzed = _analyzed_expression(projected)
        if analyzed is not None and not analyzed.deterministic():
            raise _invalid(
                table_uri, f.name, expression, "nonDeterministic", "it is not deterministic"
            )
        if not _can_up_cast(spark, result_type, f.dataType):
            raise _invalid(
                table_uri,
                f.name,
                expression,
                "typeMismatch",
                f"its type {result_type.simpleString()} does not fit the column's type"
                f" {f.dataType.simpleString()} without loss",
            )


def _analyzed_expression(projected: Any) -> Any:
    try:
        return projected._jdf.queryExecution().analyzed().expressions().head()
    except Exception:  # Spark Connect: no JVM plan to ask; the SQL path checks there
        return None


def _can_up_cast(spark: SparkSession, source: DataType, target: DataType) -> bool:
    if source == target:
        return True
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        parse = jvm.org.apache.spark.sql.types.DataType.fromJson
        cast = jvm.org.apache.spark.sql.catalyst.expressions.Cast
        return bool(cast.canUpCast(parse(source.json()), parse(target.json())))
    except Exception:  # no JVM at hand (Spark Connect): accept, writes cast and check
        return True


def _invalid(
    table_uri: str, column: str, expression: str, reason: str, detail: str
) -> GeneratedColumnError:
    return GeneratedColumnError(
        f"Generated column '{column}' of {table_uri} cannot use GENERATED ALWAYS AS"
        f" ({expression}): {detail}. Fix the expression.",
        table_uri=table_uri,
        column=column,
        reason=reason,
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
