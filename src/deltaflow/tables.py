"""delta-spark's ``delta.tables`` for deltaflow: change ``from delta.tables import ...`` to
``from deltaflow.tables import ...``.

``DeltaTable``, ``DeltaMergeBuilder``, ``DeltaTableBuilder``, ``DeltaOptimizeBuilder`` and
``IdentityGenerator`` have delta-spark's names, signatures and argument checks;
``DeltaColumnBuilder`` is the column builder of delta-spark's Scala API. Differences
from delta-spark are listed in ``docs/python-api.md``. Importing this module imports
pyspark (as ``delta.tables`` does); ``import deltaflow`` alone does not.
"""

from deltaflow.spark.catalog._columns import DeltaColumnBuilder, IdentityGenerator
from deltaflow.spark.catalog._create import DeltaTableBuilder
from deltaflow.spark.dml._delta_table import DeltaOptimizeBuilder, DeltaTable
from deltaflow.spark.dml._merge_builder import DeltaMergeBuilder

__all__ = [
    "DeltaColumnBuilder",
    "DeltaMergeBuilder",
    "DeltaOptimizeBuilder",
    "DeltaTable",
    "DeltaTableBuilder",
    "IdentityGenerator",
]
