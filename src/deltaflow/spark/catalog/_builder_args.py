"""The builder's argument conversions: a column type from DDL text or a pyspark type
(refusals that are also delta-spark's pyspark exceptions), and the view of delta-spark's
Scala builder (``DeltaTableBuilder._jbuilder``). Used by :mod:`._create`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

    from deltaflow.spark.catalog._create import DeltaTableBuilder
    from deltaflow.spark.dml._delta_table import DeltaTable


def data_type(data_type: str | DataType, column: str) -> DataType:
    from pyspark.errors import PySparkException
    from pyspark.sql.types import DataType

    from deltaflow.errors import InvalidOptionError

    if isinstance(data_type, DataType):
        return data_type
    if not isinstance(data_type, str):
        raise InvalidOptionError(
            f"Column '{column}': dataType must be a DDL string or a pyspark DataType, got"
            f" {type(data_type).__name__}.",
            option="dataType",
        )
    try:
        return DataType.fromDDL(data_type)
    except PySparkException as exc:
        from deltaflow.spark._pyspark_errors import DataTypeParseError

        # A ParseException too, as delta-spark's builder raises.
        raise DataTypeParseError(
            f"Column '{column}': {data_type!r} is not a Spark SQL data type ({exc}). Use DDL"
            " such as 'INT', 'DECIMAL(10,2)', 'ARRAY<STRING>', 'STRUCT<a: INT, b: STRING>'.",
            option="dataType",
        ) from None


def check_identity_type(column: str, data_type: DataType, label: str) -> None:
    """An identity column is BIGINT; delta-spark's builder refuses others as it is called,
    with an ``UnsupportedOperationException`` (so does this one: it is also one)."""
    from pyspark.sql.types import LongType

    if isinstance(data_type, LongType):
        return
    from deltaflow.spark._pyspark_errors import UnsupportedColumnError

    raise UnsupportedColumnError(
        f"Identity column '{column}' of {label} is of type {data_type.simpleString()};"
        " Delta identity columns are BIGINT. Declare it as 'BIGINT' (LongType()).",
        table_uri=label,
        column=column,
        reason="identityType",
        error_class="DELTA_IDENTITY_COLUMNS_UNSUPPORTED_DATA_TYPE",
    )


class ScalaBuilderView:
    """The Scala ``DeltaTableBuilder`` methods delta-spark's Python builder forwards to,
    taking what py4j hands them (Scala ``Seq`` of column names)."""

    def __init__(self, builder: DeltaTableBuilder) -> None:
        self.builder = builder

    def partitionedBy(self, *cols: Any) -> ScalaBuilderView:
        self.builder.partitionedBy(*py_names(cols))
        return self

    def clusterBy(self, *cols: Any) -> ScalaBuilderView:
        self.builder.clusterBy(*py_names(cols))
        return self

    def execute(self) -> DeltaTable:
        return self.builder.execute()


def py_names(cols: tuple[Any, ...]) -> list[str]:
    """Column names from strings or Scala ``Seq[String]`` (py4j objects)."""
    names: list[str] = []
    for group in cols:
        if isinstance(group, str):
            names.append(group)
        elif hasattr(group, "mkString"):  # a Scala Seq, element by element
            names.extend(str(group.apply(i)) for i in range(group.size()))
        else:
            names.extend(group)
    return names
