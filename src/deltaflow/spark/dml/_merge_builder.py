"""Declaring a MERGE: delta-spark's ``DeltaMergeBuilder``, building a frozen :class:`MergeSpec`.

Nothing here touches Spark or the table; ``_merge.execute`` runs a spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from deltaflow.errors import InvalidOptionError
from deltaflow.spark import _arguments as args

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ClauseKind = Literal[
    "matchedUpdate", "matchedDelete", "notMatchedInsert", "notMatchedBySourceUpdate",
    "notMatchedBySourceDelete",
]  # fmt: skip
MATCHED_KINDS = ("matchedUpdate", "matchedDelete")
NOT_MATCHED_KINDS = ("notMatchedInsert",)
BY_SOURCE_KINDS = ("notMatchedBySourceUpdate", "notMatchedBySourceDelete")
DELETE_KINDS = ("matchedDelete", "notMatchedBySourceDelete")
_RESULT_SCHEMA = (
    "num_affected_rows long, num_updated_rows long, num_deleted_rows long, num_inserted_rows long"
)


@dataclass(frozen=True)
class MergeClause:
    """One ``whenX`` clause. ``assignments`` None means ``*All`` (by column name)."""

    kind: ClauseKind
    condition: str | Column | None = None
    assignments: tuple[tuple[str, str | Column], ...] | None = ()


@dataclass(frozen=True)
class MergeSpec:
    """A declared MERGE: what ``DeltaMergeBuilder`` builds and :func:`execute` runs."""

    uri: str
    target_alias: str | None
    source: DataFrame
    condition: str | Column
    clauses: tuple[MergeClause, ...] = ()
    schema_evolution: bool = False
    # On a Spark Connect session: the target's SQL name; the MERGE runs on the server.
    remote_table: str | None = None


class DeltaMergeBuilder:
    """delta-spark's ``DeltaMergeBuilder``: each ``when...`` call returns a new builder
    (the declaration, a frozen :class:`MergeSpec`); ``execute()`` runs it.

    Clauses apply in the order given; the first whose condition is true wins.
    """

    def __init__(self, spark: SparkSession, spec: MergeSpec) -> None:
        self._spark = spark
        self.spec = spec

    def _with(self, clause: MergeClause) -> DeltaMergeBuilder:
        clauses = (*self.spec.clauses, clause)
        return DeltaMergeBuilder(self._spark, dataclasses.replace(self.spec, clauses=clauses))

    def whenMatchedUpdate(
        self, condition: str | Column | None = None, set: Mapping[str, str | Column] | None = None
    ) -> DeltaMergeBuilder:
        pairs = _pairs(set, "'set' in whenMatchedUpdate")
        return self._with(MergeClause("matchedUpdate", _cond(condition), pairs))

    def whenMatchedUpdateAll(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        return self._with(MergeClause("matchedUpdate", _cond(condition), None))

    def whenMatchedDelete(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        return self._with(MergeClause("matchedDelete", _cond(condition)))

    def whenNotMatchedInsert(
        self,
        condition: str | Column | None = None,
        values: Mapping[str, str | Column] | None = None,
    ) -> DeltaMergeBuilder:
        pairs = _pairs(values, "'values' in whenNotMatchedInsert")
        return self._with(MergeClause("notMatchedInsert", _cond(condition), pairs))

    def whenNotMatchedInsertAll(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        return self._with(MergeClause("notMatchedInsert", _cond(condition), None))

    def whenNotMatchedBySourceUpdate(
        self, condition: str | Column | None = None, set: Mapping[str, str | Column] | None = None
    ) -> DeltaMergeBuilder:
        pairs = _pairs(set, "'set' in whenNotMatchedBySourceUpdate")
        return self._with(MergeClause("notMatchedBySourceUpdate", _cond(condition), pairs))

    def whenNotMatchedBySourceDelete(
        self, condition: str | Column | None = None
    ) -> DeltaMergeBuilder:
        return self._with(MergeClause("notMatchedBySourceDelete", _cond(condition)))

    def withSchemaEvolution(self) -> DeltaMergeBuilder:
        """Add source columns the table lacks (``*All`` clauses), as mergeSchema does."""
        spec = dataclasses.replace(self.spec, schema_evolution=True)
        return DeltaMergeBuilder(self._spark, spec)

    def execute(self) -> DataFrame:
        """Run the MERGE as Spark jobs and commit once (nothing when nothing changes).

        Returns delta-spark 4's one-row result: ``num_affected_rows``,
        ``num_updated_rows``, ``num_deleted_rows``, ``num_inserted_rows``.
        On a Spark Connect session the MERGE INTO statement runs on the server
        (:func:`deltaflow.spark.remote._table.merge`) and this is its result.
        """
        spec = self.spec
        if spec.remote_table is not None:
            from deltaflow.spark.remote import _table as _remote

            self._check()
            return _remote.merge(self._spark, spec.remote_table, spec.target_alias,
                                 spec.source, spec.condition, spec.clauses,
                                 spec.schema_evolution)  # fmt: skip
        return self._spark.createDataFrame([self.run()], _RESULT_SCHEMA)

    def run(self) -> tuple[int, int, int, int]:
        """Run the MERGE; delta-spark's counts: affected, updated, deleted, inserted rows.
        (``execute()`` returns them as a DataFrame; SQL's MERGE INTO as its result.)"""
        from deltaflow.spark.dml import _merge

        if self.spec.remote_table is not None:
            row = self.execute().first()
            assert row is not None
            return (int(row[0]), int(row[1]), int(row[2]), int(row[3]))
        self._check()
        m = _merge.execute(self._spark, self._with_session_evolution())
        updated = m.matched_updated + m.by_source_updated
        deleted = m.matched_deleted + m.by_source_deleted
        return (updated + deleted + m.inserted, updated, deleted, m.inserted)

    def _with_session_evolution(self) -> MergeSpec:
        """The spec, evolving the schema also when the session turns delta-spark's
        ``spark.databricks.delta.schema.autoMerge.enabled`` on (as delta-spark's MERGE does
        without WITH SCHEMA EVOLUTION)."""
        from deltaflow.spark._options import session_auto_merge

        if self.spec.schema_evolution or not session_auto_merge(self._spark.conf.get):
            return self.spec
        return dataclasses.replace(self.spec, schema_evolution=True)

    def _check(self) -> None:
        """delta-spark's checks of the declared clauses, before anything runs."""
        if not self.spec.clauses:
            raise InvalidOptionError(
                f"MERGE into {self.spec.uri} has no clauses: add whenMatchedUpdate(...),"
                " whenNotMatchedInsertAll() or another when...() before execute().",
                option="clauses",
            )
        groups = {
            "WHEN MATCHED": MATCHED_KINDS,
            "WHEN NOT MATCHED": NOT_MATCHED_KINDS,
            "WHEN NOT MATCHED BY SOURCE": BY_SOURCE_KINDS,
        }
        for label, kinds in groups.items():
            group = [c for c in self.spec.clauses if c.kind in kinds]
            if any(c.condition is None for c in group[:-1]):
                # delta-spark refuses these: every later clause of the group is unreachable.
                raise InvalidOptionError(
                    f"MERGE into {self.spec.uri}: only the last {label} clause may omit"
                    " its condition; add a condition to the earlier one or reorder them.",
                    option="condition",
                )


def _cond(condition: str | Column | None) -> str | Column | None:
    args.check_condition(condition)
    return condition


def _pairs(
    values: Mapping[str, str | Column] | None, argument: str
) -> tuple[tuple[str, str | Column], ...]:
    # delta-spark's checks first: None -> ValueError, not a dict (or bad keys/values) ->
    # TypeError; deltaflow also refuses an empty dict (a clause that assigns nothing).
    args.check_assignments(values, argument)
    assert values is not None
    if not values:
        raise InvalidOptionError(
            f"MERGE clause needs at least one column in {argument}; use the *All"
            " variant to assign every column by name.",
            option=argument.split("'")[1],
        )
    return tuple(values.items())
