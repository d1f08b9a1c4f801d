"""Expectations applied to the rows a flow writes: counted, kept, dropped or failed.

All of a flow's expectations are evaluated on the same input rows (one aggregate: the
rows, and per expectation the rows that broke it), as Lakeflow counts them: a row
breaking a ``drop`` rule is dropped after every rule counted it. A constraint that is
NULL for a row counts as broken. A ``fail`` rule that any row breaks fails the flow
before anything is written, with one offending row in the error.

Without ``fail`` rules the aggregate rides along the write (:func:`observe`: Spark's
observed metrics, no job of its own); with one, the rows are counted first
(:func:`apply`, a job over the persisted input) so nothing is written when they fail.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

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


def _flag_sql(expectation: Expectation) -> str:
    # The constraint on lines of its own: a trailing `-- comment` ends with its line.
    return f"coalesce(CAST((\n{expectation.constraint}\n) AS BOOLEAN), false)"


def _flag(expectation: Expectation) -> Column:
    """True where the row keeps the rule (NULL counts as broken). Built from SQL text: one
    call to Spark where each ``functions`` call is one or more py4j round trips."""
    from pyspark.sql import functions as F

    return F.expr(_flag_sql(expectation))


def check_constraints(df: DataFrame, expectations: tuple[Expectation, ...], flow: str) -> None:
    """Analyse every constraint against ``df``'s columns (no job runs): a typo is a
    dry-run error, not a failed update."""
    from pyspark.errors import AnalysisException, ParseException

    for expectation in expectations:
        try:
            _parse(df, expectation.constraint)  # alone: it cannot reach out of its SQL
            df.select(_flag(expectation)).schema  # noqa: B018 - analysis only
        except (AnalysisException, ParseException) as exc:
            raise GraphValidationError(
                f"expectation {expectation.name!r} of flow {flow!r} does not analyse:"
                f" {expectation.constraint!r}: {str(exc).splitlines()[0]}. Fix the"
                " constraint (SQL over the flow's output columns).",
                flow=flow,
                problem="bad_expectation",
            ) from None


def _parse(df: DataFrame, constraint: str) -> None:
    """Parse ``constraint`` as one SQL expression (Spark parses ``expr`` text lazily)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # Spark Connect: analysed alone instead
        df.selectExpr(constraint).schema  # noqa: B018
        return
    jdf.sparkSession().sessionState().sqlParser().parseExpression(constraint)


def counting(
    expectations: tuple[Expectation, ...],
) -> tuple[list[Column], Column | None, list[Column]]:
    """The rules' flags, the keep condition (None: no ``drop`` rule) and the aggregate
    that counts rows, kept rows and each rule's failures."""
    from pyspark.sql import functions as F

    # As SQL text: a few calls to Spark instead of about a hundred py4j round trips (tens
    # of ms per flow). Each constraint parses alone (check_constraints): it cannot reach
    # out of its parentheses.
    flag_sql = [_flag_sql(e) for e in expectations]
    drop_sql = [f for e, f in zip(expectations, flag_sql, strict=True) if e.action == "drop"]
    keep_sql = " AND ".join(drop_sql) if drop_sql else None
    aggregate = [
        F.expr("count(1) AS `rows`"),
        F.expr(f"sum(CASE WHEN {keep_sql or 'true'} THEN 1 ELSE 0 END) AS `kept`"),
        *[
            F.expr(f"sum(CASE WHEN {flag} THEN 0 ELSE 1 END) AS `failed_{i}`")
            for i, flag in enumerate(flag_sql)
        ],
    ]
    return [F.expr(f) for f in flag_sql], F.expr(keep_sql) if keep_sql else None, aggregate


def counts_of(
    counted: Any, expectations: tuple[Expectation, ...], dataset: str
) -> tuple[int, int, tuple[ExpectationCounts, ...]]:
    rows = int(counted["rows"] or 0)
    failed = [int(counted[f"failed_{i}"] or 0) for i in range(len(expectations))]
    counts = tuple(
        ExpectationCounts(e.name, dataset, rows - f, f)
        for e, f in zip(expectations, failed, strict=True)
    )
    return rows, int(counted["kept"] or 0), counts


def has_fail_rule(expectations: tuple[Expectation, ...]) -> bool:
    return any(e.action == "fail" for e in expectations)


@dataclass(frozen=True)
class Checked:
    """What :func:`apply` found: the rows to write, the counts, rows in and kept."""

    kept: DataFrame
    counts: tuple[ExpectationCounts, ...]
    rows: int
    kept_rows: int


class Observed:
    """Rows to write with the rules' counts taken as they are written (Spark's observed
    metrics: the write's own job counts them, no job of its own). Write :attr:`kept`
    once, then read :meth:`checked`. Only for rules without ``fail``: those must be
    counted before anything is written (:func:`apply`)."""

    def __init__(
        self, df: DataFrame, expectations: tuple[Expectation, ...], *, dataset: str
    ) -> None:
        from pyspark.sql import Observation

        assert not has_fail_rule(expectations), "fail rules are checked before the write"
        self._expectations = expectations
        self._dataset = dataset
        self._observation = Observation()
        _, keep, aggregate = counting(expectations)
        observed = df.observe(self._observation, *aggregate)
        self.kept = observed if keep is None else observed.filter(keep)

    def checked(self) -> Checked:
        """The counts, once :attr:`kept` was written. A write skipped as a replay (its app
        transaction already in the log) ran nothing and counted nothing: zeros then."""
        counted = _observed(self._observation)
        if counted is None:
            return Checked(
                self.kept,
                tuple(ExpectationCounts(e.name, self._dataset, 0, 0) for e in self._expectations),
                0,
                0,
            )
        rows, kept, counts = counts_of(counted, self._expectations, self._dataset)
        return Checked(self.kept, counts, rows, kept)


# Spark completes an observation as the query that ran it finishes (seen synchronous in
# 4.3); the grace covers a slower delivery without hanging on a write that never ran.
_OBSERVATION_GRACE_S = 2.0


def _observed(observation: Any) -> Mapping[str, Any] | None:
    """The observation's metrics, or None when the write it rode on did not run."""
    import time

    if not hasattr(observation, "_jo"):  # Spark Connect: the client has them, or not
        try:
            got = observation.get
        except Exception:  # NO_OBSERVE_BEFORE_GET: the write did not run
            return None
        return cast("Mapping[str, Any]", got) if got else None
    future = observation._jo.future()
    deadline = time.monotonic() + _OBSERVATION_GRACE_S
    while not future.isCompleted():
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
    return cast("Mapping[str, Any]", observation.get)


def apply(
    df: DataFrame, expectations: tuple[Expectation, ...], *, flow: str, dataset: str
) -> Checked:
    """The rows to write (``drop`` rules applied) and each expectation's counts, from one
    aggregate. Call on a persisted DataFrame: it is read again to be written."""
    flags, keep, aggregate = counting(expectations)
    rows, kept_rows, counts = counts_of(df.agg(*aggregate).collect()[0], expectations, dataset)
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
    kept = df if keep is None else df.filter(keep)
    return Checked(kept, counts, rows, kept_rows)
