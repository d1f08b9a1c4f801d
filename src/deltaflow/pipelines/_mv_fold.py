"""Grouped aggregates folded from the change rows alone, with no scan of the source.

A ``GROUP BY`` view whose aggregates are all decomposable — ``count(*)``, ``count(x)``,
and ``sum(x)`` / ``avg(x)`` over integer columns — changes by the changed rows' own
contributions: each insert or post-image adds its value to its group, each delete or
pre-image takes it away. To fold those deltas in exactly, the view keeps hidden helper
columns (the usual incremental view maintenance bookkeeping):

- ``__deltaflow_mv_rows``: the group's row count (0 means the group is gone);
- ``__deltaflow_mv_cnt_<i>`` / ``__deltaflow_mv_sum_<i>``: the non-NULL count and the
  exact (BIGINT) sum of the i-th aggregate's input, from which ``sum`` (NULL when the
  count is 0, as Spark's sum of only NULLs is) and ``avg`` (sum / count as DOUBLE, which
  is Spark's avg of integers) are derived.

A helper equal to one of the view's own columns is not stored twice
(:meth:`Folding.stored`): a ``count(*)`` column is the row count, a ``count(x)`` column
the non-NULL count, so a view of counts alone keeps no helper column.

A complete recompute writes the same columns (:func:`recompute`), so either technique
leaves the same table. Floating-point and decimal sums are not folded (a float sum's
value depends on the order of addition, so a fold could differ from a recompute in the
last bit); neither are min / max (a delete cannot be undone without the group's rows).
Those views keep the group recompute of :mod:`._incremental`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _mv_plan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

HELPER_PREFIX = "__deltaflow_mv_"
ROWS = HELPER_PREFIX + "rows"
_SIGN = HELPER_PREFIX + "sign"
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")


@dataclass(frozen=True)
class Fold:
    """One aggregate of the view: its output column, function and input (JVM)."""

    name: str
    function: str  # count_star | count | sum | avg
    child: Any = None

    @property
    def needs_sum(self) -> bool:
        return self.function in ("sum", "avg")


@dataclass(frozen=True)
class Folding:
    """How a decomposable view is folded: its keys (output names) with their grouping
    expressions, its aggregates, and the aggregate node whose input is re-planned."""

    keys: tuple[str, ...]
    groupings: tuple[Any, ...]
    folds: tuple[Fold, ...]
    aggregate: Any
    columns: tuple[str, ...]  # the view's columns, in order
    # helper -> the view column holding it, where one does (see :func:`_kept_in_view`)
    in_view: tuple[tuple[str, str], ...] = ()

    def helpers(self) -> list[str]:
        names = [ROWS]
        for i, fold in enumerate(self.folds):
            if fold.function != "count_star":
                names.append(cnt_name(i))
            if fold.needs_sum:
                names.append(sum_name(i))
        return names

    def stored(self, helper: str) -> str:
        """The table column holding ``helper``: a view column that gives it, else the
        helper column itself (:func:`_kept_in_view`)."""
        return dict(self.in_view).get(helper, helper)

    def extra_columns(self) -> list[str]:
        """The helper columns the table holds besides the view's own (none when the
        view's columns give every helper)."""
        return [h for h in self.helpers() if self.stored(h) == h]


def folding(shape: _mv_plan.QueryShape, columns: list[str]) -> Folding | None:
    """The view's folding, or None when an aggregate is not decomposable (or the
    GROUP BY has projections above it)."""
    aggregate = shape.aggregate
    if shape.technique != _mv_plan.GROUP_AGGREGATE or aggregate is None or not shape.top:
        return None
    groupings = _mv_plan._seq(aggregate.groupingExpressions())
    keys: list[str] = []
    folds: list[Fold] = []
    for e in _mv_plan._seq(aggregate.aggregateExpressions()):
        if any(
            e.semanticEquals(g) or (_mv_plan._alias(e) and e.child().semanticEquals(g))
            for g in groupings
        ):
            keys.append(str(e.name()))
            continue
        fold = _fold(e)
        if fold is None:
            return None
        folds.append(fold)
    if len(keys) != len(groupings) or not folds:
        return None
    return Folding(
        tuple(keys),
        tuple(groupings),
        tuple(folds),
        aggregate,
        tuple(columns),
        _kept_in_view(tuple(folds)),
    )


def _kept_in_view(folds: tuple[Fold, ...]) -> tuple[tuple[str, str], ...]:
    """Helpers a view column gives, so they are not stored twice: a ``count(*)`` column
    is the row count; a ``count(x)`` column is the non-NULL count of any aggregate of
    the same ``x``; a ``sum(x)`` column is the sum of ``x`` (NULL, when only NULLs were
    summed, read as 0: what the helper holds then). Readers then see no helper column
    for views such as ``count(*), count(x), sum(x), avg(x)``."""
    kept: dict[str, str] = {}
    for i, fold in enumerate(folds):
        if fold.function == "count_star":
            kept.setdefault(ROWS, fold.name)
            continue
        for other in folds:
            if other.child is None or not other.child.semanticEquals(fold.child):
                continue
            if other.function == "count":
                kept.setdefault(cnt_name(i), other.name)
            if other.function == "sum" and fold.needs_sum:
                kept.setdefault(sum_name(i), other.name)
    return tuple(kept.items())


def _fold(e: Any) -> Fold | None:
    if not _mv_plan._alias(e):
        return None
    inner = e.child()
    if str(inner.getClass().getSimpleName()) != "AggregateExpression":
        return None
    if inner.isDistinct() or inner.filter().isDefined():
        return None
    function = inner.aggregateFunction()
    kind = str(function.getClass().getSimpleName())
    children = _mv_plan._seq(function.children())
    name = str(e.name())
    if kind == "Count" and len(children) == 1:
        child = children[0]
        if str(child.getClass().getSimpleName()) == "Literal" and not child.nullable():
            return Fold(name, "count_star")
        return Fold(name, "count", child)
    if kind in ("Sum", "Average") and len(children) >= 1:
        child = children[0]
        if str(child.dataType().getClass().getSimpleName()).rstrip("$") not in _INTEGRAL:
            return None
        return Fold(name, "sum" if kind == "Sum" else "avg", child)
    return None


def cnt_name(i: int) -> str:
    return f"{HELPER_PREFIX}cnt_{i}"


def sum_name(i: int) -> str:
    return f"{HELPER_PREFIX}sum_{i}"


def _inputs(
    spark: SparkSession, shape: _mv_plan.QueryShape, folding: Folding, rows: DataFrame | None
) -> DataFrame:
    """The aggregate's input rows as columns ``__k<i>`` (grouping values) and ``__v<i>``
    (aggregate inputs): over the source, or over ``rows`` in its place."""
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    assert jvm is not None
    child = folding.aggregate.child()
    if rows is not None:
        child = _mv_plan.swap_relation(spark, shape, child, rows)
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    none = getattr(getattr(jvm.scala, "None$"), "MODULE$")

    def alias(expression: Any, name: str) -> Any:
        return expressions.Alias(
            expression,
            name,
            expressions.NamedExpression.newExprId(),
            _mv_plan._scala_seq(jvm, []),
            none,
            _mv_plan._scala_seq(jvm, []),
        )

    listed = [alias(g, f"__k{i}") for i, g in enumerate(folding.groupings)]
    listed += [alias(f.child, f"__v{i}") for i, f in enumerate(folding.folds) if f.child]
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    project = logical.Project(_mv_plan._scala_seq(jvm, listed), child)
    session = spark._jsparkSession
    frame = DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(session, project), spark)
    return frame.select(
        *[frame[f"__k{i}"].alias(k) for i, k in enumerate(folding.keys)],
        *[frame[f"__v{i}"] for i, f in enumerate(folding.folds) if f.child],
    )


def recompute(spark: SparkSession, shape: _mv_plan.QueryShape, folding: Folding) -> DataFrame:
    """The whole view over the source, with its helper columns."""
    from pyspark.sql import functions as F

    inputs = _inputs(spark, shape, folding, None)
    aggregates = [F.count(F.lit(1)).alias(ROWS)]
    for i, fold in enumerate(folding.folds):
        if fold.function != "count_star":
            aggregates.append(F.count(f"__v{i}").alias(cnt_name(i)))
        if fold.needs_sum:
            # 0, not NULL, for only NULLs: what the fold adds up (sum() derives NULL).
            total = F.sum(F.col(f"__v{i}").cast("bigint"))
            aggregates.append(F.coalesce(total, F.lit(0).cast("bigint")).alias(sum_name(i)))
    state = inputs.groupBy(*[F.col(f"`{k}`") for k in folding.keys]).agg(*aggregates)
    return state.select(*_view_columns(folding, lambda c: F.col(f"`{c}`")))


def deltas(
    spark: SparkSession, shape: _mv_plan.QueryShape, folding: Folding, changes: DataFrame
) -> DataFrame:
    """Per touched group, what the changes add to each helper column (negative for
    what they take away), from the change rows alone."""
    from pyspark.sql import functions as F

    kind = F.col("_change_type")
    plus = _inputs(spark, shape, folding, changes.where(kind.isin("insert", "update_postimage")))
    minus = _inputs(spark, shape, folding, changes.where(kind.isin("delete", "update_preimage")))
    signed = plus.withColumn(_SIGN, F.lit(1)).unionByName(minus.withColumn(_SIGN, F.lit(-1)))
    sign = F.col(_SIGN)
    aggregates = [F.sum(sign).cast("bigint").alias(ROWS)]
    for i, fold in enumerate(folding.folds):
        value = F.col(f"__v{i}")
        if fold.function != "count_star":
            counted = F.when(value.isNotNull(), sign).otherwise(F.lit(0))
            aggregates.append(F.sum(counted).cast("bigint").alias(cnt_name(i)))
        if fold.needs_sum:
            summed = F.coalesce(value.cast("bigint") * sign, F.lit(0).cast("bigint"))
            aggregates.append(F.sum(summed).alias(sum_name(i)))
    return signed.groupBy(*[F.col(f"`{k}`") for k in folding.keys]).agg(*aggregates)


def merge(spark: SparkSession, target: str, folding: Folding, changes: DataFrame) -> None:
    """Fold ``changes`` (from :func:`deltas`) into the view in one MERGE: matched groups
    updated (deleted when their row count reaches 0), new groups inserted."""
    from deltaflow.tables import DeltaTable

    on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in folding.keys)
    helpers, extra = folding.helpers(), folding.extra_columns()
    summed = {h: f"(coalesce(t.`{folding.stored(h)}`, 0) + s.`{h}`)" for h in helpers}
    update = {f"`{h}`": summed[h] for h in extra}
    update.update(_derived(folding, summed))
    fresh = {h: f"s.`{h}`" for h in helpers}
    insert = {f"`{k}`": f"s.`{k}`" for k in folding.keys}
    insert.update({f"`{h}`": fresh[h] for h in extra})
    insert.update(_derived(folding, fresh))
    rows = folding.stored(ROWS)
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(changes.alias("s"), on)
        .whenMatchedDelete(condition=f"t.`{rows}` + s.`{ROWS}` = 0")
        .whenMatchedUpdate(set=update)
        .whenNotMatchedInsert(condition=f"s.`{ROWS}` > 0", values=insert)
        .run()
    )


def _derived(folding: Folding, helper: dict[str, str]) -> dict[str, str]:
    """The view's aggregate columns as SQL over the helper values ``helper``."""
    out: dict[str, str] = {}
    for i, fold in enumerate(folding.folds):
        out[f"`{fold.name}`"] = _aggregate_sql(fold, i, helper)
    return out


def _aggregate_sql(fold: Fold, i: int, helper: dict[str, str]) -> str:
    if fold.function == "count_star":
        return helper[ROWS]
    count = helper[cnt_name(i)]
    if fold.function == "count":
        return count
    total = helper[sum_name(i)]
    if fold.function == "sum":
        return f"CASE WHEN {count} > 0 THEN {total} END"
    return f"CASE WHEN {count} > 0 THEN CAST({total} AS DOUBLE) / CAST({count} AS DOUBLE) END"


def _view_columns(folding: Folding, column: Any) -> list[Column]:
    from pyspark.sql import functions as F

    helper = {h: f"`{h}`" for h in folding.helpers()}
    derived = {f.name: _aggregate_sql(f, i, helper) for i, f in enumerate(folding.folds)}
    types = {f.name: ("bigint" if f.function != "avg" else "double") for f in folding.folds}
    out = []
    for name in folding.columns:
        if name in derived:
            out.append(F.expr(derived[name]).cast(types[name]).alias(name))
        else:
            out.append(column(name))
    return out + [column(h) for h in folding.extra_columns()]


def rewrite(spark: SparkSession, target: str, folding: Folding, changes: DataFrame) -> None:
    """Fold ``changes`` (from :func:`deltas`) into a small view by rewriting it whole, in
    one overwrite: cheaper than a MERGE's fixed cost while the view is small."""
    from pyspark.sql import functions as F

    view = spark.read.format("delta").load(target)
    on = None
    for k in folding.keys:
        term = F.col(f"t.`{k}`").eqNullSafe(F.col(f"s.`{k}`"))
        on = term if on is None else on & term
    joined = view.alias("t").join(changes.alias("s"), on, "full_outer")
    in_view = F.col(f"t.`{folding.stored(ROWS)}`").isNotNull()
    zero = F.lit(0).cast("bigint")
    columns = [
        F.when(in_view, F.col(f"t.`{k}`")).otherwise(F.col(f"s.`{k}`")).alias(k)
        for k in folding.keys
    ]
    columns += [
        (
            F.coalesce(F.col(f"t.`{folding.stored(h)}`"), zero)
            + F.coalesce(F.col(f"s.`{h}`"), zero)
        ).alias(h)
        for h in folding.helpers()
    ]
    state = joined.select(*columns).where(F.col(f"`{ROWS}`") > 0)
    new = state.select(*_view_columns(folding, lambda c: F.col(f"`{c}`")))
    # Materialized before the overwrite: the new view is read from the old one.
    new = new.select(*view.columns).localCheckpoint()
    new.write.format("delta").mode("overwrite").save(target)
