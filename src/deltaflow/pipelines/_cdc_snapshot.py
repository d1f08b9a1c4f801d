"""AUTO CDC from snapshots: each new snapshot of a source compared with the target.

``source`` is a table (read whole; its Delta version is the snapshot's version, and a
version already applied is skipped) or a function ``next(last_version) -> (DataFrame,
version) | None``, called until it returns None, each snapshot applied in turn. The
changes between the target and a snapshot are found by key:

* **SCD type 1**: one MERGE — keys only in the snapshot are inserted, keys whose values
  differ are updated, keys missing from the snapshot are deleted.
* **SCD type 2**: one MERGE — a changed or new key gets a version opened at the
  snapshot's version (``__START_AT``) and its current version closed there
  (``__END_AT``); a key missing from the snapshot has its current version closed.
  ``track_history_*`` choose which columns open a version; other changes update the
  current version in place.

The last version applied is recorded in the flow's checkpoint directory after the
MERGE commits; a crash in between re-applies the same snapshot, which finds no change.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _checkpoint_files
from deltaflow.pipelines._cdc import END, START, column_name
from deltaflow.pipelines._declarations import AutoCdcSnapshotFlow
from deltaflow.pipelines.errors import GraphValidationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_VERSION_FILE = "snapshot-version.json"


def target_frame(snapshot: DataFrame, flow: AutoCdcSnapshotFlow) -> DataFrame:
    """The target's shape: the snapshot's columns, plus ``__START_AT`` / ``__END_AT``
    (BIGINT: snapshot versions) for SCD type 2."""
    from pyspark.sql import functions as F

    keys = [column_name(k) for k in flow.keys]
    missing = [k for k in keys if k not in snapshot.columns]
    if missing:
        raise GraphValidationError(
            f"AUTO CDC from snapshot {flow.name!r}: keys {missing} are not columns of the"
            f" snapshot ({snapshot.columns}).",
            flow=flow.name,
            problem="missing_column",
        )
    if flow.stored_as_scd_type == 1:
        return snapshot
    return snapshot.withColumn(START, F.lit(None).cast("bigint")).withColumn(
        END, F.lit(None).cast("bigint")
    )


class SnapshotApplier:
    """Applies the snapshots not applied yet to the target (one update's work)."""

    def __init__(
        self, spark: SparkSession, flow: AutoCdcSnapshotFlow, target: str, checkpoint: str
    ) -> None:
        self._spark = spark
        self._flow = flow
        self._target = target
        self._checkpoint = checkpoint
        self._keys = [column_name(k) for k in flow.keys]

    def run(self) -> int:
        """Apply every new snapshot; the number of snapshots applied."""
        applied = 0
        last = self._last_version()
        while True:
            found = self._next(last)
            if found is None:
                return applied
            snapshot, version = found
            self._apply(snapshot, int(version))
            self._record(int(version))
            last = int(version)
            applied += 1

    def _next(self, last: int | None) -> tuple[DataFrame, int] | None:
        source = self._flow.source
        if callable(source):
            found = source(last)
            if found is None:
                return None
            snapshot, version = found
            if last is not None and int(version) <= last:
                raise GraphValidationError(
                    f"AUTO CDC from snapshot {self._flow.name!r}: the snapshot function"
                    f" returned version {version} after {last}; versions must increase.",
                    flow=self._flow.name,
                    problem="snapshot_version",
                )
            return snapshot, int(version)
        from deltaflow.table._snapshot import load_snapshot

        location = self._spark.sql(f"DESCRIBE DETAIL {source}").collect()[0]["location"]
        version = load_snapshot(location).version
        if last is not None and version <= last:
            return None
        reader = self._spark.read.format("delta").option("versionAsOf", version)
        return reader.load(location), version

    def _apply(self, snapshot: DataFrame, version: int) -> None:
        if self._flow.stored_as_scd_type == 1:
            self._apply_scd1(snapshot)
        else:
            self._apply_scd2(snapshot, version)

    def _on(self) -> str:
        return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self._keys)

    def _apply_scd1(self, snapshot: DataFrame) -> None:
        from deltaflow.spark.dml._delta_table import DeltaTable

        data = [c for c in snapshot.columns if c not in self._keys]
        changed = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in data) or "false"
        (
            DeltaTable.forPath(self._spark, self._target)
            .alias("t")
            .merge(snapshot.alias("s"), self._on())
            .whenMatchedUpdate(condition=changed, set={c: f"s.`{c}`" for c in data})
            .whenNotMatchedInsert(values={c: f"s.`{c}`" for c in snapshot.columns})
            .whenNotMatchedBySourceDelete()
            .execute()
        )

    def _tracked(self, data: list[str]) -> list[str]:
        flow = self._flow
        if flow.track_history_column_list is not None:
            return [column_name(c) for c in flow.track_history_column_list]
        if flow.track_history_except_column_list is not None:
            skip = {column_name(c) for c in flow.track_history_except_column_list}
            return [c for c in data if c not in skip]
        return data

    def _apply_scd2(self, snapshot: DataFrame, version: int) -> None:
        """One MERGE whose source rows are tagged: ``close`` (a changed key, or a key gone
        from the snapshot: its current version ends at ``version``), ``open`` (the new
        version of a new or changed key: never matches, inserted), ``touch`` (tracked
        columns unchanged: untracked ones updated in the current version)."""
        from pyspark.sql import functions as F

        from deltaflow.spark.dml._delta_table import DeltaTable

        columns = snapshot.columns
        data = [c for c in columns if c not in self._keys]
        tracked = self._tracked(data)
        untracked = [c for c in data if c not in tracked]
        current = self._spark.read.format("delta").load(self._target).filter(F.col(END).isNull())
        joined = snapshot.alias("s").join(
            current.alias("t"),
            [F.col(f"s.`{k}`").eqNullSafe(F.col(f"t.`{k}`")) for k in self._keys],
            "left",
        )
        differs = F.lit(False)
        for c in tracked:
            differs = differs | ~F.col(f"s.`{c}`").eqNullSafe(F.col(f"t.`{c}`"))
        snapshot_columns = [F.col(f"s.`{c}`") for c in columns]
        opened = joined.filter(F.col(f"t.{START}").isNull() | differs).select(*snapshot_columns)
        kept = joined.filter(F.col(f"t.{START}").isNotNull() & ~differs).select(*snapshot_columns)
        gone = current.join(snapshot.select(*self._keys), self._keys, "left_anti").select(
            *[F.col(f"`{c}`") for c in columns]
        )
        tagged = (
            opened.withColumn("__op", F.lit("close"))
            .unionByName(gone.withColumn("__op", F.lit("close")))
            .unionByName(opened.withColumn("__op", F.lit("open")))
            .unionByName(kept.withColumn("__op", F.lit("touch")))
        )
        values = {c: f"s.`{c}`" for c in columns}
        values.update({START: str(version), END: "CAST(NULL AS BIGINT)"})
        builder = (
            DeltaTable.forPath(self._spark, self._target)
            .alias("t")
            .merge(tagged.alias("s"), f"s.__op <> 'open' AND {self._on()} AND t.{END} IS NULL")
            .whenMatchedUpdate(condition="s.__op = 'close'", set={END: str(version)})
        )
        if untracked:
            touch = {c: f"s.`{c}`" for c in untracked}
            builder = builder.whenMatchedUpdate(condition="s.__op = 'touch'", set=touch)
        builder.whenNotMatchedInsert(condition="s.__op = 'open'", values=values).execute()

    def _last_version(self) -> int | None:
        text = _checkpoint_files.read_text(self._checkpoint, _VERSION_FILE)
        return None if text is None else int(json.loads(text)["version"])

    def _record(self, version: int) -> None:
        _checkpoint_files.write_text(
            self._checkpoint, _VERSION_FILE, json.dumps({"version": version})
        )


def first_snapshot(flow: AutoCdcSnapshotFlow, read: Any) -> DataFrame:
    """The snapshot the analysis shapes the target from: the table, or the function's
    first snapshot."""
    if isinstance(flow.source, str):
        return read(flow.source)  # type: ignore[no-any-return]
    found = flow.source(None)
    if found is None:
        raise GraphValidationError(
            f"AUTO CDC from snapshot {flow.name!r}: the snapshot function returned None for"
            " the first snapshot, so the target's schema is unknown. Return the first"
            " (DataFrame, version) when called with None.",
            flow=flow.name,
            problem="no_snapshot",
        )
    return found[0]  # type: ignore[no-any-return]
