"""AUTO CDC: change rows applied to a streaming table, SCD type 1 or 2, as Lakeflow does.

Each micro-batch of the source is applied in ``foreachBatch``, and every step is
idempotent, so a batch replayed after a crash changes nothing twice:

* **SCD type 1** keeps one row per key. The batch's events are reduced to the latest
  per key (by ``sequence_by``); events not newer than what the key last saw are
  dropped (late or replayed). The sequence last applied per key, and whether the key
  was deleted (a tombstone, so a late insert older than the delete stays deleted), live
  in a state table under the pipeline's storage (``system/cdc/<flow>``), written after
  the target: a crash between the two replays events whose result is already there.
* **SCD type 2** keeps the history: one row per version with ``__START_AT`` /
  ``__END_AT`` (the sequence values that opened and closed it; NULL: current). For the
  keys in a batch, the history is rebuilt from the rows already in the table plus the
  new events, in sequence order, so late and out-of-order events land where they
  belong; one MERGE writes the difference.

``apply_as_deletes`` marks delete events, ``apply_as_truncates`` truncate events (SCD 1:
the table is emptied, then later events apply), ``ignore_null_updates`` keeps the current
value where an update has NULL, ``column_list`` / ``except_column_list`` choose the
columns stored, ``track_history_*`` which columns open a new SCD 2 version (changes to
the others update the current version in place).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines._declarations import AutoCdcFlow, ColumnLike
from deltaflow.pipelines.errors import GraphValidationError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

START, END = "__START_AT", "__END_AT"
_SEQ, _DELETE, _TRUNCATE = "__deltaflow_seq", "__deltaflow_delete", "__deltaflow_truncate"
_STATE_SEQ, _STATE_DELETED = "__sequence", "__deleted"


def column_name(column: ColumnLike) -> str:
    """The name of a column given as a string or as ``col("name")``."""
    if isinstance(column, str):
        return column
    text = str(column)  # Column<'name'>
    match = re.fullmatch(r"Column<'(.+)'>", text)
    return match.group(1) if match else text


def _expr(value: ColumnLike) -> Column:
    from pyspark.sql import functions as F

    return F.expr(value) if isinstance(value, str) else value


def stored_columns(source_columns: list[str], flow: AutoCdcFlow) -> list[str]:
    """The source columns the target stores (``column_list`` / ``except_column_list``)."""
    if flow.column_list is not None:
        wanted = [column_name(c) for c in flow.column_list]
        missing = [c for c in wanted if c not in source_columns]
        if missing:
            raise GraphValidationError(
                f"AUTO CDC flow {flow.name!r}: column_list names {missing}, which source"
                f" {flow.source!r} does not have (it has {source_columns}).",
                flow=flow.name,
                problem="missing_column",
            )
        return wanted
    excluded = {column_name(c).lower() for c in flow.except_column_list or ()}
    return [c for c in source_columns if c.lower() not in excluded]


def target_frame(source: DataFrame, flow: AutoCdcFlow) -> DataFrame:
    """``source`` shaped as the target table: the stored columns, plus ``__START_AT`` /
    ``__END_AT`` typed as ``sequence_by`` for SCD type 2 (no job runs)."""
    from pyspark.sql import functions as F

    keys = [column_name(k) for k in flow.keys]
    columns = stored_columns(source.columns, flow)
    missing = [k for k in keys if k not in columns]
    if missing:
        raise GraphValidationError(
            f"AUTO CDC flow {flow.name!r}: keys {missing} are not among the stored columns"
            f" {columns}; keys must be stored.",
            flow=flow.name,
            problem="missing_column",
        )
    shaped = source.select(*[F.col(f"`{c}`") for c in columns])
    if flow.stored_as_scd_type == 2:
        sequence_type = source.select(_expr(flow.sequence_by).alias("s")).schema["s"].dataType
        shaped = shaped.withColumn(START, F.lit(None).cast(sequence_type)).withColumn(
            END, F.lit(None).cast(sequence_type)
        )
    return shaped


class CdcBatches:
    """``foreachBatch`` of an AUTO CDC flow."""

    def __init__(
        self, spark: SparkSession, flow: AutoCdcFlow, target_path: str, state_path: str
    ) -> None:
        self._spark = spark
        self._flow = flow
        self._target = target_path
        self._state = state_path
        self._keys = [column_name(k) for k in flow.keys]
        self.rows = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel

        events = self._events(batch).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self.rows += events.count()
            if self._flow.stored_as_scd_type == 1:
                self._apply_scd1(events)
            else:
                self._apply_scd2(events)
        finally:
            events.unpersist()

    def _events(self, batch: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        flow = self._flow
        columns = stored_columns(list(batch.columns), flow)
        deletes = (
            _expr(flow.apply_as_deletes) if flow.apply_as_deletes is not None else F.lit(False)
        )
        truncates = (
            _expr(flow.apply_as_truncates) if flow.apply_as_truncates is not None else F.lit(False)
        )
        return batch.select(
            *[F.col(f"`{c}`") for c in columns],
            _expr(flow.sequence_by).alias(_SEQ),
            F.coalesce(deletes.cast("boolean"), F.lit(False)).alias(_DELETE),
            F.coalesce(truncates.cast("boolean"), F.lit(False)).alias(_TRUNCATE),
        ).filter(F.col(_SEQ).isNotNull())

    # ---- SCD type 1 ---------------------------------------------------------------------

    def _apply_scd1(self, events: DataFrame) -> None:
        from pyspark.sql import functions as F

        from deltaflow.spark.dml._delta_table import DeltaTable

        truncated_at = events.filter(F.col(_TRUNCATE)).agg(F.max(_SEQ)).collect()[0][0]
        if truncated_at is not None:
            DeltaTable.forPath(self._spark, self._target).delete()
            self._reset_state()
            events = events.filter(F.col(_SEQ) > F.lit(truncated_at))
        events = events.filter(~F.col(_TRUNCATE))
        latest = self._latest_per_key(events)
        state = self._state_frame()
        if state is not None:
            joined = latest.alias("e").join(state.alias("s"), self._keys, "left")
            latest = joined.filter(
                F.col(f"s.{_STATE_SEQ}").isNull() | (F.col(f"e.{_SEQ}") > F.col(f"s.{_STATE_SEQ}"))
            ).select("e.*")
        data = [c for c in latest.columns if c not in (_SEQ, _DELETE, _TRUNCATE)]
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self._keys)
        values = {
            c: (
                f"coalesce(s.`{c}`, t.`{c}`)"
                if self._flow.ignore_null_updates and c not in self._keys
                else f"s.`{c}`"
            )
            for c in data
        }
        (
            DeltaTable.forPath(self._spark, self._target)
            .alias("t")
            .merge(latest.alias("s"), condition)
            .whenMatchedDelete(condition=f"s.{_DELETE}")
            .whenMatchedUpdate(condition=f"NOT s.{_DELETE}", set=values)
            .whenNotMatchedInsert(
                condition=f"NOT s.{_DELETE}", values={c: f"s.`{c}`" for c in data}
            )
            .execute()
        )
        self._record_state(latest, exists=state is not None)

    def _latest_per_key(self, events: DataFrame) -> DataFrame:
        """One event per key: the newest; with ``ignore_null_updates``, a column that
        the newest event leaves NULL takes the newest non-NULL value of the batch."""
        from pyspark.sql import functions as F

        others = [c for c in events.columns if c not in self._keys]
        aggregates = []
        for c in others:
            if self._flow.ignore_null_updates and c not in (_SEQ, _DELETE, _TRUNCATE):
                ordered = F.when(F.col(f"`{c}`").isNotNull(), F.col(_SEQ))
                aggregates.append(F.max_by(F.col(f"`{c}`"), ordered).alias(c))
            else:
                aggregates.append(F.max_by(F.col(f"`{c}`"), F.col(_SEQ)).alias(c))
        return events.groupBy(*[F.col(f"`{k}`") for k in self._keys]).agg(*aggregates)

    def _state_frame(self) -> DataFrame | None:
        from deltaflow.table import _uri
        from deltaflow.table._snapshot import table_exists

        if not table_exists(_uri.normalize_uri(self._state)):
            return None
        return self._spark.read.format("delta").load(self._state)

    def _record_state(self, latest: DataFrame, *, exists: bool) -> None:
        from deltaflow.spark.dml._delta_table import DeltaTable

        state = latest.select(
            *[f"`{k}`" for k in self._keys],
            latest[_SEQ].alias(_STATE_SEQ),
            latest[_DELETE].alias(_STATE_DELETED),
        )
        if not exists:
            state.write.format("delta").mode("append").save(self._state)
            return
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self._keys)
        (
            DeltaTable.forPath(self._spark, self._state)
            .alias("t")
            .merge(state.alias("s"), condition)
            .whenMatchedUpdateAll(condition=f"s.{_STATE_SEQ} > t.{_STATE_SEQ}")
            .whenNotMatchedInsertAll()
            .execute()
        )

    def _reset_state(self) -> None:
        from deltaflow.spark.dml._delta_table import DeltaTable

        if self._state_frame() is not None:
            DeltaTable.forPath(self._spark, self._state).delete()

    # ---- SCD type 2 ---------------------------------------------------------------------

    def _apply_scd2(self, events: DataFrame) -> None:
        from pyspark.sql import functions as F

        from deltaflow.spark.dml._delta_table import DeltaTable

        target = self._spark.read.format("delta").load(self._target)
        data = [c for c in target.columns if c not in (START, END)]
        keys = [F.col(f"`{k}`") for k in self._keys]
        affected = events.select(*keys).distinct()
        existing = target.join(affected, self._keys, "left_semi")
        new_events = events.filter(~F.col(_TRUNCATE)).select(
            *[F.col(f"`{c}`") for c in data],
            F.col(_SEQ),
            F.col(_DELETE),
            F.lit(1).alias("__new"),
        )
        old_events = existing.select(
            *[F.col(f"`{c}`") for c in data],
            F.col(START).alias(_SEQ),
            F.lit(False).alias(_DELETE),
            F.lit(0).alias("__new"),
        )
        # An old version closed with no successor ended with a delete at its END_AT.
        successors = existing.select(*keys, F.col(START).alias("__next"))
        closed = existing.filter(F.col(END).isNotNull()).alias("v")
        ended = closed.join(
            successors.alias("n"),
            [F.col(f"v.`{k}`").eqNullSafe(F.col(f"n.`{k}`")) for k in self._keys]
            + [F.col(f"v.{END}") == F.col("n.__next")],
            "left_anti",
        ).select(
            *[F.col(f"v.`{c}`") for c in data],
            F.col(f"v.{END}").alias(_SEQ),
            F.lit(True).alias(_DELETE),
            F.lit(0).alias("__new"),
        )
        timeline = new_events.unionByName(old_events).unionByName(ended)
        builder = _HistoryBuilder(self._flow, data, self._keys)

        def history_of(table):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
            # No annotations on purpose: Spark's default grouped-map Arrow UDF (a
            # pyarrow.Table in and out); pyspark fails to infer it from a callable object.
            return builder(table)

        history = timeline.groupBy(*keys).applyInArrow(history_of, schema=target.schema)
        # The difference against what is stored, matched on (key, __START_AT).
        old = existing.select(*keys, F.col(START).alias("__old_start"), F.lit(True).alias("__old"))
        on = [history[f"`{k}`"].eqNullSafe(old[f"`{k}`"]) for k in self._keys] + [
            history[START] == old["__old_start"]
        ]
        gone = (
            old.join(history, on, "left_anti").withColumnRenamed("__old_start", START).drop("__old")
        )
        changes = history.withColumn("__op", F.lit("upsert")).unionByName(
            gone.withColumn("__op", F.lit("delete")), allowMissingColumns=True
        )
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self._keys)
        columns = {c: f"s.`{c}`" for c in [*data, START, END]}
        (
            DeltaTable.forPath(self._spark, self._target)
            .alias("t")
            .merge(changes.alias("s"), f"{condition} AND t.{START} = s.{START}")
            .whenMatchedDelete(condition="s.__op = 'delete'")
            .whenMatchedUpdate(set=columns)
            .whenNotMatchedInsert(condition="s.__op = 'upsert'", values=columns)
            .execute()
        )


class _HistoryBuilder:
    """One key's events (stored versions and new events) in sequence order -> its
    versions: an upsert that changes a tracked column opens a version, one that changes
    only untracked columns updates the open version, a delete closes it."""

    def __init__(self, flow: AutoCdcFlow, data: list[str], keys: list[str]) -> None:
        self._data = data
        self._ignore_nulls = flow.ignore_null_updates
        non_keys = [c for c in data if c not in keys]
        if flow.track_history_column_list is not None:
            self._tracked = [column_name(c) for c in flow.track_history_column_list]
        elif flow.track_history_except_column_list is not None:
            skip = {column_name(c) for c in flow.track_history_except_column_list}
            self._tracked = [c for c in non_keys if c not in skip]
        else:
            self._tracked = non_keys

    def __call__(self, table: Any) -> Any:
        import pyarrow as pa

        rows = table.to_pylist()
        # Same sequence twice (a replayed batch): the stored version and the event are
        # the same change; keep one, preferring the event.
        by_seq: dict[Any, dict[str, Any]] = {}
        for row in sorted(rows, key=lambda r: r["__new"]):
            by_seq[(row[_SEQ], row[_DELETE])] = row
        ordered = sorted(by_seq.values(), key=lambda r: (r[_SEQ], r[_DELETE]))
        versions: list[dict[str, Any]] = []
        current: dict[str, Any] | None = None
        for event in ordered:
            if event[_DELETE]:
                if current is not None:
                    current[END] = event[_SEQ]
                    current = None
                continue
            values = {c: event[c] for c in self._data}
            if self._ignore_nulls and current is not None:
                values = {c: (current[c] if v is None else v) for c, v in values.items()}
            if current is not None and all(values[c] == current[c] for c in self._tracked):
                current.update(values)  # untracked change: the open version, in place
                continue
            if current is not None:
                current[END] = event[_SEQ]
            current = {**values, START: event[_SEQ], END: None}
            versions.append(current)
        events = table.schema
        sequence = events.field(_SEQ).type
        schema = pa.schema(
            [events.field(c) for c in self._data]
            + [pa.field(START, sequence), pa.field(END, sequence)]
        )
        return pa.Table.from_pylist(versions, schema=schema)


def describe(flow: AutoCdcFlow) -> dict[str, Any]:
    """The flow's settings for the event log's ``flow_definition``."""
    return {
        "keys": [column_name(k) for k in flow.keys],
        "sequence_by": column_name(flow.sequence_by),
        "stored_as_scd_type": flow.stored_as_scd_type,
        "ignore_null_updates": flow.ignore_null_updates,
    }
