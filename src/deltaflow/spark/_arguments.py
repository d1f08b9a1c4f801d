"""delta-spark's argument checks for the Python API (``DeltaTable`` and its builders).

delta-spark's ``delta/tables.py`` raises ``TypeError`` / ``ValueError`` for arguments of
the wrong type before anything runs; code written against it may catch those, so the
same calls raise the same types here, with messages that also say what to pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn


def check_condition(condition: Any, argname: str = "'condition'") -> None:
    """A condition is None, a SQL string or a Column (TypeError otherwise)."""
    from pyspark.sql import Column

    if condition is None or type(condition) is str or isinstance(condition, Column):
        return
    raise TypeError(
        f"{argname} must be a Spark SQL Column or a string (expression in SQL syntax),"
        f" found to be of type {type(condition)}"
    )


def check_assignments(assignments: Any, argname: str) -> None:
    """A ``set`` / ``values`` argument: a dict of column name -> SQL string or Column."""
    from pyspark.sql import Column

    if assignments is None:
        raise ValueError(
            f"{argname} cannot be None: pass a dict of column name -> SQL expression or Column,"
            ' e.g. set={"value": "s.value"}'
        )
    if type(assignments) is not dict:
        raise TypeError(f"{argname} must be a dict, found to be {type(assignments)}")
    for column, value in assignments.items():
        if type(column) is not str:
            raise TypeError(
                f"Keys of dict in {argname} must contain only strings with column names,"
                f" found '{column}' of type '{type(column)}'"
            )
        if type(value) is not str and not isinstance(value, Column):
            raise TypeError(
                f"Values of dict in {argname} must contain only Spark SQL Columns or strings"
                f" (expressions in SQL syntax) as values, found '{value}' of type"
                f" '{type(value)}'"
            )


def check_str(value: Any, name: str) -> None:
    if type(value) is not str:
        raise ValueError(f"{name} needs to be a string but got '{type(value)}'.")


def check_int(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} needs to be an int but got '{type(value)}'.")


def check_bool(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} needs to be a boolean but got '{type(value)}'.")


def check_type(value: Any, name: str, expected: str) -> None:
    """``value`` is a str (TypeError otherwise): forPath / forName identifiers."""
    if type(value) is not str:
        raise TypeError(f"{name} must be {expected}, found {value!r} of type {type(value)}.")


def raise_builder_type_error(message: str, values: Iterable[Any]) -> NoReturn:
    """delta-spark's ``DeltaTableBuilder`` TypeError: ``message`` and what was found."""
    found = "".join(f" Found {v} with type {type(v)}" for v in values)
    raise TypeError(message + found)


def check_builder_str(value: Any, message: str) -> None:
    if type(value) is not str:
        raise_builder_type_error(message, [value])


def column_names(cols: tuple[Any, ...], message: str) -> list[str]:
    """``*cols`` of partitionedBy / clusterBy / executeZOrderBy: names, or one list/tuple
    of names (TypeError for anything else)."""
    if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
        cols = tuple(cols[0])
    for c in cols:
        if type(c) is not str:
            raise_builder_type_error(message, [c])
    return list(cols)


def check_add_column(
    col_name: Any,
    data_type: Any,
    nullable: Any,
    generated_always_as: Any,
    generated_by_default_as: Any,
    comment: Any,
) -> None:
    """delta-spark's checks of ``DeltaTableBuilder.addColumn``'s arguments."""
    from pyspark.sql.types import DataType

    from deltaflow.spark.catalog._columns import IdentityGenerator

    check_builder_str(col_name, "Column name must be str.")
    if type(data_type) is not str and not isinstance(data_type, DataType):
        raise_builder_type_error("Column data type must be str or DataType.", [data_type])
    if type(nullable) is not bool:
        raise_builder_type_error("Column nullable must be bool.", [nullable])
    if generated_always_as is not None and generated_by_default_as is not None:
        raise ValueError(
            f"Column '{col_name}': generatedByDefaultAs and generatedAlwaysAs cannot both be"
            " set; keep one."
        )
    if generated_always_as is not None:
        if isinstance(generated_always_as, IdentityGenerator):
            check_identity(generated_always_as)
        elif type(generated_always_as) is not str:
            raise_builder_type_error(
                "Generated always as expression must be str or IdentityGenerator.",
                [generated_always_as],
            )
    if generated_by_default_as is not None:
        if not isinstance(generated_by_default_as, IdentityGenerator):
            raise_builder_type_error(
                "Generated by default expression must be IdentityGenerator.",
                [generated_by_default_as],
            )
        check_identity(generated_by_default_as)
    if comment is not None:
        check_builder_str(comment, "Column comment must be str.")


def check_identity(generator: Any) -> None:
    if generator.step == 0:
        raise ValueError("Column identity generation requires step to be non-zero.")


def check_add_columns(cols: Any) -> None:
    """``addColumns`` takes a StructType or a list of StructField (TypeError otherwise)."""
    from pyspark.sql.types import StructField, StructType

    if isinstance(cols, list):
        for col in cols:
            if type(col) is not StructField:
                raise_builder_type_error("Column in existing schema must be StructField.", [col])
    elif type(cols) is not StructType:
        raise_builder_type_error("Schema must be StructType or a list of StructField.", [cols])
