"""MERGE's target files pruned by the source's join-key values.

A conjunct ``t.k = s.c`` of the merge condition means that a target row matches only
when its ``k`` equals the ``c`` of some source row. So a file whose stats show that no
value of ``k`` in it equals any of the source's ``c`` values (min/max of ``k`` around
none of them; every ``k`` NULL; a partition value that is none of them) holds no
matched row. With no ``WHEN NOT MATCHED BY SOURCE`` clause (the caller checks: such
clauses change unmatched rows too) those files are left out of both jobs and of the
commit, exactly as if they had been read: their rows would all have been copied.

The source's values: a source of at most ``MAX_EXACT_ROWS`` rows has its key values
collected exactly (sorted distinct values per key), without a Spark job when Spark
computes it on the driver (a local relation: SQL ``VALUES``, ``createDataFrame`` of
pandas), else in one job; a larger source costs one more job, which summarizes it by its
row count and each key's min and max (a range; the files outside it cannot match).

Only equalities Spark evaluates as Python compares the values are used: both sides
integral or decimal numbers, both dates, or both strings of the default (binary)
collation and not ``CHAR(n)`` (padded on comparison). Floats (NaN equals NaN in Spark),
timestamps (stats kept at millisecond precision), other collations and null-safe
``<=>`` do not prune.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.spark.dml import _delete_update
from deltaflow.table import _predicates
from deltaflow.table._snapshot import FileEntry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

# A source of at most this many rows has its key values collected exactly; a larger one
# is summarized by each key's min and max.
MAX_EXACT_ROWS = 10_000
LIMIT_PARTITIONS_CONF = "spark.sql.limit.initialNumPartitions"


@dataclass(frozen=True)
class KeyColumn:
    """``target`` (a top-level target column) equals the source's ``source`` column."""

    target: str
    source: str  # as the condition names it, backquoted for F.col


@dataclass(frozen=True)
class KeyDomain:
    """The non-null source values a key takes: exactly (``values``, sorted) or a range."""

    low: Any  # None with high None: the source has no non-null value, nothing matches
    high: Any
    values: tuple[Any, ...] | None = None

    def may_hold(self, low: Any, high: Any) -> bool:
        """Whether a source value may lie in ``[low, high]`` (None: unbounded)."""
        if self.low is None and self.high is None:
            return False
        try:
            if (low is not None and self.high < low) or (high is not None and self.low > high):
                return False
            if self.values is None or low is None:
                return True
            at = bisect.bisect_left(self.values, low)
            return at < len(self.values) and (high is None or self.values[at] <= high)
        except TypeError:
            return True  # stats of another Python type than the values: cannot prune


@dataclass(frozen=True)
class SourceKeys:
    """What the source's key columns hold (target column -> domain), and its rows."""

    domains: Mapping[str, KeyDomain]
    rows: int
    exact: bool  # values known exactly (a local source)


def equality_keys(
    node: Any, target_alias: str, table: StructType, source: DataFrame
) -> list[KeyColumn]:
    """The conjuncts ``t.k = s.c`` of ``node`` whose sides compare like Python values."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    candidates: list[KeyColumn] = []
    for conjunct in conjuncts(node):
        pair = _target_and_source(conjunct, target_alias)
        if pair is not None:
            candidates.append(pair)
    if not candidates:
        return []
    fields = {f.name.lower(): f for f in table.fields}
    try:
        # One analysis for every key; a name that is not the source's: no key pruning.
        types = source.select(*[F.col(k.source) for k in candidates]).schema.fields
    except AnalysisException:
        return []
    keys = []
    for key, source_field in zip(candidates, types, strict=True):
        target_field = fields.get(key.target.lower())
        if target_field is None or _is_char(target_field.metadata):
            continue
        if _comparable(target_field.dataType, source_field.dataType):
            keys.append(dataclasses.replace(key, target=target_field.name))
    return keys


def collect(
    source: DataFrame, keys: Sequence[KeyColumn], *, materialized: DataFrame | None = None
) -> SourceKeys:
    """The source's key domains and row count: free for a local source, else one job
    (over ``materialized``, the source persisted with more columns, when given: the
    job then fills its cache, which the MERGE's own jobs read)."""
    from pyspark.sql import functions as F

    spark = source.sparkSession

    def keys_of(df: DataFrame) -> DataFrame:
        return df.select(*[F.col(k.source).alias(f"k{i}") for i, k in enumerate(keys)])

    selected = keys_of(source)
    if _is_local(selected):
        rows = selected.collect()  # a local relation: no Spark job
    else:
        if materialized is not None:
            selected = keys_of(materialized)
        # Spark's limit collects scan a few partitions per job and then more in
        # further jobs; all of them at once is one job.
        settings = {LIMIT_PARTITIONS_CONF: str(2**30)}
        with _delete_update.session_conf(spark, settings):
            rows = selected.limit(MAX_EXACT_ROWS + 1).collect()
    if len(rows) <= MAX_EXACT_ROWS:
        domains = {}
        for i, key in enumerate(keys):
            values = sorted({r[i] for r in rows if r[i] is not None})
            low, high = (values[0], values[-1]) if values else (None, None)
            domains[key.target] = KeyDomain(low, high, tuple(values))
        return SourceKeys(domains, len(rows), exact=True)
    summary = [F.count(F.lit(1))]
    for i in range(len(keys)):
        summary += [F.min(f"k{i}"), F.max(f"k{i}")]
    # A global aggregate gains nothing from adaptive execution, which would run its
    # two stages as two jobs.
    with _delete_update.session_conf(spark, {_delete_update.ADAPTIVE_CONF: "false"}):
        row = selected.agg(*summary).collect()[0]
    domains = {key.target: KeyDomain(row[1 + 2 * i], row[2 + 2 * i]) for i, key in enumerate(keys)}
    return SourceKeys(domains, int(row[0]), exact=False)


def file_may_match(
    entry: FileEntry, domains: Mapping[str, KeyDomain], partitions: Mapping[str, str]
) -> bool:
    """False only when no row of ``entry`` can equal a source row on every key."""
    rows = entry.num_records
    for column, domain in domains.items():
        partition = partitions.get(column.lower())
        if partition is not None:
            value = entry.partition_values.get(partition)
            if value is None:
                return False  # NULL equals nothing
            low = high = value
        else:
            low, high = _stat(entry.min_values, column), _stat(entry.max_values, column)
            nulls = _stat(entry.null_counts, column)
            if isinstance(nulls, int) and rows is not None and nulls >= rows:
                return False  # every value NULL
        if not domain.may_hold(low, high):
            return False
    return True


def in_list(column: str, target_alias: str, domain: KeyDomain) -> Any:
    """``t.column IN (values)`` for an exact domain (the read predicate's partition
    part, for conflict checks); no values: a predicate no row satisfies."""
    node = _predicates.Column((target_alias, column))
    literals = tuple(_predicates.Literal(v) for v in domain.values or ())
    if not literals:
        return _predicates.And(_predicates.IsNull(node), _predicates.IsNull(node, True))
    return _predicates.InList(node, literals)


def conjuncts(node: Any) -> list[Any]:
    if isinstance(node, _predicates.And):
        return [*conjuncts(node.left), *conjuncts(node.right)]
    return [node]


def columns_under(node: Any, alias: str) -> bool | None:
    """True when every column of ``node`` is qualified by ``alias`` (None: no columns)."""
    if isinstance(node, _predicates.Column):
        return len(node.path) > 1 and node.path[0].lower() == alias.lower()
    children: list[Any] = []
    if isinstance(node, tuple):
        children = list(node)
    elif dataclasses.is_dataclass(node) and not isinstance(node, _predicates.Literal):
        children = [getattr(node, f.name) for f in dataclasses.fields(node)]
    found: bool | None = None
    for child in children:
        result = columns_under(child, alias)
        if result is False:
            return False
        if result is True:
            found = True
    return found


def _target_and_source(conjunct: Any, alias: str) -> KeyColumn | None:
    """``t.k = s.c`` (either order) as a key; None for anything else."""
    if not isinstance(conjunct, _predicates.Compare) or conjunct.op != "=":
        return None
    sides = [s for s in (conjunct.left, conjunct.right) if isinstance(s, _predicates.Column)]
    if len(sides) != 2:
        return None
    target = [s for s in sides if columns_under(s, alias) is True]
    other = [s for s in sides if columns_under(s, alias) is not True]
    if len(target) != 1 or len(other) != 1 or len(target[0].path) != 2:
        return None
    name = ".".join("`" + part.replace("`", "``") + "`" for part in other[0].path)
    return KeyColumn(target[0].path[1], name)


def _comparable(target: DataType, source: DataType) -> bool:
    families = {_family(target), _family(source)}
    return None not in families and (len(families) == 1 or families == {"integral", "decimal"})


def _family(data_type: DataType) -> str | None:
    from pyspark.sql import types as T

    if isinstance(data_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "integral"
    if isinstance(data_type, T.DecimalType):
        return "decimal"
    if isinstance(data_type, T.DateType):
        return "date"
    if isinstance(data_type, T.StringType) and not isinstance(data_type, T.CharType):
        return "string" if getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY" else None
    return None


def _is_char(metadata: Mapping[str, Any] | None) -> bool:
    raw = str((metadata or {}).get("__CHAR_VARCHAR_TYPE_STRING", ""))
    return raw.lower().startswith("char")


def _is_local(df: DataFrame) -> bool:
    """Whether Spark computes ``df`` on the driver (an optimized plan that is a local
    relation): collecting it then runs no job."""
    plan = df._jdf.queryExecution().optimizedPlan()
    return str(plan.getClass().getSimpleName()) == "LocalRelation"


def _stat(tree: Mapping[str, Any], column: str) -> Any:
    key = next((k for k in tree if k.lower() == column.lower()), None)
    return None if key is None else tree[key]
