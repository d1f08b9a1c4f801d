"""``delta.tables`` is ``deltaflow.tables``."""

from deltaflow.tables import (
    DeltaColumnBuilder,
    DeltaMergeBuilder,
    DeltaOptimizeBuilder,
    DeltaTable,
    DeltaTableBuilder,
    IdentityGenerator,
)

__all__ = [
    "DeltaColumnBuilder",
    "DeltaMergeBuilder",
    "DeltaOptimizeBuilder",
    "DeltaTable",
    "DeltaTableBuilder",
    "IdentityGenerator",
]
