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
    from pyspark.sql.types import DataType

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
        # Once the target was seen holding rows, later batches skip the log load that
        # asks (only a truncate empties it again).
        self._filled = False

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
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from deltaflow.spark.dml._delta_table import DeltaTable

        if self._flow.apply_as_truncates is not None:  # else no job looks for truncates
            truncated_at = events.filter(F.col(_TRUNCATE)).agg(F.max(_SEQ)).collect()[0][0]
            if truncated_at is not None:
                DeltaTable.forPath(self._spark, self._target).delete()
                self._filled = False
                self._reset_state()
                events = events.filter(F.col(_SEQ) > F.lit(truncated_at))
            events = events.filter(~F.col(_TRUNCATE))
        latest = self._latest_per_key(events)
        state = self._state_frame()
        if state is not None:
            # The sequence guard: a key's event applies only when it is newer than what
            # the key last saw (an upsert or a tombstone).
            joined = latest.alias("e").join(state.alias("s"), self._keys, "left")
            latest = joined.filter(
                F.col(f"s.{_STATE_SEQ}").isNull() | (F.col(f"e.{_SEQ}") > F.col(f"s.{_STATE_SEQ}"))
            ).select("e.*")
        # Both writes read the guarded events: reduced and joined once, not twice.
        latest = latest.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            if self._target_is_empty():
                # The first load (or the first after a truncate): nothing to match, so an
                # append, not a MERGE (a replay after a crash finds rows and MERGEs).
                data = [c for c in latest.columns if c not in (_SEQ, _DELETE, _TRUNCATE)]
                self._append(latest.filter(~F.col(_DELETE)).select(*[f"`{c}`" for c in data]))
            else:
                self._merge_scd1(latest)
            self._record_state(latest, exists=state is not None)
        finally:
            latest.unpersist()

    def _merge_scd1(self, latest: DataFrame) -> None:
        from deltaflow.spark.dml._delta_table import DeltaTable

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

    def _target_is_empty(self) -> bool:
        """No live file in the target: nothing an event could match."""
        from deltalake import DeltaTable as DeltaRsTable

        from deltaflow.table import _uri

        if not self._filled:
            location = _uri.delta_rs_uri(_uri.normalize_uri(self._target))
            self._filled = bool(DeltaRsTable(location).file_uris())
        return not self._filled

    def _append(self, rows: DataFrame) -> None:
        rows.write.format("delta").mode("append").save(self._target)

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
        from pyspark import StorageLevel

        target = self._spark.read.format("delta").load(self._target)
        data = [c for c in target.columns if c not in (START, END)]
        if self._target_is_empty():
            # The first load: the events' history is all there is, appended (a replay
            # after a crash finds it stored and MERGEs nothing new).
            empty = target.limit(0)
            history = _history(self._timeline(events, empty, data), self._flow, data, self._keys)
            self._append(history.select(*[f"`{c}`" for c in [*data, START, END]]))
            return
        existing = target.join(
            events.select(*self._key_columns()).distinct(), self._keys, "left_semi"
        ).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._merge_scd2(events, existing, data)
        finally:
            existing.unpersist()

    def _merge_scd2(self, events: DataFrame, existing: DataFrame, data: list[str]) -> None:
        from deltaflow.spark.dml._delta_table import DeltaTable

        history = _history(self._timeline(events, existing, data), self._flow, data, self._keys)
        changes = self._changes(history, existing, data)
        # Every conjunct null-safe (``__START_AT`` is never NULL, so ``<=>`` means ``=``):
        # DataFusion hash-joins on IS NOT DISTINCT FROM keys only when no plain ``=``
        # sits beside them; mixed, the delta-rs route compared every target row with
        # every source row (1M x 300k: many minutes, where the hash join takes a second).
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in [*self._keys, START])
        columns = {c: f"s.`{c}`" for c in [*data, START, END]}
        (
            DeltaTable.forPath(self._spark, self._target)
            .alias("t")
            .merge(changes.alias("s"), condition)
            .whenMatchedDelete(condition="s.__op = 'delete'")
            .whenMatchedUpdate(set=columns)
            .whenNotMatchedInsert(condition="s.__op = 'upsert'", values=columns)
            .execute()
        )

    def _key_columns(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.col(f"`{k}`") for k in self._keys]

    def _timeline(self, events: DataFrame, existing: DataFrame, data: list[str]) -> DataFrame:
        """The affected keys' stored versions (each an upsert at its ``__START_AT``, and a
        delete at the ``__END_AT`` of a version closed with no successor) and the batch's
        events, one row per (key, sequence, is-delete)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        def shaped(frame: DataFrame, seq: Column, delete: Column, new: int) -> DataFrame:
            return frame.select(
                *[F.col(f"`{c}`") for c in data],
                seq.alias(_SEQ),
                delete.alias(_DELETE),
                F.lit(new).alias("__new"),
            )

        new_events = shaped(events.filter(~F.col(_TRUNCATE)), F.col(_SEQ), F.col(_DELETE), 1)
        versions = shaped(existing, F.col(START), F.lit(False), 0)
        successors = existing.select(*self._key_columns(), F.col(START).alias("__next"))
        closed = existing.filter(F.col(END).isNotNull()).alias("v")
        ended = closed.join(
            successors.alias("n"),
            [F.col(f"v.`{k}`").eqNullSafe(F.col(f"n.`{k}`")) for k in self._keys]
            + [F.col(f"v.{END}") == F.col("n.__next")],
            "left_anti",
        )
        deletes = shaped(ended, F.col(f"v.{END}"), F.lit(True), 0)
        timeline = new_events.unionByName(versions).unionByName(deletes)
        # Same sequence twice (a replayed batch): the stored version and the event are
        # the same change; keep one, preferring the event.
        same = Window.partitionBy(*self._key_columns(), F.col(_SEQ), F.col(_DELETE)).orderBy(
            F.col("__new").desc()
        )
        return (
            timeline.withColumn("__dup", F.row_number().over(same))
            .filter("__dup = 1")
            .drop("__dup", "__new")
        )

    def _changes(self, history: DataFrame, existing: DataFrame, data: list[str]) -> DataFrame:
        """What the MERGE writes: versions that are new or differ from the stored ones
        (``upsert``), stored versions the history no longer has (``delete``); matched on
        (key, ``__START_AT``). Versions already stored as they are stay out of the MERGE."""
        from pyspark.sql import functions as F

        on = [F.col(f"h.`{k}`").eqNullSafe(F.col(f"o.`{k}`")) for k in self._keys] + [
            F.col(f"h.{START}") == F.col(f"o.{START}")
        ]
        joined = history.alias("h").join(existing.alias("o"), on, "full_outer")
        stored = F.col(f"o.{START}").isNotNull()
        rebuilt = F.col(f"h.{START}").isNotNull()
        same = F.lit(True)
        for c in [*data, END]:
            same = same & _comparable(F.col(f"h.`{c}`"), existing.schema[c].dataType).eqNullSafe(
                _comparable(F.col(f"o.`{c}`"), existing.schema[c].dataType)
            )
        kept = joined.filter(~stored | ~rebuilt | ~same)
        return kept.select(
            *[
                F.when(rebuilt, F.col(f"h.`{c}`")).otherwise(F.col(f"o.`{c}`")).alias(c)
                for c in [*data, START, END]
            ],
            F.when(rebuilt, F.lit("upsert")).otherwise(F.lit("delete")).alias("__op"),
        )


def _history(timeline: DataFrame, flow: AutoCdcFlow, data: list[str], keys: list[str]) -> DataFrame:
    """Each key's versions from its timeline in sequence order, set-based (window
    functions over the affected keys, no per-key Python): an upsert that changes a
    tracked column (or follows a delete, or comes first) opens a version; one that
    changes only untracked columns updates the open version in place; a delete closes it.
    A version runs from its opening event's sequence to the next event that opens or
    closes one (``__END_AT``; NULL while it is current)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_key = [F.col(f"`{k}`") for k in keys]
    order = Window.partitionBy(*by_key).orderBy(F.col(_SEQ), F.col(_DELETE))
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    frame = timeline
    if flow.ignore_null_updates:
        # An upsert's NULL keeps the open version's value: the last non-NULL value since
        # the key's last delete (a delete starts over; the next version takes NULLs as is).
        frame = frame.withColumn("__segment", F.sum(F.col(_DELETE).cast("int")).over(running))
        segment = (
            Window.partitionBy(*by_key, F.col("__segment"))
            .orderBy(F.col(_SEQ), F.col(_DELETE))
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        upsert = ~F.col(_DELETE)
        frame = frame.select(
            *[
                F.col(f"`{c}`")
                if c in keys
                else F.last(F.when(upsert, F.col(f"`{c}`")), ignorenulls=True)
                .over(segment)
                .alias(c)
                for c in data
            ],
            F.col(_SEQ),
            F.col(_DELETE),
        )
    unchanged = F.lit(True)
    for c in _tracked(flow, data, keys):
        value = _comparable(F.col(f"`{c}`"), timeline.schema[c].dataType)
        unchanged = unchanged & value.eqNullSafe(F.lag(value).over(order))
    previous_delete = F.lag(F.col(_DELETE)).over(order)
    opens = ~F.col(_DELETE) & (previous_delete.isNull() | previous_delete | ~unchanged)
    frame = frame.withColumn("__opens", opens)
    frame = frame.withColumns(
        {
            START: F.last(F.when(F.col("__opens"), F.col(_SEQ)), ignorenulls=True).over(running),
            END: F.lead(F.col(_SEQ)).over(order),
            "__ends": F.lead(F.col(_DELETE) | F.col("__opens")).over(order),
        }
    )
    # The last upsert of each version holds its values; the event after it closes it.
    last = ~F.col(_DELETE) & (F.col("__ends").isNull() | F.col("__ends"))
    return frame.filter(last).select(
        *[F.col(f"`{c}`") for c in data],
        F.col(START),
        F.col(END),
    )


def _comparable(column: Column, data_type: DataType) -> Column:
    """``column`` in a form ``<=>`` accepts: Spark cannot compare maps, so a column that
    holds one is compared as its JSON text."""
    from pyspark.sql import functions as F

    if "map<" in data_type.simpleString():
        return F.to_json(F.struct(column))
    return column


def _tracked(flow: AutoCdcFlow, data: list[str], keys: list[str]) -> list[str]:
    """The columns whose change opens a new version (``track_history_*``)."""
    non_keys = [c for c in data if c not in keys]
    if flow.track_history_column_list is not None:
        return [column_name(c) for c in flow.track_history_column_list]
    if flow.track_history_except_column_list is not None:
        skip = {column_name(c) for c in flow.track_history_except_column_list}
        return [c for c in non_keys if c not in skip]
    return non_keys


def describe(flow: AutoCdcFlow) -> dict[str, Any]:
    """The flow's settings for the event log's ``flow_definition``."""
    return {
        "keys": [column_name(k) for k in flow.keys],
        "sequence_by": column_name(flow.sequence_by),
        "stored_as_scd_type": flow.stored_as_scd_type,
        "ignore_null_updates": flow.ignore_null_updates,
    }
