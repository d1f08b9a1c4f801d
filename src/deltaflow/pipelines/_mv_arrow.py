"""A decomposable GROUP BY folded on the driver with Arrow: no Spark job at all.

When a foldable view (:mod:`._mv_fold`) groups by plain source columns and aggregates
plain source columns (``groupBy("key").agg(count("*"), sum("qty"), avg("qty"))``, no
filter or computed column below the aggregate), its refresh needs nothing Spark
offers: the change rows of the commit range are read straight from the files the
table layer plans (:func:`deltaflow.table._cdf.plan_changes`: change data files, added
and removed data files), turned into signed helper values, stacked on the view's own
helper columns and summed per group with pyarrow, and the result written as one Parquet
file in one overwrite commit through the table layer. At 100k change rows and 100k
groups that is a fraction of a second, where the Spark fold paid the fixed cost of
several jobs (the change rows, the deltas, the view read, the overwrite) and lost to a
recompute (docs/benchmarks.md).

A complete recompute of such a view is the same fold from nothing (:func:`recompute`):
every row of the source's snapshot counts +1, read in chunks through deltaflow's file
reader (any source table: partitioned, column-mapped, with deletion vectors, on an object
store) and summed per group as it goes, so a source of a few million rows is aggregated
in tens of milliseconds where Spark's job costs a few hundred (the first refresh of a
view, a full refresh, a change set too large to fold).

The view's rows and the change rows are held in the driver's memory, so the cost model
(:mod:`._incremental`) only picks this path for views and change sets under
:data:`DRIVER_LIMIT_BYTES` (sources under :data:`RECOMPUTE_LIMIT_BYTES` for a
recompute, which holds only partial sums). The view, and the source of a fold, must be
local tables without partition columns, column mapping or deletion vectors (the Spark
fold handles the rest).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.pipelines import _mv_plan
from deltaflow.pipelines._mv_fold import ROWS, Folding, cnt_name, sum_name

if TYPE_CHECKING:
    from deltaflow.table._snapshot import Snapshot

log = logging.getLogger(__name__)

# The change files' and the view's bytes (each) up to which the fold runs on the driver:
# both are read into memory there (decoded, a few times their Parquet size).
DRIVER_LIMIT_BYTES = 256 * 1024 * 1024
# The source's bytes up to which a complete recompute runs on the driver. Its rows are
# read a chunk at a time (partial sums kept, not the rows), so memory is bounded by the
# groups; the limit is about time. Measured on 2 cores (docs/benchmarks.md): 1M rows
# (~10 MB) in ~0.03 s against ~0.28 s for Spark's job; 10M rows in 100k groups (106 MB)
# about even with Spark (1.6-2.9 s each). Above this, executors are the better bet.
RECOMPUTE_LIMIT_BYTES = 64 * 1024 * 1024
_CHUNK_ROWS = 1 << 21  # source rows summed per partial aggregation

_ADDED = ("insert", "update_postimage")  # change types that add a row's values
# Sums are added up as DECIMAL(38, 0): pyarrow's BIGINT sums wrap around where Spark's
# (ANSI) fail, so a total outside BIGINT is caught when cast back, not stored wrong.
_WIDE = pa.decimal128(38, 0)


class SumOutOfRange(ArithmeticError):
    """A folded sum left BIGINT's range: the Spark path (and its error) decides."""


@dataclass(frozen=True)
class DriverFold:
    """A folding whose keys and aggregate inputs are source columns, by name."""

    folding: Folding
    key_columns: tuple[str, ...]  # the source column of each of folding.keys
    input_columns: tuple[str | None, ...]  # of each fold (None: count(*))


@dataclass(frozen=True)
class FoldResult:
    change_rows: int  # change rows folded in
    rows: int  # rows the view holds now (all written)
    seconds: dict[str, float]  # per phase, for the log and the benchmark


def driver_fold(shape: _mv_plan.QueryShape, folding: Folding) -> DriverFold | None:
    """``folding`` as a :class:`DriverFold`, or None when a grouping or an aggregate
    input is computed, or an operator other than a plain projection sits between the
    aggregate and the source."""
    node = folding.aggregate.child()
    while not node.equals(shape.relation):
        kind = str(node.getClass().getSimpleName())
        if kind == "Project":
            if not all(_mv_plan._attribute(e) for e in _mv_plan._seq(node.projectList())):
                return None
        elif kind != "SubqueryAlias":
            return None
        node = node.children().apply(0)
    names = {int(a.exprId().id()): str(a.name()) for a in _mv_plan._seq(shape.relation.output())}

    def column(expression: Any) -> str | None:
        if not _mv_plan._attribute(expression):
            return None
        return names.get(int(expression.exprId().id()))

    if not all(_groups_alike(g.dataType()) for g in folding.groupings):
        return None
    keys = [column(g) for g in folding.groupings]
    inputs = [None if f.child is None else column(f.child) for f in folding.folds]
    if any(k is None for k in keys) or any(
        c is None for c, f in zip(inputs, folding.folds, strict=True) if f.child is not None
    ):
        return None
    return DriverFold(folding, tuple(k for k in keys if k is not None), tuple(inputs))


# Key types pyarrow groups exactly as Spark does. Not floats (Spark makes NaN and -0.0
# one group each), collated strings (equal by their collation), nested types.
_KEY_TYPES = (
    "BOOLEAN",
    "TINYINT",
    "SMALLINT",
    "INT",
    "BIGINT",
    "STRING",
    "BINARY",
    "DATE",
    "TIMESTAMP",
    "TIMESTAMP_NTZ",
)


def _groups_alike(data_type: Any) -> bool:
    sql = str(data_type.sql())
    return sql in _KEY_TYPES or sql.startswith("DECIMAL(")


def readable(snapshot: Snapshot) -> bool:
    """Whether this module reads and writes ``snapshot``'s table itself."""
    from deltaflow.table import _uri

    return (
        _uri.is_local(snapshot.uri)
        and not snapshot.partition_columns
        and snapshot.column_mapping_mode == "none"
        and not snapshot.has_deletion_vectors_enabled
    )


def fold(plan: DriverFold, source_uri: str, start: int, end: int, target_uri: str) -> FoldResult:
    """Fold the source's changes of versions ``start``..``end`` into the view at
    ``target_uri``: one overwrite commit of the view's new rows."""
    from deltaflow.table._snapshot import load_snapshot

    clock = _Clock()
    source = load_snapshot(source_uri, version=end)
    view = load_snapshot(target_uri)
    clock.lap("snapshots")
    changes = _signed_changes(plan, source, start, end)
    clock.lap("change rows")
    state = _view_state(plan.folding, view)
    clock.lap("view read")
    # One aggregation over the view's helper values and the changes' signed ones together.
    stacked = pa.concat_tables([state, changes.cast(state.schema)])
    new = _view_rows(plan.folding, _sum_per_group(plan.folding, stacked), view)
    clock.lap("fold")
    _overwrite(view, new)
    clock.lap("commit")
    log.info("driver fold of %d change rows into %s: %s", changes.num_rows, target_uri, clock)
    return FoldResult(changes.num_rows, new.num_rows, clock.seconds)


def recompute(plan: DriverFold, source: Snapshot, view: Snapshot) -> FoldResult:
    """The whole view from the ``source`` snapshot (every row folded into an empty view):
    one overwrite commit of its rows on the ``view`` version read, replacing whatever it
    held."""
    clock = _Clock()
    summed, rows = _summed_source(plan, source)
    clock.lap("source read and summed")
    new = _view_rows(plan.folding, summed, view)
    clock.lap("view rows")
    _overwrite(view, new)
    clock.lap("commit")
    log.info("driver recompute of %d source rows into %s: %s", rows, view.uri, clock)
    return FoldResult(rows, new.num_rows, clock.seconds)


def _summed_source(plan: DriverFold, source: Snapshot) -> tuple[pa.Table, int]:
    """Every source row's helper values summed per group, a chunk of rows at a time (the
    partial sums kept wide, narrowed once at the end); and the rows read. The rows come
    through deltaflow's own file reader, so partition values, column mapping, deletion
    vectors and object stores are read as a Spark scan of the table reads them."""
    from pyspark.sql.types import StructType

    from deltaflow.spark.read import _reader

    names = list(dict.fromkeys([*plan.key_columns, *(c for c in plan.input_columns if c)]))
    fields = {f["name"]: f for f in source.schema["fields"]}
    wanted = StructType.fromJson({"type": "struct", "fields": [fields[n] for n in names]})
    tasks, _ = _reader.plan_scan(source, [])
    layout = _reader.ReadLayout.build(source, wanted)
    partials: list[pa.Table] = []
    chunk: list[pa.RecordBatch] = []
    rows = pending = 0

    def sum_chunk() -> None:
        table = pa.Table.from_batches(chunk, schema=layout.target)
        ones = pa.repeat(pa.scalar(1, pa.int64()), table.num_rows)
        partials.append(_sum_per_group(plan.folding, _signed(plan, table, ones), narrow=False))
        chunk.clear()

    for batch in _reader.read_tasks(source.uri, tasks, layout):
        chunk.append(batch)
        rows += batch.num_rows
        pending += batch.num_rows
        if pending >= _CHUNK_ROWS:
            sum_chunk()
            pending = 0
    if chunk or not partials:
        sum_chunk()
    return _sum_per_group(plan.folding, pa.concat_tables(partials)), rows


def _signed_changes(plan: DriverFold, source: Snapshot, start: int, end: int) -> pa.Table:
    """The change rows as keys (named as the view's) and signed helper values."""
    from deltaflow.table import _cdf

    files = _cdf.plan_changes(source, _cdf.ChangeRange(start, end))
    wanted = _source_columns(plan, source)
    parts: list[pa.Table] = []
    for kind in ("cdc", "add", "remove"):
        paths = [_cdf.file_uri(source.uri, f.path) for f in files if f.kind == kind]
        if not paths:
            continue
        read = wanted.append(pa.field(_cdf.CHANGE_TYPE, pa.string())) if kind == "cdc" else wanted
        rows = _read(paths, read)
        if kind == "cdc":
            added = pc.is_in(rows.column(_cdf.CHANGE_TYPE), pa.array(_ADDED))
            sign = pc.if_else(added, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))
        else:
            sign = pa.repeat(pa.scalar(1 if kind == "add" else -1, pa.int64()), rows.num_rows)
        parts.append(_signed(plan, rows, sign))
    if not parts:
        return _signed(plan, wanted.empty_table(), pa.array([], pa.int64()))
    return pa.concat_tables(parts)


def _source_columns(plan: DriverFold, source: Snapshot) -> pa.Schema:
    """The source columns the fold reads: the keys' and the aggregates' inputs."""
    columns = list(dict.fromkeys([*plan.key_columns, *(c for c in plan.input_columns if c)]))
    schema = _arrow_schema(source.schema)
    return pa.schema([schema.field(c) for c in columns])


def _signed(plan: DriverFold, rows: pa.Table, sign: Any) -> pa.Table:
    """Each change row's contribution to the helper columns (``sign``: +1 or -1)."""
    folding = plan.folding
    arrays: dict[str, Any] = {
        k: rows.column(c) for k, c in zip(folding.keys, plan.key_columns, strict=True)
    }
    arrays[ROWS] = sign
    zero = pa.scalar(0, pa.int64())
    for i, (fold, column) in enumerate(zip(folding.folds, plan.input_columns, strict=True)):
        if column is None:
            continue
        arrays[cnt_name(i)] = pc.if_else(pc.is_valid(rows.column(column)), sign, zero)
        if fold.needs_sum:  # an integer column (only those are folded)
            value = pc.cast(rows.column(column), _WIDE)
            signed = pc.if_else(pc.equal(sign, 1), value, pc.negate(value))
            arrays[sum_name(i)] = pc.fill_null(signed, pa.scalar(0, _WIDE))
    return pa.table(arrays)


def _sum_per_group(folding: Folding, rows: pa.Table, *, narrow: bool = True) -> pa.Table:
    """``rows``' helper columns summed per group (NULL keys group together, as in SQL);
    sums narrowed back to BIGINT unless ``narrow`` is False (a partial sum)."""
    helpers = folding.helpers()
    summed = rows.group_by(list(folding.keys), use_threads=True).aggregate(
        [(h, "sum") for h in helpers]
    )
    summed = summed.rename_columns([*folding.keys, *helpers]).select([*folding.keys, *helpers])
    for h in _sum_helpers(folding) if narrow else ():
        try:
            narrow = pc.cast(summed.column(h), pa.int64())
        except pa.ArrowInvalid as exc:
            raise SumOutOfRange(f"the sum {h} is outside BIGINT's range") from exc
        summed = summed.set_column(summed.schema.get_field_index(h), h, narrow)
    return summed


def _sum_helpers(folding: Folding) -> set[str]:
    return {sum_name(i) for i, fold in enumerate(folding.folds) if fold.needs_sum}


def _view_state(folding: Folding, view: Snapshot) -> pa.Table:
    """The view's keys and helper values, under the helpers' names."""
    from deltaflow.table import _uri

    schema = _arrow_schema(view.schema)
    helpers = folding.helpers()
    stored = [*folding.keys, *(folding.stored(h) for h in helpers)]
    wanted = pa.schema([schema.field(c) for c in dict.fromkeys(stored)])
    paths = [_uri.join(view.uri, f.path) for f in view.files(stats=False)]
    table = _read(paths, wanted) if paths else wanted.empty_table()
    # Helpers kept in the view's own columns are read from them, under their names; sums
    # as DECIMAL(38, 0), like the changes' (see _WIDE).
    sums = _sum_helpers(folding)
    names = [*folding.keys, *helpers]
    columns = []
    for i, (name, c) in enumerate(zip(names, stored, strict=True)):
        if i < len(folding.keys):
            columns.append(table.column(c))
            continue
        kind = _WIDE if name in sums else pa.int64()
        # A sum column is NULL where its helper is 0 (only NULLs summed).
        columns.append(pc.fill_null(pc.cast(table.column(c), kind), pa.scalar(0, kind)))
    return pa.table(columns, names=names)


def _view_rows(folding: Folding, state: pa.Table, view: Snapshot) -> pa.Table:
    """The view's new rows (its schema, in its column order) from the summed helpers:
    groups left with no rows dropped, each aggregate derived as in :mod:`._mv_fold`."""
    state = state.filter(pc.greater(state.column(ROWS), 0))
    columns: dict[str, Any] = {name: state.column(name) for name in state.column_names}
    for i, fold in enumerate(folding.folds):
        if fold.function == "count_star":
            columns[fold.name] = state.column(ROWS)
            continue
        count = state.column(cnt_name(i))
        if fold.function == "count":
            columns[fold.name] = count
            continue
        total = state.column(sum_name(i))
        some = pc.greater(count, 0)  # sum and avg of only NULLs are NULL
        if fold.function == "sum":
            columns[fold.name] = pc.if_else(some, total, None)
        else:
            mean = pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64()))
            columns[fold.name] = pc.if_else(some, mean, None)
    schema = _arrow_schema(view.schema)
    return pa.Table.from_arrays([pc.cast(columns[f.name], f.type) for f in schema], schema=schema)


def _overwrite(view: Snapshot, rows: pa.Table) -> None:
    """``rows`` as the view's only file, in one overwrite commit on the version read."""
    import pyarrow.parquet as pq

    from deltaflow.table import _commit, _stats, _uri

    relative = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    path = os.path.join(_uri.local_path(view.uri), relative)
    pq.write_table(rows, path, compression="snappy")
    added = _commit.AddedFile(
        path=relative,
        size=os.path.getsize(path),
        partition_values={},
        modification_time=int(time.time() * 1000),
        stats=_stats.file_stats(rows, _stats.num_indexed_cols(view.configuration)),
    )
    request = _commit.CommitRequest(
        table_uri=view.uri,
        schema=view.schema,
        partition_columns=(),
        adds=[added],
        mode="overwrite",
        read_version=view.version,
    )
    try:
        _commit.commit(request)
    except BaseException:
        os.remove(path)  # not in the log: nobody reads it
        raise


def _read(paths: list[str], schema: pa.Schema) -> pa.Table:
    """``schema``'s columns of the Parquet files ``paths`` (columns a file lacks: NULL)."""
    import pyarrow.dataset as ds

    from deltaflow.table import _uri

    fs, _ = _uri.filesystem(paths[0])
    local = [_uri.filesystem(p)[1] for p in paths]
    return ds.dataset(local, schema=schema, format="parquet", filesystem=fs).to_table()


def _arrow_schema(delta_schema: dict[str, Any]) -> pa.Schema:
    from deltalake import Schema

    return pa.schema(Schema.from_json(json.dumps(delta_schema)).to_arrow())


class _Clock:
    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._last, 4)
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in self.seconds.items())
