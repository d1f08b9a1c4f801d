"""``DeltaTableBuilder.execute()`` on a Spark Connect session: the declared table as one
``CREATE [OR REPLACE] TABLE`` / ``REPLACE TABLE`` statement, run by the server's catalog
(which writes the log, as for the same SQL typed by hand)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltaflow.errors import InvalidOptionError
from deltaflow.spark.remote import _table
from deltaflow.spark.remote._sql_text import quote_identifier, string_literal, type_sql
from deltaflow.table import _generated
from deltaflow.table.errors import TableAlreadyExistsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaflow.spark.catalog._create import ColumnSpec, TableSpec

_HEADS = {
    "create": "CREATE TABLE",
    "createIfNotExists": "CREATE TABLE IF NOT EXISTS",
    "replace": "REPLACE TABLE",
    "createOrReplace": "CREATE OR REPLACE TABLE",
}
_CHAR_VARCHAR_KEY = "__CHAR_VARCHAR_TYPE_STRING"
# Field metadata a column definition in SQL expresses; any other key is refused.
_EXPRESSED = {
    "comment",
    _CHAR_VARCHAR_KEY,
    _generated.GENERATION_EXPRESSION,
    _generated.IDENTITY_START,
    _generated.IDENTITY_STEP,
    _generated.IDENTITY_ALLOW_EXPLICIT_INSERT,
}


def statement(spec: TableSpec) -> str:
    """The SQL that creates (or replaces) the table ``spec`` declares."""
    if not spec.name and not spec.location:
        raise InvalidOptionError(
            "DeltaTable.create needs .tableName(name) or .location(path) (or both).",
            option="location",
        )
    target = spec.name if spec.name else _table.path_name(str(spec.location))
    parts = [_HEADS[spec.mode], target]
    if spec.columns:
        parts.append("(" + ", ".join(_column(c, spec) for c in spec.columns) + ")")
    parts.append("USING delta")
    if spec.partition_columns:
        parts.append(f"PARTITIONED BY ({_names(spec.partition_columns)})")
    if spec.clustering_columns:
        parts.append(f"CLUSTER BY ({_names(spec.clustering_columns)})")
    if spec.name and spec.location:
        parts.append(f"LOCATION {string_literal(spec.location)}")
    if spec.comment is not None:
        parts.append(f"COMMENT {string_literal(spec.comment)}")
    if spec.properties:
        pairs = ", ".join(f"{string_literal(k)} = {string_literal(v)}" for k, v in spec.properties)
        parts.append(f"TBLPROPERTIES ({pairs})")
    return " ".join(parts)


def execute(spark: SparkSession, spec: TableSpec) -> tuple[str, str | None]:
    """Run ``spec``'s statement on the server; the table's location and catalog name."""
    try:
        _table.run_collect(spark, statement(spec))
    except Exception as exc:
        if _table.error_class(exc) not in ("TABLE_OR_VIEW_ALREADY_EXISTS", "TABLE_ALREADY_EXISTS"):
            raise
        # Spark's catalog refuses before deltaflow's sees the statement; the builder's
        # error is the classic path's.
        label = spec.name or str(spec.location)
        raise TableAlreadyExistsError(
            f"Table {label} already exists. Use DeltaTable.createIfNotExists to keep it,"
            " createOrReplace to replace it, or DeltaTable.forPath / forName to open it.",
            table_uri=label,
        ) from exc
    if spec.name:
        return _table.locate_name(spark, spec.name), spec.name
    return _table.locate_path(spark, str(spec.location)), None


def _names(columns: tuple[str, ...]) -> str:
    return ", ".join(quote_identifier(c) for c in columns)


def _column(column: ColumnSpec, spec: TableSpec) -> str:
    from pyspark.sql.types import _parse_datatype_json_value

    metadata = dict(column.metadata)
    unexpressed = sorted(set(metadata) - _EXPRESSED)
    if unexpressed:
        raise InvalidOptionError(
            f"Column '{column.name}' of {spec.name or spec.location} carries field metadata"
            f" {unexpressed} that CREATE TABLE cannot express, and on a Spark Connect session"
            " the builder runs as SQL on the server. Remove it from the StructField, or set"
            " it with ALTER TABLE after creating the table.",
            option="addColumn",
        )
    if _CHAR_VARCHAR_KEY in metadata:
        type_text = str(metadata[_CHAR_VARCHAR_KEY]).upper()
    else:
        type_text = type_sql(_parse_datatype_json_value(column.type_json))
    text = f"{quote_identifier(column.name)} {type_text}"
    if not column.nullable:
        text += " NOT NULL"
    if _generated.GENERATION_EXPRESSION in metadata:
        text += f" GENERATED ALWAYS AS ({metadata[_generated.GENERATION_EXPRESSION]})"
    if _generated.IDENTITY_START in metadata:
        always = not metadata.get(_generated.IDENTITY_ALLOW_EXPLICIT_INSERT, False)
        text += (
            f" GENERATED {'ALWAYS' if always else 'BY DEFAULT'} AS IDENTITY"
            f" (START WITH {int(metadata[_generated.IDENTITY_START])}"
            f" INCREMENT BY {int(metadata.get(_generated.IDENTITY_STEP, 1))})"
        )
    if "comment" in metadata:
        text += f" COMMENT {string_literal(str(metadata['comment']))}"
    return text
