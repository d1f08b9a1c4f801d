"""Refreshing a materialized view from its source's change data feed, when it can be.

Each refresh is planned (:meth:`ViewRefresh.plan`) and the plan recorded in the event
log as a ``planning_information`` event, as Lakeflow does:

- ``NO_OP``: the source has not changed since the view's last refresh; nothing is written.
- ``ROW_BASED`` (projections and filters): the changed source rows (inserts, deletes,
  update pre- and post-images) are put through the view's query; the view's rows equal
  to any of them are replaced by their new number of copies.
- ``GROUP_AGGREGATE`` (one GROUP BY on top): the groups the changed rows fall in (before
  and after the change) are recomputed from the source, and replace those groups' rows;
  a group left with no rows disappears. Any deterministic aggregate works (count, sum,
  avg, min, max, count distinct...), since whole groups are recomputed.
  Decomposable aggregates are folded from the change rows instead (:mod:`._mv_fold`),
  on the driver with Arrow when keys and inputs are plain source columns
  (:mod:`._mv_arrow`: no Spark job, the one technique on by default).
- ``COMPLETE_RECOMPUTE``: the query again over the whole source, one overwrite, as before.
  Chosen when the shape does not allow anything else (:mod:`._mv_plan`), the view has
  expectations, there is no record of a previous refresh (first run, full refresh), the
  definition changed, the view was written by something else since, the source's
  change feed does not cover the versions since (not enabled, VACUUMed, log cleaned up),
  its schema changed, or the changes are large enough that recomputing is cheaper.

An incremental refresh is one commit into the view (an overwrite or a MERGE). The record
of what the view reflects (``<checkpoints>/<flow>/materialized_view.json``: the
definition's fingerprint, the source version, the view's version written) is replaced
after that commit. It names
the view version it belongs to, so a refresh killed between the commit and the record
is noticed (the view moved past the recorded version) and the next refresh recomputes
in full: never a change applied twice, never one missed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _checkpoint_files, _mv_arrow, _mv_changes, _mv_fold, _mv_plan
from deltaflow.pipelines._mv_plan import GROUP_AGGREGATE, ROW_BASED, Issue, QueryShape

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaflow.table._snapshot import Snapshot

NO_OP = "NO_OP"
COMPLETE_RECOMPUTE = "COMPLETE_RECOMPUTE"
TECHNIQUES = (COMPLETE_RECOMPUTE, NO_OP, ROW_BASED, GROUP_AGGREGATE)

# Above this share of the source's bytes in change files, a recompute is cheaper (Lakeflow's
# cost model rejects such plans as CHANGESET_SIZE_THRESHOLD_EXCEEDED too). The pipeline's
# configuration can move it (it is set on the session for the update) for every
# incremental technique; unset, each technique has its own default below.
MAX_CHANGE_FRACTION_KEY = "pipelines.incrementalRefresh.maxChangeFraction"
# The default for a decomposable GROUP BY over plain source columns folded on the driver
# (:mod:`._mv_arrow`): no Spark job, so it beat a recompute 2-9x at 1% changed (10M source
# rows, 100k groups; bench_mv_refresh.py, docs/benchmarks.md). Its work grows with the
# change rows and the view, a recompute's with the source: at 10% of the source's bytes
# in change files the fold still reads far less than the scan.
DRIVER_FOLD_CHANGE_FRACTION = 0.1
# The default for every other incremental technique (the Spark fold, the touched groups
# recomputed, ROW_BASED): 0, so a changed source is recomputed. Measured side by side,
# they were slower than a recompute even at a 1% change (0.2-0.8x): each pays the fixed
# cost of several Spark jobs, and recomputing touched groups still scans the source.
# An unchanged source is still a NO_OP (checked before this limit). Set the key to opt in.
MAX_CHANGE_FRACTION = "0"
# Set to false in the pipeline's configuration to fold with Spark instead of on the
# driver (the benchmark's comparison; a way out should the driver's memory be short).
FOLD_ON_DRIVER_KEY = "pipelines.incrementalRefresh.foldOnDriver"

# A view up to this size is rewritten whole by an incremental refresh (one overwrite,
# two Spark jobs); a larger one is MERGEd, whose fixed cost (several jobs) is then paid
# back by leaving the files without touched rows alone.
REWRITE_LIMIT_BYTES = 256 * 1024 * 1024

STATE_FILE = "materialized_view.json"
_OP = "__deltaflow_mv_op"  # in the MERGE source: 'delete' a key's rows, 'insert' a row
_COUNT = "__deltaflow_mv_count"


@dataclass
class Plan:
    """How one refresh runs, and why (the ``planning_information`` event's details)."""

    flow: str
    technique: str
    issues: list[Issue] = field(default_factory=list)
    shape: QueryShape | None = None
    previous_version: int | None = None  # of the source, as the view reflects it
    change_bytes: int | None = None
    folded: bool = False  # GROUP_AGGREGATE folded from the change rows (no source scan)
    on_driver: bool = False  # ... on the driver with Arrow (:mod:`._mv_arrow`), no Spark job
    recompute_on_driver: bool = False  # COMPLETE_RECOMPUTE by :func:`_mv_arrow.recompute`

    @property
    def incremental(self) -> bool:
        return self.technique in (ROW_BASED, GROUP_AGGREGATE)

    def message(self) -> str:
        text = f"Flow {self.flow!r} has been planned to be executed as {self.technique}"
        if self.issues:
            text += ": " + "; ".join(i.message for i in self.issues)
        return text + "."

    def _group_method(self) -> str:
        if not self.folded:
            return "RECOMPUTE_TOUCHED_GROUPS"
        return "FOLD_CHANGE_ROWS_ON_DRIVER" if self.on_driver else "FOLD_CHANGE_ROWS"

    def details(self, target: str) -> dict[str, Any]:
        options = [self.technique]
        if self.shape is not None and self.shape.technique not in (None, self.technique):
            options.append(self.shape.technique)
        # Only the cost model leaves the incremental technique applicable but not chosen.
        costed = [i.issue_type for i in self.issues] == ["INCREMENTAL_PLAN_REJECTED_BY_COST_MODEL"]
        techniques: list[dict[str, Any]] = []
        if self.issues:
            techniques.append({"incrementalization_issues": [i.to_json() for i in self.issues]})
        for name in options:
            techniques.append(
                {
                    "maintenance_type": f"MAINTENANCE_TYPE_{name}",
                    "is_chosen": name == self.technique,
                    "is_applicable": name == self.technique or costed,
                }
            )
        if self.shape is not None and self.shape.technique == GROUP_AGGREGATE:
            # deltaflow's own detail: how the touched groups get their new rows.
            techniques.append({"group_aggregate_method": self._group_method()})
        if self.recompute_on_driver:
            # ... and how a recompute runs when it need not be a Spark job.
            techniques.append({"recompute_method": "RECOMPUTE_ON_DRIVER"})
        details: dict[str, Any] = {
            "technique_information": techniques,
            "target_table_information": {"table_name": target},
        }
        source = self.shape.source if self.shape is not None else None
        if source is not None:
            details["source_table_information"] = [
                {
                    "table_name": source.name,
                    "table_path": source.uri,
                    "table_version": source.version,
                    "previous_version": self.previous_version,
                    "change_size": self.change_bytes,
                }
            ]
        return details


class ViewRefresh:
    """One refresh of one materialized view: :meth:`plan`, then :meth:`apply` (an
    incremental plan) or the caller's recompute followed by :meth:`recomputed`."""

    def __init__(
        self,
        spark: SparkSession,
        flow: str,
        df: DataFrame,
        target_path: str,
        state_dir: str,
        *,
        has_expectations: bool,
    ) -> None:
        self._spark = spark
        self._flow = flow
        self._df = df
        self._target = _uri(target_path)
        self._state_dir = state_dir
        self._has_expectations = has_expectations
        self._plan: Plan | None = None
        self._plain_changes = False
        self._folding: _mv_fold.Folding | None = None
        self._driver: _mv_arrow.DriverFold | None = None
        # The view folds on the driver (a recompute there reads any source; _driver:
        # this refresh's fold, whose change rows _mv_arrow reads from plain tables only).
        self._arrow: _mv_arrow.DriverFold | None = None
        self._arrow_source: Snapshot | None = None
        self._view: Snapshot | None = None  # the view's table as planned (loaded once)

    # ---- planning --------------------------------------------------------------------

    def plan(self) -> Plan:
        plan = self._choose()
        if plan.technique == COMPLETE_RECOMPUTE:
            plan.recompute_on_driver = self._recompute_fits()
        self._plan = plan
        return plan

    def _choose(self) -> Plan:
        shape = _mv_plan.analyse(self._df)

        def complete(issue_type: str, message: str) -> Plan:
            return Plan(self._flow, COMPLETE_RECOMPUTE, [Issue(issue_type, message)], shape)

        if shape.issue is not None:
            return Plan(self._flow, COMPLETE_RECOMPUTE, [shape.issue], shape)
        assert shape.source is not None
        if self._has_expectations:
            return complete(
                "EXPECTATIONS_ON_TARGET",
                "the view has expectations, which are checked over the whole result",
            )
        # Helper columns only where a fold may be chosen: with incremental refresh off for
        # the view the table holds the query's columns alone.
        folding = _mv_fold.folding(shape, self._df.columns)
        if folding is not None and self._on_driver():
            self._arrow = _mv_arrow.driver_fold(shape, folding)
            if self._arrow is not None:
                self._arrow_source = _source_snapshot(shape)
                if _mv_arrow.readable(self._arrow_source):
                    self._driver = self._arrow
        if folding is not None and self._limit(self._driver is not None) > 0:
            self._folding = folding
        folded = self._folding is not None
        state = self._load_state()
        if state is None:
            return complete(
                "NO_PREVIOUS_REFRESH",
                "no previous refresh is recorded (the first refresh, or after a full refresh)",
            )
        if state.get("fingerprint") != shape.fingerprint or state.get("folded") != folded:
            return complete(
                "DEFINITION_CHANGED",
                "the view's definition changed (or whether it keeps fold helper columns)",
            )
        moved = _mv_changes.data_changed_since(self._target, int(state["target_version"]))
        if moved is not None:
            return complete(
                "TARGET_CHANGED",
                f"the view's table changed at version {moved}, after its last recorded refresh",
            )
        source, previous = shape.source, int(state["source_version"])
        plan = Plan(self._flow, NO_OP, [], shape, previous_version=previous, folded=folded)
        if source.version == previous:
            return plan
        if source.version < previous:
            return complete(
                "SOURCE_REPLACED",
                f"the source {source.name} is at version {source.version}, before version"
                f" {previous} that the view reflects",
            )
        problem = _mv_changes.change_feed_issue(source.uri, previous + 1, source.version)
        if isinstance(problem, Issue):
            plan.technique, plan.issues = COMPLETE_RECOMPUTE, [problem]
            return plan
        change_bytes, source_bytes, plain = problem
        plan.change_bytes = change_bytes
        self._plain_changes = plain
        if not (plain and self._driver_fold_fits(change_bytes)):
            self._driver = None
        plan.on_driver = folded and self._driver is not None
        limit = self._limit(plan.on_driver)
        if change_bytes > limit * max(source_bytes, 1):
            plan.technique = COMPLETE_RECOMPUTE
            reason = _over_limit(limit, change_bytes, source_bytes, self._configured())
            plan.issues = [Issue("INCREMENTAL_PLAN_REJECTED_BY_COST_MODEL", reason)]
            return plan
        assert shape.technique is not None
        plan.technique = shape.technique
        return plan

    def _configured(self) -> bool:
        return bool(self._spark.conf.get(MAX_CHANGE_FRACTION_KEY, None))

    def _on_driver(self) -> bool:
        return str(self._spark.conf.get(FOLD_ON_DRIVER_KEY, "true")).lower() != "false"

    def _driver_fold_fits(self, change_bytes: int) -> bool:
        """Whether the changes and the view are small enough to fold in memory, and the
        view's table one :mod:`._mv_arrow` writes."""
        if self._driver is None or change_bytes > _mv_arrow.DRIVER_LIMIT_BYTES:
            return False
        view = self._view_snapshot()
        if not _mv_arrow.readable(view):
            return False
        return sum(f.size for f in view.files(stats=False)) <= _mv_arrow.DRIVER_LIMIT_BYTES

    def _limit(self, on_driver: bool) -> float:
        """The largest share of the source's bytes in change files an incremental
        refresh is chosen for: the configured one, else the technique's default."""
        configured = self._spark.conf.get(MAX_CHANGE_FRACTION_KEY, None)
        if configured:
            return float(configured)
        return DRIVER_FOLD_CHANGE_FRACTION if on_driver else float(MAX_CHANGE_FRACTION)

    def _recompute_fits(self) -> bool:
        """Whether this complete recompute runs on the driver (:func:`_mv_arrow.recompute`):
        the view folds there, its source is small enough, and the view's table already
        has the columns a recompute writes (helper columns only where incremental
        refreshes may fold). A new or changed definition that adds, drops or retypes
        columns is recomputed by Spark, which replaces the table's schema."""
        if self._arrow is None or self._arrow_source is None:
            return False
        source_bytes = sum(f.size for f in self._arrow_source.files(stats=False))
        if source_bytes > _mv_arrow.RECOMPUTE_LIMIT_BYTES:
            return False
        view = self._view_snapshot()
        return _mv_arrow.readable(view) and _columns(view.schema) == self._recompute_columns()

    def _view_snapshot(self) -> Snapshot:
        if self._view is None:
            from deltaflow.table._snapshot import load_snapshot

            self._view = load_snapshot(self._target)
        return self._view

    def _recompute_columns(self) -> list[tuple[str, str]]:
        """(name, type) of each column a recompute writes: the query's, then the helper
        columns the view keeps besides them (as :func:`_mv_fold.recompute` orders them)."""
        query = _columns(json.loads(self._df.schema.json()))
        helpers = self._folding.extra_columns() if self._folding is not None else []
        return query + [(h, '"long"') for h in helpers]

    def recompute_on_driver(self) -> int | None:
        """A complete recompute planned on the driver: the view's rows written in one
        commit, their number; None when the driver stopped (a sum outside BIGINT) and
        the caller's Spark recompute decides (its overflow error, as for any recompute)."""
        from deltaflow.table._snapshot import check_reader_features

        plan = self._plan
        assert plan is not None and plan.recompute_on_driver
        assert self._arrow is not None and self._arrow_source is not None
        # Planned from the snapshots loaded then: the source at the version the plan
        # names (its features checked, as a read of it checks them), the view as read.
        check_reader_features(self._arrow_source)
        try:
            result = _mv_arrow.recompute(self._arrow, self._arrow_source, self._view_snapshot())
        except _mv_arrow.SumOutOfRange as exc:
            log.info("view %s: the driver recompute stopped (%s); using Spark", self._flow, exc)
            return None
        return result.rows

    def recompute_query(self) -> DataFrame:
        """What a complete recompute writes: the query, with the helper columns a
        folded view keeps (:mod:`._mv_fold`)."""
        plan = self._plan
        if self._folding is None or plan is None or plan.shape is None:
            return self._df
        return _mv_fold.recompute(self._spark, plan.shape, self._folding)

    # ---- applying --------------------------------------------------------------------

    def apply(self) -> int:
        """Run an incremental plan: one commit replacing the touched rows of the view
        (none when nothing in the view changes), then the record. The rows written."""
        plan = self._plan
        assert plan is not None and plan.incremental and plan.shape is not None
        shape, source = plan.shape, plan.shape.source
        assert source is not None and plan.previous_version is not None
        if plan.technique == GROUP_AGGREGATE and plan.on_driver and self._driver is not None:
            try:
                first = plan.previous_version + 1
                result = _mv_arrow.fold(
                    self._driver, source.uri, first, source.version, self._target
                )
            except _mv_arrow.SumOutOfRange as exc:
                # Spark's own sums decide: its error under ANSI, as a recompute would raise.
                log.info("view %s: the driver fold stopped (%s); folding in Spark", self._flow, exc)
            else:
                self._save_state(shape)
                return result.rows  # the view is rewritten whole
        if self._plain_changes:
            changes = _mv_changes.plain_change_rows(
                self._spark, source.uri, plan.previous_version + 1, source.version
            )
        else:
            changes = (
                self._spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", plan.previous_version + 1)
                .option("endingVersion", source.version)
                .load(source.uri)
            )
        if plan.technique == GROUP_AGGREGATE and self._folding is not None:
            folded = _mv_fold.deltas(self._spark, shape, self._folding, changes)
            folded = folded.localCheckpoint()  # the change rows read once
            if _mv_changes.table_bytes(self._target) > REWRITE_LIMIT_BYTES:
                _mv_fold.merge(self._spark, self._target, self._folding, folded)
            else:
                _mv_fold.rewrite(self._spark, self._target, self._folding, folded)
            self._save_state(shape)
            return folded.count()
        if plan.technique == GROUP_AGGREGATE:
            touched, rows = self._group_rows(shape, changes)
        else:
            touched, rows = self._row_rows(shape, changes)
        written = self._replace(shape.keys, touched, rows)
        self._save_state(shape)
        return written

    def recomputed(self) -> None:
        """After the caller's complete recompute: record it when the next refresh can
        build on it, forget any older record otherwise."""
        plan = self._plan
        assert plan is not None
        if plan.shape is not None and plan.shape.technique is not None:
            self._save_state(plan.shape)
        else:
            _checkpoint_files.remove(self._state_dir, STATE_FILE)

    def _group_rows(self, shape: QueryShape, changes: DataFrame) -> tuple[DataFrame, DataFrame]:
        """The keys of the groups the changes touch, and those groups' rows recomputed
        from the source (a semi join Spark pushes below the aggregate, so only their
        source rows are aggregated)."""
        from pyspark.sql import functions as F

        touched = _mv_plan.substitute(self._spark, shape, changes).select(*shape.keys).distinct()
        # Read the change feed once; new attribute ids, or the semi join below would
        # see one column on both sides (the substituted plan keeps the source's ids).
        touched = touched.select(*[F.col(f"`{c}`").alias(c) for c in shape.keys]).localCheckpoint()
        view = self._df.alias("v")
        # Broadcast: the touched keys are few next to the source, and a broadcast semi
        # join below the aggregate filters the scan without shuffling the source.
        keys = F.broadcast(touched).alias("k")
        on = [F.col(f"v.`{c}`").eqNullSafe(F.col(f"k.`{c}`")) for c in shape.keys]
        rows = (
            view.where(_key_ranges(touched, shape.keys))
            .join(keys, on, "left_semi")
            .select(*[F.col(f"v.`{c}`") for c in view.columns])
        )
        return touched, rows

    def _row_rows(self, shape: QueryShape, changes: DataFrame) -> tuple[DataFrame, DataFrame]:
        """The distinct view rows the changes touch, and each of them as many times as
        the view will hold it (its copies now plus the changes' inserts less their
        deletes)."""
        from pyspark.sql import functions as F

        cols = list(shape.keys)
        kind = F.col("_change_type")
        plus = _mv_plan.substitute(
            self._spark, shape, changes.where(kind.isin("insert", "update_postimage"))
        )
        minus = _mv_plan.substitute(
            self._spark, shape, changes.where(kind.isin("delete", "update_preimage"))
        )
        delta = (
            plus.withColumn(_COUNT, F.lit(1))
            .unionByName(minus.withColumn(_COUNT, F.lit(-1)))
            .groupBy(*cols)
            .agg(F.sum(_COUNT).alias(_COUNT))
            .where(F.col(_COUNT) != 0)
        ).localCheckpoint()
        current = (
            self._spark.read.format("delta")
            .load(self._target)
            .alias("v")
            .join(delta.alias("d"), _null_safe("v", "d", cols), "left_semi")
            .groupBy(*cols)
            .agg(F.count(F.lit(1)).alias(_COUNT))
        )
        counts = (
            delta.alias("d")
            .join(current.alias("c"), _null_safe("d", "c", cols), "left")
            .select(
                *[F.col(f"d.`{c}`").alias(c) for c in cols],
                (F.col(f"d.{_COUNT}") + F.coalesce(F.col(f"c.{_COUNT}"), F.lit(0))).alias(_COUNT),
            )
        )
        copies = counts.where(F.col(_COUNT) > 0).select(
            *cols, F.explode(F.sequence(F.lit(1), F.col(_COUNT).cast("int"))).alias(_COUNT)
        )
        return delta.select(*cols), copies.select(*cols)

    def _replace(self, keys: tuple[str, ...], touched: DataFrame, rows: DataFrame) -> int:
        """The view's rows whose ``keys`` are in ``touched`` replaced by ``rows``, in one
        commit: a small view is rewritten whole (one overwrite), a large one MERGEd
        (only its files holding touched rows rewritten, at a MERGE's fixed cost)."""
        from pyspark.sql import functions as F

        rows = rows.localCheckpoint()  # computed once, counted cheaply
        written = rows.count()
        if _mv_changes.table_bytes(self._target) > REWRITE_LIMIT_BYTES:
            source = _deletes(touched, self._df).unionByName(rows.withColumn(_OP, F.lit("insert")))
            self._merge(keys, source)
            return written
        view = self._spark.read.format("delta").load(self._target)
        kept = view.alias("v").join(
            F.broadcast(touched).alias("k"), _null_safe("v", "k", list(keys)), "left_anti"
        )
        # Materialized before the overwrite: the new view is read from the old one.
        new = kept.unionByName(rows.select(*view.columns)).localCheckpoint()
        new.write.format("delta").mode("overwrite").save(self._target)
        return written

    def _merge(self, keys: tuple[str, ...], source: DataFrame) -> None:
        from deltaflow.tables import DeltaTable

        condition = " AND ".join(f"t.`{c}` <=> s.`{c}`" for c in keys)
        values = {f"`{c}`": f"s.`{c}`" for c in self._df.columns}
        (
            DeltaTable.forPath(self._spark, self._target)
            .alias("t")
            .merge(source.alias("s"), f"{condition} AND s.`{_OP}` = 'delete'")
            .whenMatchedDelete()
            .whenNotMatchedInsert(condition=f"s.`{_OP}` = 'insert'", values=values)
            .run()
        )

    # ---- the record ------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any] | None:
        text = _checkpoint_files.read_text(self._state_dir, STATE_FILE)
        try:
            state: dict[str, Any] = json.loads(text) if text is not None else {}
        except ValueError:
            return None
        # Format 3 records whether the view holds fold helper columns (and keeps none a
        # view column equals); an older record is not trusted: the view is recomputed once.
        return state if state.get("format") == 3 else None

    def _save_state(self, shape: QueryShape) -> None:
        assert shape.source is not None
        state = {
            "format": 3,
            "fingerprint": shape.fingerprint,
            "folded": self._folding is not None,
            "source_uri": shape.source.uri,
            "source_version": shape.source.version,
            "target_version": _mv_changes.latest_version(self._target),
        }
        _checkpoint_files.write_text(self._state_dir, STATE_FILE, json.dumps(state))


def _deletes(keys: DataFrame, view: DataFrame) -> DataFrame:
    """'delete' rows for ``keys``, with the view's columns (NULL where not a key)."""
    from pyspark.sql import functions as F

    present = set(keys.columns)
    return keys.select(
        *[
            F.col(f"`{f.name}`")
            if f.name in present
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in view.schema.fields
        ],
        F.lit("delete").alias(_OP),
    )


def _key_ranges(touched: DataFrame, keys: tuple[str, ...]) -> Any:
    """A predicate true for every touched key: each orderable key column between the
    touched keys' smallest and largest value (or NULL). Spark pushes it below the
    aggregate into the source's scan, whose file statistics then skip the files that
    cannot hold a touched group (the semi join keeps the result exact)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        BooleanType,
        DateType,
        NumericType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )

    orderable = (NumericType, StringType, DateType, TimestampType, TimestampNTZType, BooleanType)
    columns = [f.name for f in touched.schema.fields if isinstance(f.dataType, orderable)]
    predicate = F.lit(True)
    if not columns:
        return predicate
    bounds = touched.agg(
        *[F.min(c).alias(f"lo{i}") for i, c in enumerate(columns)],
        *[F.max(c).alias(f"hi{i}") for i, c in enumerate(columns)],
    ).first()
    assert bounds is not None
    for i, name in enumerate(columns):
        low, high = bounds[f"lo{i}"], bounds[f"hi{i}"]
        column = F.col(f"`{name}`")
        if low is None:  # only NULL keys were touched in this column
            predicate = predicate & column.isNull()
        else:
            predicate = predicate & (column.between(low, high) | column.isNull())
    return predicate


def _null_safe(left: str, right: str, cols: list[str]) -> Any:
    from pyspark.sql import functions as F

    condition = None
    for c in cols:
        term = F.col(f"{left}.`{c}`").eqNullSafe(F.col(f"{right}.`{c}`"))
        condition = term if condition is None else condition & term
    return condition


def _over_limit(limit: float, change_bytes: int, source_bytes: int, configured: bool) -> str:
    """The cost model's reason for recomputing."""
    if limit > 0:
        return (
            f"the changes ({change_bytes} bytes) are over {limit:.0%} of the source"
            f" ({source_bytes} bytes): CHANGESET_SIZE_THRESHOLD_EXCEEDED"
        )
    if configured:
        return f"incremental refresh is off ({MAX_CHANGE_FRACTION_KEY} is 0)"
    return (
        f"this refresh is incremental only when opted in ({MAX_CHANGE_FRACTION_KEY} is"
        " unset: by default only a fold over plain columns on the driver runs, the one"
        " technique that beat a recompute in the measured cases); set it, e.g. to 0.25, in"
        " the pipeline's configuration to refresh from the change data feed"
    )


def _columns(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """A Spark or Delta schema's (JSON, one vocabulary) columns as (name, type JSON)."""
    return [(f["name"], json.dumps(f["type"], sort_keys=True)) for f in schema["fields"]]


def _source_snapshot(shape: QueryShape) -> Any:
    from deltaflow.table._snapshot import load_snapshot

    assert shape.source is not None
    return load_snapshot(shape.source.uri, version=shape.source.version, check_readable=False)


def _uri(path: str) -> str:
    from deltaflow.table import _uri as uris

    return uris.normalize_uri(path)
