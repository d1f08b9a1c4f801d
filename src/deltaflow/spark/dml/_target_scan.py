"""The target files of a DELETE, UPDATE or MERGE as a DataFrame, and the session settings
its Spark jobs run under.

:func:`scan` reads exactly the given files of a pinned snapshot: Spark's Parquet scan when
it reads them exactly (:mod:`deltaflow.spark.read._native`'s rules applied to these
files), otherwise a ``mapInArrow`` over the ``read_file`` the ``delta`` source uses
(deletion vectors, column mapping, partition values). The Spark conf
``deltaflow.dml.nativeScan`` = ``auto`` | ``false`` chooses. Each row can carry its file
(``FILE_INDEX``) and its Parquet row index (deletion vectors).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from deltaflow.errors import DeltaflowError
from deltaflow.spark._options import JVM_PATH_MODES, jvm_path_mode
from deltaflow.spark.dml import _dv
from deltaflow.spark.read._native import Fallback, NativeScan, plan_native_files
from deltaflow.spark.write import _replace_where
from deltaflow.table import _predicates, _uri
from deltaflow.table._snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("deltaflow.dml")

# Spark lists more paths than this in a Spark job; DML scans name exact files.
LISTING_THRESHOLD_CONF = "spark.sql.sources.parallelPartitionDiscovery.threshold"
MIN_PARTITIONS_CONF = "spark.sql.files.minPartitionNum"
# Carries each row's source file through job 1 (see TargetScan).
FILE_INDEX = "__deltaflow_file_index"
# auto: target files are read by Spark's Parquet scan when it reads them exactly.
NATIVE_SCAN_CONF = "deltaflow.dml.nativeScan"
NATIVE_SCAN_MODES = JVM_PATH_MODES
# Deleted rows up to this many are broadcast to the DML scan's anti join.
BROADCAST_DELETED_ROWS = 2_000_000


@dataclass(frozen=True)
class TargetScan:
    """Candidate files as a DataFrame whose ``FILE_INDEX`` column names each row's file.

    ``keys`` maps a ``FILE_INDEX`` value to the file's index in the candidate list:
    the JVM scan tags rows with their file's name (``_metadata.file_name``, unique
    among the candidates), the Python scan with the index itself (``keys`` None).
    """

    df: DataFrame
    native: bool
    keys: Mapping[Any, int] | None = None

    def index(self, key: Any) -> int:
        return int(key) if self.keys is None else self.keys[key]


class FileCounts(NamedTuple):
    """One candidate file's rows, and how many of them a DML's condition matched."""

    total: int
    matched: int


def dml_scan_mode(value: str | None) -> str:
    return jvm_path_mode(
        NATIVE_SCAN_CONF, value, "makes DELETE, UPDATE and MERGE read target files through Python"
    )


def scan(
    spark: SparkSession,
    snapshot: Snapshot,
    struct: StructType,
    files: list[FileEntry],
    alias: str | None,
    *,
    keyed: bool = True,
    row_index: bool = False,
    deleted: Mapping[str, np.ndarray] | None = None,
) -> TargetScan:
    """Exactly ``files`` of ``snapshot`` as a DataFrame, plus each row's file key
    (``keyed=False``: the JVM scan leaves the key out; the Python scan always has it).

    Spark's Parquet scan reads them when it reads them exactly (``_native_read``'s
    rules: no deletion vectors in these files, no column mapping or type widening,
    Hive-decodable partition directories); the Python ``read_file`` otherwise.
    ``row_index``: plus each row's index in its Parquet file (``_dv.ROW_INDEX``);
    files with deletion vectors (``deleted``: the snapshot's deleted rows) are then
    read by the JVM scan too, their deleted rows dropped by row index.
    """
    if row_index and deleted is None:
        deleted = snapshot.deleted_rows()
    plan = _native_plan(spark, snapshot, struct, files, deletion_vectors=row_index)
    if isinstance(plan, NativeScan):
        log.info(
            "DML scan of %s v%d: JVM Parquet scan of %d files",
            snapshot.uri,
            snapshot.version,
            len(files),
        )
        if row_index:
            df = _with_row_index(spark, plan, files, deleted or {}, keyed)
        else:
            df = _native_scan(spark, plan, keyed)
        keys = {_file_name(f): i for i, f in enumerate(files)}
        return TargetScan(df.alias(alias) if alias else df, native=True, keys=keys)
    log.info(
        "DML scan of %s v%d: Python scan of %d files (%s)",
        snapshot.uri,
        snapshot.version,
        len(files),
        plan.reason,
    )
    return TargetScan(
        _python_scan(spark, snapshot, struct, files, alias, row_index=row_index), native=False
    )


def candidate_files(snapshot: Snapshot, condition: Any, alias: str | None) -> list[FileEntry]:
    """Files that may hold matching rows: pruned by partition values and stats when we can."""
    files = snapshot.files()
    node = parse_condition(condition, alias)
    if node is None:
        return files
    partitions = {c.lower(): c for c in snapshot.partition_columns}
    kept = [
        f for f in files if _predicates.may_match(node, _replace_where._stats_lookup(f, partitions))
    ]
    log.info("DML on %s: %d of %d files may match", snapshot.uri, len(kept), len(files))
    return kept


def parse_condition(condition: Any, alias: str | None) -> _predicates.Node | None:
    """``condition`` as a predicate tree without ``alias``, or None: not SQL text the
    predicate parser reads (functions, casts...; Spark decides, every file is read)."""
    return _parse(condition, alias) if isinstance(condition, str) else None


def _parse(condition: str, alias: str | None) -> _predicates.Node | None:
    try:
        node = _predicates.parse(condition, option="condition")
    except DeltaflowError:
        return None  # beyond the parser (functions, casts...): Spark decides, every file is read
    return strip_alias(node, alias) if alias else node


def strip_alias(node: Any, alias: str) -> Any:
    """``node`` with column paths ``alias.x`` shortened to ``x``."""
    if isinstance(node, _predicates.Column):
        path = node.path
        if len(path) > 1 and path[0].lower() == alias.lower():
            return _predicates.Column(path[1:])
        return node
    if isinstance(node, tuple):
        return tuple(strip_alias(n, alias) for n in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, _predicates.Literal):
        changes = {
            f.name: strip_alias(getattr(node, f.name), alias) for f in dataclasses.fields(node)
        }
        return dataclasses.replace(node, **changes)  # type: ignore[type-var]
    return node


# Below this many input bytes a DML job runs without adaptive execution (balanced_splits).
SMALL_DML_BYTES = 32 * 1024 * 1024
ADAPTIVE_CONF = "spark.sql.adaptive.enabled"


# Overrides in force, per (session, key): how many holders, and the value before the
# first. Pipelines run DMLs (AUTO CDC MERGEs) on one session from several threads: a
# plain save-and-restore would let the last to finish restore another's override (seen:
# spark.sql.adaptive.enabled left "false" for the rest of the session).
_overrides: dict[tuple[int, str], tuple[int, str | None]] = {}
_overrides_lock = threading.Lock()


@contextlib.contextmanager
def session_conf(spark: SparkSession, settings: Mapping[str, str | None]) -> Iterator[None]:
    """``settings`` on ``spark``'s conf for the duration (None: leave as is), then restored.

    Session confs are read when a plan is built or run, so this brackets exactly the
    call that builds or runs it. Holders on several threads of one session share an
    override; the value before the first is restored when the last one leaves.
    """
    conf = spark.conf
    session = id(spark._jsparkSession)
    wanted = {k: v for k, v in settings.items() if v is not None}
    with _overrides_lock:
        for key, value in wanted.items():
            count, before = _overrides.get((session, key), (0, None))
            if count == 0:
                before = conf.get(key, None)
            _overrides[(session, key)] = (count + 1, before)
            conf.set(key, value)
    try:
        yield
    finally:
        with _overrides_lock:
            for key in wanted:
                count, before = _overrides.pop((session, key))
                if count > 1:
                    _overrides[(session, key)] = (count - 1, before)
                elif before is None:
                    conf.unset(key)
                else:
                    conf.set(key, before)


def balanced_splits(
    spark: SparkSession, files: Sequence[FileEntry] = ()
) -> contextlib.AbstractContextManager[None]:
    """Session settings for a DML job over ``files``.

    Scans split into at least two tasks per core: Spark packs files into splits of up
    to ``spark.sql.files.maxPartitionBytes`` (128 MiB), so the 155 MB, 40-file target of
    ``bench_merge.py`` became 3 tasks and one of 2 cores idled for the last third of both
    jobs. With ``minPartitionNum`` = 2 x cores, Spark sizes splits to give each core two
    (larger scans are still capped at 128 MiB). A value the user set is kept.

    Inputs of at most ``SMALL_DML_BYTES`` run without adaptive execution: it re-plans
    between stages by running each as a job of its own, which on a few MB costs more
    than it can save (a one-row MERGE into a 10k-row table: 12 jobs -> 7, 1.11 -> 1.02 s
    p50 on a quiet machine).
    """
    settings: dict[str, str | None] = {}
    if not spark.conf.get(MIN_PARTITIONS_CONF, None):
        cores = spark.sparkContext.defaultParallelism
        settings[MIN_PARTITIONS_CONF] = str(max(2 * cores, 2))
    if files and sum(f.size for f in files) <= SMALL_DML_BYTES:
        settings[ADAPTIVE_CONF] = "false"
    return session_conf(spark, settings) if settings else contextlib.nullcontext()


def _native_plan(
    spark: SparkSession,
    snapshot: Snapshot,
    struct: StructType,
    files: list[FileEntry],
    *,
    deletion_vectors: bool = False,
) -> NativeScan | Fallback:
    if dml_scan_mode(spark.conf.get(NATIVE_SCAN_CONF, "auto")) == "false":
        return Fallback(f"{NATIVE_SCAN_CONF}=false")
    if not files:
        return Fallback("no files")
    if any(f.name.lower() == "_metadata" for f in struct.fields):
        return Fallback("a column named _metadata hides Spark's file metadata")
    if len({_file_name(f) for f in files}) != len(files):
        return Fallback("two candidate files share a file name")
    return plan_native_files(snapshot, files, deletion_vectors=deletion_vectors)


def _file_name(entry: FileEntry) -> str:
    # What Spark's _metadata.file_name holds: Hadoop's Path.getName, decoded.
    return unquote(entry.path).rsplit("/", 1)[-1]


def _native_scan(spark: SparkSession, plan: NativeScan, keyed: bool) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(plan.schema)
    # The files are the log's: nothing to discover. Above the threshold (32 paths) Spark
    # would list them in a Spark job of its own (~1 s for 40 files under load).
    with session_conf(spark, {LISTING_THRESHOLD_CONF: str(len(plan.file_uris) + 1)}):
        df = spark.read.schema(schema).option("basePath", plan.root).parquet(*plan.file_uris)
    columns = [F.col("`" + name.replace("`", "``") + "`") for name in schema.fieldNames()]
    if keyed:
        columns.append(F.col("_metadata.file_name").alias(FILE_INDEX))
    return df.select(*columns)


def _with_row_index(
    spark: SparkSession,
    plan: NativeScan,
    files: list[FileEntry],
    deleted: Mapping[str, np.ndarray],
    keyed: bool,
) -> DataFrame:
    """The JVM scan with each row's Parquet row index, rows that deletion vectors
    delete dropped (an anti join on file name and row index)."""
    from pyspark.sql import functions as F

    df = _native_scan(spark, plan, keyed=True).withColumn(
        _dv.ROW_INDEX, F.col("_metadata.row_index")
    )
    gone = [(_file_name(f), deleted[f.path]) for f in files if len(deleted.get(f.path, ()))]
    if gone:
        names = np.repeat(np.array([n for n, _ in gone], dtype=object), [len(r) for _, r in gone])
        rows = np.concatenate([r for _, r in gone]).astype(np.int64)
        table = pa.table({FILE_INDEX: pa.array(names, pa.string()), _dv.ROW_INDEX: rows})
        dropped = spark.createDataFrame(table)
        if table.num_rows <= BROADCAST_DELETED_ROWS:
            dropped = F.broadcast(dropped)
        df = df.join(dropped, [FILE_INDEX, _dv.ROW_INDEX], "left_anti")
    return df if keyed else df.drop(FILE_INDEX)


def _python_scan(
    spark: SparkSession,
    snapshot: Snapshot,
    struct: StructType,
    files: list[FileEntry],
    alias: str | None,
    *,
    row_index: bool = False,
) -> DataFrame:
    """Exactly ``files`` of ``snapshot`` read by Python tasks, plus each row's file index
    (and with ``row_index``, its index in the Parquet file)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from deltaflow.spark.read._reader import FileTask, ReadLayout, bin_pack, read_file

    layout = ReadLayout.build(snapshot, struct)
    deleted = snapshot.deleted_rows()
    tasks = [
        FileTask(_uri.join(snapshot.uri, f.path), f.size, f.partition_values, deleted.get(f.path))
        for f in files
    ]
    index_of = {task.uri: i for i, task in enumerate(tasks)}
    groups = [
        [(index_of[t.uri], t) for t in group]
        for group in bin_pack(tasks, spark.sparkContext.defaultParallelism)
    ]
    extra = [StructField(FILE_INDEX, LongType(), False)]
    if row_index:
        extra.append(StructField(_dv.ROW_INDEX, LongType(), False))
    out = StructType([*struct.fields, *extra])
    names = [*layout.target.names, *(f.name for f in extra)]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for group in batch.column(0).to_pylist():
                for index, task in groups[group]:
                    positions = _read_positions(task) if row_index else None
                    offset = 0
                    for data in read_file(task, layout):
                        marker = [pa.array([index] * data.num_rows, pa.int64())]
                        if positions is not None:
                            marker.append(pa.array(positions[offset : offset + data.num_rows]))
                            offset += data.num_rows
                        yield pa.RecordBatch.from_arrays([*data.columns, *marker], names=names)

    df = spark.range(0, len(groups), 1, numPartitions=max(len(groups), 1)).mapInArrow(read, out)
    return df.alias(alias) if alias else df


def _read_positions(task: Any) -> np.ndarray:
    """The Parquet row indexes ``read_file(task)`` yields, in order (its DV dropped)."""
    import pyarrow.parquet as pq

    fs, path = _uri.filesystem(task.uri)
    with fs.open_input_file(path) as handle:
        num_rows = pq.ParquetFile(handle).metadata.num_rows
    positions = np.arange(num_rows, dtype=np.int64)
    if task.deleted_rows is not None and len(task.deleted_rows):
        keep = np.ones(num_rows, dtype=bool)
        keep[task.deleted_rows[task.deleted_rows < num_rows]] = False
        positions = positions[keep]
    return positions
