"""A materialized view's query, read from its analysed plan: can it refresh incrementally?

Two shapes can, over ONE Delta table read by the query (``spark.read.table(...)``,
``dlt.read(...)``, a path), with deterministic expressions and no subqueries:

- ``ROW_BASED``: projections and filters (``select``, ``where``, ``withColumn``). Each
  row of the view comes from one source row, so the view changes by the source's
  changed rows put through the same projections and filters.
- ``GROUP_AGGREGATE``: one ``GROUP BY`` on top (projections and filters below it,
  projections above it that pass the grouping columns through). A group's row depends
  only on the source rows with its key, so the groups a change touches are recomputed.

Anything else (joins, unions, windows, sorts, limits, DISTINCT, HAVING, a global
aggregate, several sources, non-Delta sources) is recomputed in full; the
:class:`Issue` says why, with Lakeflow's issue names where Lakeflow documents one.

:func:`substitute` re-runs the query's operators over other rows (the source's change
feed) by swapping the source relation in the analysed plan for those rows, keeping the
relation's attribute ids, so every expression above resolves unchanged.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROW_BASED = "ROW_BASED"
GROUP_AGGREGATE = "GROUP_AGGREGATE"

_PASS_THROUGH = ("Project", "Filter", "SubqueryAlias")
_DELTA_TABLE = "io.deltaflow.spark.DeltaTable"


@dataclass(frozen=True)
class Issue:
    """Why a view cannot refresh incrementally (Lakeflow's ``incrementalization_issues``)."""

    issue_type: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "issue_type": self.issue_type,
            "prevent_incrementalization": True,
            "message": self.message,
        }


@dataclass(frozen=True)
class Source:
    """The one Delta table the query reads, at the version the query is pinned to."""

    name: str
    uri: str
    version: int


@dataclass(frozen=True)
class QueryShape:
    """What :func:`analyse` found. ``technique`` is None when ``issue`` says why.

    ``keys``: the view's columns that identify what a change replaces (the grouping
    columns of a GROUP_AGGREGATE view; every column of a ROW_BASED one).
    ``fingerprint``: the query's definition (its plan with attribute ids left out and
    the source's location), so a changed definition is noticed.
    """

    technique: str | None
    issue: Issue | None
    source: Source | None = None
    keys: tuple[str, ...] = ()
    fingerprint: str = ""
    relation: Any = None  # the JVM source relation node that substitute() replaces
    plan: Any = None  # the analysed JVM plan
    aggregate: Any = None  # the GROUP BY node (GROUP_AGGREGATE)
    top: bool = False  # the GROUP BY is the query's top node (no projection above it)


def analyse(df: DataFrame) -> QueryShape:
    """The shape of ``df``'s query (see the module docstring)."""
    if type(df).__module__.startswith("pyspark.sql.connect."):
        return QueryShape(
            None,
            Issue(
                "SPARK_CONNECT",
                "the update runs through a Spark Connect server, where the query's plan"
                " cannot be taken apart; the view is recomputed in full",
            ),
        )
    plan = df._jdf.queryExecution().analyzed()
    above: list[Any] = []  # nodes from the top down to the relation
    aggregate: Any = None
    projections_above = 0  # of the aggregate
    node = plan
    while node.children().size() == 1:
        kind = str(node.getClass().getSimpleName())
        if kind == "Aggregate":
            if aggregate is not None:
                return _refuse("OPERATOR_NOT_INCREMENTALIZABLE", "more than one GROUP BY")
            if any(str(n.getClass().getSimpleName()) != "Project" for n in above):
                return _refuse(
                    "AGGREGATE_NOT_TOP_NODE",
                    "a filter (HAVING) or another operator above the GROUP BY",
                )
            aggregate = node
            projections_above = len(above)
        elif kind not in _PASS_THROUGH:
            return _refuse("OPERATOR_NOT_INCREMENTALIZABLE", f"the operator {kind}")
        issue = _expression_issue(node)
        if issue is not None:
            return QueryShape(None, issue)
        above.append(node)
        node = node.children().apply(0)
    kind = str(node.getClass().getSimpleName())
    if node.children().size() > 1:
        return _refuse("OPERATOR_NOT_INCREMENTALIZABLE", f"the operator {kind} (several inputs)")
    source = _delta_source(node)
    if isinstance(source, Issue):
        return QueryShape(None, source)
    if aggregate is None:
        issue = _row_key_issue(df)
        if issue is not None:
            return QueryShape(None, issue)
        keys = tuple(df.columns)
        technique = ROW_BASED
    else:
        found = _group_keys(above[:projections_above], aggregate)
        if isinstance(found, Issue):
            return QueryShape(None, found)
        keys = found
        technique = GROUP_AGGREGATE
    return QueryShape(
        technique,
        None,
        source,
        keys,
        _fingerprint(plan, source, df),
        node,
        plan,
        aggregate,
        aggregate is not None and projections_above == 0,
    )


def substitute(spark: SparkSession, shape: QueryShape, rows: DataFrame) -> DataFrame:
    """The view's query over ``rows`` instead of its source table: ``rows`` has the
    source's columns (by name, extra columns ignored)."""
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    assert jvm is not None
    rebuilt = swap_relation(spark, shape, shape.plan, rows)
    session = rows._jdf.sparkSession()
    return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(session, rebuilt), spark)


def swap_relation(spark: SparkSession, shape: QueryShape, plan: Any, rows: DataFrame) -> Any:
    """``plan`` (the query's plan or a part of it holding the source relation) with
    ``rows`` in the source relation's place."""
    jvm = spark._jvm
    assert jvm is not None and shape.relation is not None
    replacement = rows._jdf.queryExecution().analyzed()
    by_name = {a.name(): a for a in _seq(replacement.output())}
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    none = getattr(getattr(jvm.scala, "None$"), "MODULE$")
    aliases = [
        # The source's attribute ids and qualifiers, so the operators above resolve as is.
        expressions.Alias(
            by_name[a.name()], a.name(), a.exprId(), a.qualifier(), none, _scala_seq(jvm, [])
        )
        for a in _seq(shape.relation.output())
    ]
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    swapped = logical.Project(_scala_seq(jvm, aliases), replacement)
    return _rebuild(jvm, plan, shape.relation, swapped)


def _rebuild(jvm: Any, node: Any, old: Any, new: Any) -> Any:
    if node.equals(old):
        return new
    child = _rebuild(jvm, node.children().apply(0), old, new)
    return node.withNewChildren(_scala_seq(jvm, [child]))


def _refuse(issue_type: str, what: str) -> QueryShape:
    return QueryShape(
        None, Issue(issue_type, f"the query has {what}, which cannot refresh incrementally")
    )


def _expression_issue(node: Any) -> Issue | None:
    if node.subqueries().nonEmpty():
        return Issue(
            "SUBQUERY_EXPRESSION_NOT_INCREMENTALIZABLE",
            "the query has a subquery expression, which cannot refresh incrementally",
        )
    odd = [str(e.sql()) for e in _seq(node.expressions()) if not e.deterministic()]
    if odd:
        return Issue(
            "EXPRESSION_NOT_DETERMINISTIC",
            f"the expressions {', '.join(odd)} are not deterministic, so a recomputed part"
            " of the view could disagree with the rest",
        )
    return None


def _delta_source(node: Any) -> Source | Issue:
    kind = str(node.getClass().getSimpleName())
    table = node.table() if kind == "DataSourceV2Relation" else None
    if table is None or str(table.getClass().getName()) != _DELTA_TABLE:
        return Issue(
            "INPUT_NOT_IN_DELTA",
            f"the query reads {kind}, not a Delta table, so it has no change data feed",
        )
    info = table.info()
    if info.timeTravel():
        return Issue(
            "INPUT_TIME_TRAVEL", "the query reads a fixed version of its source (time travel)"
        )
    return Source(str(table.name()), str(info.uri()), int(info.version()))


def _row_key_issue(df: DataFrame) -> Issue | None:
    from pyspark.sql.types import MapType

    def has_map(kind: Any) -> bool:
        if isinstance(kind, MapType):
            return True
        children = getattr(kind, "fields", None) or []
        inner = [f.dataType for f in children] + [
            getattr(kind, "elementType", None),
        ]
        return any(has_map(k) for k in inner if k is not None)

    maps = [f.name for f in df.schema.fields if has_map(f.dataType)]
    if maps:
        return Issue(
            "OUTPUT_NOT_COMPARABLE",
            f"the view's columns {', '.join(maps)} hold maps, which cannot be compared to"
            " find the rows a change replaces",
        )
    return None


def _group_keys(projections: list[Any], aggregate: Any) -> tuple[str, ...] | Issue:
    """The view's columns holding the grouping expressions, followed through the
    projections above the aggregate."""
    named: dict[int, str] = {}  # exprId -> output name, at the aggregate's output
    for grouping in _seq(aggregate.groupingExpressions()):
        match = next(
            (
                e
                for e in _seq(aggregate.aggregateExpressions())
                if (_attribute(e) and e.semanticEquals(grouping))
                or (_alias(e) and e.child().semanticEquals(grouping))
            ),
            None,
        )
        if match is None:
            return _missing_key(grouping)
        named[int(match.exprId().id())] = str(match.name())
    if not named:
        return Issue(
            "OPERATOR_NOT_INCREMENTALIZABLE",
            "the query aggregates without GROUP BY (one row over the whole source), which"
            " is recomputed",
        )
    for project in reversed(projections):
        passed: dict[int, str] = {}
        for e in _seq(project.projectList()):
            inner = e.child() if _alias(e) else e
            if _attribute(inner) and int(inner.exprId().id()) in named:
                passed[int(e.exprId().id())] = str(e.name())
        if len(set(passed.values())) < len(set(named.values())):
            return _missing_key(None)
        named = passed
    return tuple(dict.fromkeys(named.values()))


def _missing_key(grouping: Any) -> Issue:
    what = "a grouping expression" if grouping is None else f"grouping expression {grouping.sql()}"
    return Issue(
        "GROUP_KEY_NOT_IN_OUTPUT",
        f"{what} is not a column of the view, so a group's row cannot be found in it",
    )


def _attribute(e: Any) -> bool:
    return str(e.getClass().getSimpleName()) == "AttributeReference"


def _alias(e: Any) -> bool:
    return str(e.getClass().getSimpleName()) == "Alias"


def _fingerprint(plan: Any, source: Source, df: DataFrame) -> str:
    # Attribute ids change with every analysis; the operators and names do not.
    text = re.sub(r"#\d+L?", "", str(plan.treeString()))
    digest = hashlib.sha256()
    for part in (text, source.uri, df.schema.json()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _seq(items: Any) -> list[Any]:
    return [items.apply(i) for i in range(items.size())]


def _scala_seq(jvm: Any, items: list[Any]) -> Any:
    values = jvm.java.util.ArrayList()
    for item in items:
        values.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(values).toSeq()
