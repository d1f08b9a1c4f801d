"""What a pipeline declares: frozen description objects, no Spark.

The decorators and functions in :mod:`deltaflow.pipelines` and
:mod:`deltaflow.pipelines.dlt` only build these and hand them to the active
:class:`~deltaflow.pipelines._graph.GraphBuilder`; the runner turns them into Spark
queries. Columns and conditions are kept as the user gave them: a name or SQL text
(inspectable anywhere) or a pyspark ``Column`` (which needs Spark to exist at all).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

# A column or condition: a name / SQL expression, or a pyspark Column.
ColumnLike = Union[str, "Column"]
QueryFunction = Callable[[], "DataFrame"]

# ``table``: a Lakeflow ``dlt.table``, a streaming table when its query is a stream and a
# materialized view otherwise (decided when the runner first analyses the query).
DatasetKind = Literal["table", "streaming_table", "materialized_view", "temporary_view"]
ExpectationAction = Literal["warn", "drop", "fail"]
ScdType = Literal[1, 2]
# ``update``: an ``update_flow`` (Lakeflow), written in update output mode, into a sink.
OutputMode = Literal["append", "update"]


@dataclass(frozen=True)
class SourceLocation:
    """Where a declaration was made: for messages and the event log."""

    path: str | None
    line: int | None

    def __str__(self) -> str:
        if self.path is None:
            return "<unknown>"
        return f"{self.path}:{self.line}" if self.line is not None else self.path


@dataclass(frozen=True)
class Expectation:
    """A data-quality rule: rows where ``constraint`` (SQL) is not true are counted as
    failed, and then kept (``warn``), dropped (``drop``) or fail the flow (``fail``).
    A constraint that evaluates to NULL fails, as in Lakeflow."""

    name: str
    constraint: str
    action: ExpectationAction = "warn"


@dataclass(frozen=True)
class Dataset:
    """A table, materialized view or temporary view of the pipeline.

    ``path`` is where its Delta table lives (default: under the pipeline's storage);
    ``schema`` a DDL string or a ``StructType``; ``expectations`` apply to every row
    any flow writes into it. ``temporary``: private (Lakeflow's ``private=``, formerly
    ``temporary=``): materialized, but in the catalog only while an update runs.
    """

    name: str
    kind: DatasetKind
    location: SourceLocation
    comment: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    table_properties: Mapping[str, str] = field(default_factory=dict)
    partition_cols: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    schema: str | StructType | None = None
    path: str | None = None
    format: str | None = None
    temporary: bool = False
    expectations: tuple[Expectation, ...] = ()

    @property
    def is_view(self) -> bool:
        return self.kind == "temporary_view"


@dataclass(frozen=True)
class Flow:
    """A query whose result goes into ``target``: the query of a table or view (same
    name as its dataset), an ``append_flow`` (several may feed one streaming table) or
    an ``update_flow`` (``output_mode="update"``, into a sink). ``once``: run a single
    time (a backfill), not on every update."""

    name: str
    target: str
    func: QueryFunction
    location: SourceLocation
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    once: bool = False
    comment: str | None = None
    expectations: tuple[Expectation, ...] = ()
    output_mode: OutputMode = "append"


@dataclass(frozen=True)
class Sink:
    """An external destination (a format and its options) flows can append to."""

    name: str
    format: str
    options: Mapping[str, str]
    location: SourceLocation


@dataclass(frozen=True)
class AutoCdcFlow:
    """AUTO CDC from a change stream: ``source`` rows applied to ``target`` by ``keys``,
    ordered by ``sequence_by``; SCD type 1 (update in place) or 2 (history rows with
    ``__START_AT`` / ``__END_AT``)."""

    name: str
    target: str
    source: str
    keys: tuple[ColumnLike, ...]
    sequence_by: ColumnLike
    location: SourceLocation
    ignore_null_updates: bool = False
    apply_as_deletes: ColumnLike | None = None
    apply_as_truncates: ColumnLike | None = None
    column_list: tuple[ColumnLike, ...] | None = None
    except_column_list: tuple[ColumnLike, ...] | None = None
    stored_as_scd_type: ScdType = 1
    track_history_column_list: tuple[ColumnLike, ...] | None = None
    track_history_except_column_list: tuple[ColumnLike, ...] | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    once: bool = False


# A snapshot source function: given the last version processed (None at first), the next
# snapshot and its version, or None when there is no newer snapshot.
SnapshotFunction = Callable[[Any], "tuple[DataFrame, Any] | None"]


@dataclass(frozen=True)
class AutoCdcSnapshotFlow:
    """AUTO CDC from snapshots: each new snapshot of ``source`` (a dataset or table name,
    or a :data:`SnapshotFunction`) is compared by ``keys`` with the previous one, and
    the inserts, updates and deletes between them are applied to ``target``."""

    name: str
    target: str
    source: str | SnapshotFunction
    keys: tuple[ColumnLike, ...]
    location: SourceLocation
    stored_as_scd_type: ScdType = 1
    track_history_column_list: tuple[ColumnLike, ...] | None = None
    track_history_except_column_list: tuple[ColumnLike, ...] | None = None


AnyFlow = Flow | AutoCdcFlow | AutoCdcSnapshotFlow
