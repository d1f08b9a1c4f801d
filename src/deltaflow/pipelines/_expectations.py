"""Expectations applied to the rows a flow writes: counted, kept, dropped or failed.

All of a flow's expectations are evaluated on the same input rows in one Spark job
(one aggregate: the rows, and per expectation the rows that broke it), as Lakeflow
counts them: a row breaking a ``drop`` rule is dropped after every rule counted it. A
constraint that is NULL for a row counts as broken. A ``fail`` rule that any row
breaks fails the flow before anything is written, with one offending row in the error.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines._declarations import Expectation
from deltaflow.pipelines.errors import ExpectationViolationError, GraphValidationError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class ExpectationCounts:
    """One expectation's outcome over some rows (Lakeflow's event-log fields)."""

    name: str
    dataset: str
    passed_records: int
    failed_records: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dataset": self.dataset,
            "passed_records": self.passed_records,
            "failed_records": self.failed_records,
        }


def _flag(expectation: Expectation) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.expr(expectation.constraint).cast("boolean"), F.lit(False))


def check_constraints(df: DataFrame, expectations: tuple[Expectation, ...], flow: str) -> None:
    """Analyse every constraint against ``df``'s columns (no job runs): a typo is a
    dry-run error, not a failed update."""
    from pyspark.errors import AnalysisException, ParseException

    for expectation in expectations:
        try:
            df.select(_flag(expectation)).schema  # noqa: B018 - analysis only
        except (AnalysisException, ParseException) as exc:
            raise GraphValidationError(
                f"expectation {expectation.name!r} of flow {flow!r} does not analyse:"
                f" {expectation.constraint!r}: {str(exc).splitlines()[0]}. Fix the"
                " constraint (SQL over the flow's output columns).",
                flow=flow,
                problem="bad_expectation",
            ) from None


@dataclass(frozen=True)
class Checked:
    """What :func:`apply` found: the rows to write, the counts, rows in and kept."""

    kept: DataFrame
    counts: tuple[ExpectationCounts, ...]
    rows: int
    kept_rows: int


def apply(
    df: DataFrame, expectations: tuple[Expectation, ...], *, flow: str, dataset: str
) -> Checked:
    """The rows to write (``drop`` rules applied) and each expectation's counts, from one
    aggregate. Call on a persisted DataFrame: it is read again to be written."""
    from pyspark.sql import functions as F

    flags = [_flag(e) for e in expectations]
    drops = [flag for e, flag in zip(expectations, flags, strict=True) if e.action == "drop"]
    keep = functools.reduce(lambda a, b: a & b, drops) if drops else F.lit(True)
    counted = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(keep, 1).otherwise(0)).alias("kept"),
        *[F.sum(F.when(flag, 0).otherwise(1)).alias(f"failed_{i}") for i, flag in enumerate(flags)],
    ).collect()[0]
    rows = int(counted["rows"])
    failed = [int(counted[f"failed_{i}"] or 0) for i in range(len(flags))]
    counts = tuple(
        ExpectationCounts(e.name, dataset, rows - f, f)
        for e, f in zip(expectations, failed, strict=True)
    )
    for expectation, flag, count in zip(expectations, flags, counts, strict=True):
        if expectation.action == "fail" and count.failed_records:
            offending = df.filter(~flag).limit(1).collect()[0].asDict(recursive=True)
            record = json.dumps(offending, default=str, sort_keys=True)
            raise ExpectationViolationError(
                f"flow {flow!r} failed expectation {expectation.name!r}"
                f" ({expectation.constraint}) on {count.failed_records} of {rows} rows; one"
                f" of them: {record}. Nothing of this batch was written to {dataset!r}. Fix"
                " the input, or relax the rule to expect_or_drop / expect.",
                flow=flow,
                dataset=dataset,
                expectation=expectation.name,
                constraint=expectation.constraint,
                record=record,
                failed_records=count.failed_records,
            )
    kept = df.filter(keep) if drops else df
    return Checked(kept, counts, rows, int(counted["kept"] or 0))
