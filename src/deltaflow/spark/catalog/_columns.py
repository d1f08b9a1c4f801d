"""Column declarations for the table builder: ``IdentityGenerator`` and ``DeltaColumnBuilder``.

``IdentityGenerator`` is delta-spark's dataclass (``delta.tables.IdentityGenerator``),
passed as ``DeltaTableBuilder.addColumn(generatedAlwaysAs=...)`` or
``generatedByDefaultAs=...``. ``DeltaColumnBuilder`` is the column builder of
delta-spark's Scala API (``DeltaTable.columnBuilder(spark, name)``; its Python API has
none): it only records a column's declaration, and :meth:`DeltaColumnBuilder.addTo` hands
it to ``DeltaTableBuilder.addColumn``, which decides what is supported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

    from deltaflow.spark.catalog._create import DeltaTableBuilder


@dataclass
class IdentityGenerator:
    """An identity column's values: ``start``, then every ``step`` (delta-spark's)."""

    start: int = 1
    step: int = 1


@dataclass(frozen=True)
class ColumnDeclaration:
    """What a :class:`DeltaColumnBuilder` recorded: ``addColumn``'s arguments."""

    colName: str
    dataType: str | DataType | None = None
    nullable: bool = True
    generatedAlwaysAs: str | IdentityGenerator | None = None
    generatedByDefaultAs: IdentityGenerator | None = None
    comment: str | None = None


class DeltaColumnBuilder:
    """delta-spark's (Scala) ``DeltaColumnBuilder``: each call returns a new builder."""

    def __init__(self, colName: str) -> None:
        from deltaflow.spark import _arguments

        _arguments.check_builder_str(colName, "Column name must be str.")
        self._declared = ColumnDeclaration(colName)

    def _with(self, **changes: Any) -> DeltaColumnBuilder:
        builder = DeltaColumnBuilder(self._declared.colName)
        builder._declared = dataclasses.replace(self._declared, **changes)
        return builder

    def dataType(self, dataType: str | DataType) -> DeltaColumnBuilder:
        return self._with(dataType=dataType)

    def nullable(self, nullable: bool) -> DeltaColumnBuilder:
        return self._with(nullable=nullable)

    def comment(self, comment: str) -> DeltaColumnBuilder:
        return self._with(comment=comment)

    def generatedAlwaysAs(self, expr: str) -> DeltaColumnBuilder:
        return self._with(generatedAlwaysAs=expr)

    def generatedAlwaysAsIdentity(self, start: int = 1, step: int = 1) -> DeltaColumnBuilder:
        return self._with(generatedAlwaysAs=IdentityGenerator(start, step))

    def generatedByDefaultAsIdentity(self, start: int = 1, step: int = 1) -> DeltaColumnBuilder:
        return self._with(generatedByDefaultAs=IdentityGenerator(start, step))

    def build(self) -> ColumnDeclaration:
        """The declaration (``addColumn``'s arguments); needs :meth:`dataType`."""
        if self._declared.dataType is None:
            raise ValueError(
                f"Column '{self._declared.colName}' has no data type: call"
                " .dataType('INT') (or a pyspark DataType) before build()."
            )
        return self._declared

    def addTo(self, table: DeltaTableBuilder) -> DeltaTableBuilder:
        """``table`` with this column added (``table.addColumn(**declaration)``)."""
        declared = self.build()
        assert declared.dataType is not None
        return table.addColumn(
            declared.colName,
            declared.dataType,
            nullable=declared.nullable,
            generatedAlwaysAs=declared.generatedAlwaysAs,  # type: ignore[arg-type]
            generatedByDefaultAs=declared.generatedByDefaultAs,
            comment=declared.comment,
        )
