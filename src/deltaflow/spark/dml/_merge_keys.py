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
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.errors import DeltaflowError
from deltaflow.spark.dml import _target_scan
from deltaflow.spark.dml._merge_builder import MergeSpec
from deltaflow.spark.write import _replace_where
from deltaflow.table import _predicates
from deltaflow.table._snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger("deltaflow.merge")

# Distinct source values of a partition-equality key collected to the driver for file
# pruning, for partition columns of types equality_keys leaves out (timestamps...).
MAX_PARTITION_VALUES = 1000
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


def candidate_files(
    snapshot: Snapshot,
    files: list[FileEntry],
    spec: MergeSpec,
    struct: StructType,
    materialized: DataFrame,
) -> tuple[list[FileEntry], Any, SourceKeys | None]:
    """Files that may hold matching rows, pruned by the condition's conjuncts that name
    only the target (``t.kind = 'a'``) and by its equalities of a target column with a
    source column (``t.id = s.id``); that pruning predicate (None: none), the MERGE's
    read predicate for conflict checks; and what the source's keys hold (None: no key
    equality). ``materialized``: the source persisted (key values are read from it)."""
    alias = spec.target_alias
    if not isinstance(spec.condition, str) or alias is None:
        return files, None, None
    try:
        node = _predicates.parse(spec.condition, option="condition")
    except DeltaflowError:
        return files, None, None
    source = spec.source
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    keys = equality_keys(node, alias, struct, source)
    found = collect(source, keys, materialized=materialized) if keys else None
    parts = conjuncts(node)
    pruning = [c for c in parts if columns_under(c, alias) is True]
    exact: dict[str, KeyDomain] = {}
    if found is not None and found.exact:
        exact = {k.lower(): d for k, d in found.domains.items() if k.lower() in partitions}
        # Exact partition values belong in the read predicate (conflict checks).
        pruning += [in_list(k, alias, d) for k, d in exact.items()]
    for conjunct in parts:
        values = _partition_values(conjunct, alias, partitions, source, exact)
        if values is not None:
            pruning.append(values)
    combined: Any = None
    if pruning:
        combined = pruning[0]
        for c in pruning[1:]:
            combined = _predicates.And(combined, c)
        combined = _target_scan.strip_alias(combined, alias)

    def may_match(entry: FileEntry) -> bool:
        if found is not None and not file_may_match(entry, found.domains, partitions):
            return False
        if combined is None:
            return True
        try:
            return _predicates.may_match(combined, _replace_where._stats_lookup(entry, partitions))
        except (TypeError, ValueError, DeltaflowError):
            return True  # values of another type than the column's: read the file

    kept = [f for f in files if may_match(f)]
    log.info("MERGE into %s: %d of %d files may match", snapshot.uri, len(kept), len(files))
    return kept, combined, found


def _partition_values(
    conjunct: Any,
    alias: str,
    partitions: Mapping[str, str],
    source: DataFrame,
    known: Mapping[str, Any],
) -> Any | None:
    """``t.p IN (<distinct source values>)`` for ``t.p = s.c`` on a partition column of a
    type :func:`equality_keys` leaves out (one job), unless ``known`` has its values."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    key = _target_and_source(conjunct, alias)
    if key is None or key.target.lower() not in partitions or key.target.lower() in known:
        return None
    try:
        values = source.select(F.col(key.source)).distinct().limit(MAX_PARTITION_VALUES + 1)
        rows = values.collect()
    except AnalysisException:
        return None  # not a source column: no pruning; the join reports real errors
    if len(rows) > MAX_PARTITION_VALUES:
        return None
    domain = KeyDomain(None, None, tuple(r[0] for r in rows if r[0] is not None))
    return in_list(key.target, alias, domain)


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
        with _target_scan.session_conf(spark, settings):
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
    with _target_scan.session_conf(spark, {_target_scan.ADAPTIVE_CONF: "false"}):
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
