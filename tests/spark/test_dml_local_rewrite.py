"""The one-job route for small DELETE and UPDATE: the same results as the two Spark jobs.

Each statement runs on two copies of one table, once per route (chosen by the session
conf ``spark.deltaflow.dml.localRewriteMaxBytes``: the default takes the one-job route on
these small tables, 0 the two-job route), through SQL (the connector's DML command, as
on every host) and through ``DeltaTable``; the tables, their history entries (operation,
parameters, delta-spark's metric names) and change-data rows are compared. Which route
ran is read from the number of Spark jobs the statement started.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pyspark.sql import functions as F

from deltaflow import DeltaTable
from deltaflow.spark.dml import _local_rewrite
from deltaflow.table.errors import ConstraintViolationError
from tests.spark._rows import sorted_tuples, version_changes

COLUMNS = ("id", "kind", "value", "note", "twice")
ROWS = [(i, "ab"[i % 2], i * 10 if i % 3 else None, f"n{i}") for i in range(12)]
# Row counts and removed files agree; how many data and change files a rewrite adds is each
# writer's own (one per partition here, one per task and partition there).
METRICS = {
    "DELETE": ("numDeletedRows", "numCopiedRows", "numRemovedFiles"),
    "UPDATE": ("numUpdatedRows", "numCopiedRows", "numRemovedFiles"),
}


def _make(spark: Any, path: str, *, cdf: bool = True) -> str:
    """12 rows in 2 files per partition (``kind``), a generated column and a CHECK."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, kind STRING, value INT, note STRING,"
        " twice BIGINT GENERATED ALWAYS AS (value * 2)) USING delta PARTITIONED BY (kind)"
        f" TBLPROPERTIES ('delta.enableChangeDataFeed' = '{str(cdf).lower()}')"
    ).collect()
    for part in (ROWS[:6], ROWS[6:]):
        values = ", ".join(
            f"({i}, '{k}', {'NULL' if v is None else v}, '{n}')" for i, k, v, n in part
        )
        spark.sql(f"INSERT INTO delta.`{path}` (id, kind, value, note) VALUES {values}").collect()
    spark.sql(
        f"ALTER TABLE delta.`{path}` ADD CONSTRAINT small CHECK (value IS NULL OR value < 1000)"
    ).collect()
    return path


@contextmanager
def _route(spark: Any, one_job: bool) -> Iterator[None]:
    spark.conf.set(_local_rewrite.MAX_BYTES_CONF, str(_local_rewrite.DEFAULT_MAX_BYTES * one_job))
    try:
        yield
    finally:
        spark.conf.unset(_local_rewrite.MAX_BYTES_CONF)


def _jobs_started(spark: Any) -> int:
    """Spark jobs the session's context has started so far (its next job id)."""
    counter = spark.sparkContext._jsc.sc().dagScheduler().nextJobId()
    return int(counter if isinstance(counter, int) else counter.get())


def _rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted_tuples(spark.read.format("delta").load(path))


def _changes(spark: Any, path: str, version: int) -> list[tuple[Any, ...]]:
    changes = version_changes(spark, path, version)
    return sorted_tuples(changes.drop("_commit_version", "_commit_timestamp"))


Statement = Callable[[Any, str], Any]  # (session, table path) -> runs one DELETE / UPDATE


def _sql(text: str) -> Statement:
    return lambda spark, path: spark.sql(text.replace("{t}", f"delta.`{path}`")).collect()


CASES: dict[str, tuple[str, Statement]] = {
    "sql-update-one-row": ("UPDATE", _sql("UPDATE {t} SET note = 'one' WHERE id = 7")),
    "sql-update-alias": (
        "UPDATE",
        _sql("UPDATE {t} AS x SET x.value = 5, note = kind WHERE x.value IS NULL OR id IN (1, 2)"),
    ),
    "sql-update-partition-column": ("UPDATE", _sql("UPDATE {t} SET kind = 'c' WHERE id < 3")),
    "sql-update-cast-and-function": (
        "UPDATE",
        _sql("UPDATE {t} SET value = value * 2.5, note = upper(note) WHERE id % 4 = 1"),
    ),
    "sql-delete": ("DELETE", _sql("DELETE FROM {t} WHERE kind = 'a' AND value > 40")),
    "sql-delete-whole-files": ("DELETE", _sql("DELETE FROM {t} WHERE kind = 'b'")),
    "sql-delete-null-condition": ("DELETE", _sql("DELETE FROM {t} WHERE value > 30")),
    "sql-delete-nothing": ("DELETE", _sql("DELETE FROM {t} WHERE id = 1000")),
    "api-update": (
        "UPDATE",
        lambda spark, path: DeltaTable.forPath(spark, path).update(
            "note <> 'n3' AND id < 5", {"value": "-1"}
        ),
    ),
    "api-update-all": (
        "UPDATE",
        lambda spark, path: DeltaTable.forPath(spark, path).update(set={"note": "'all'"}),
    ),
    "api-delete-column": (
        "DELETE",
        lambda spark, path: DeltaTable.forPath(spark, path).delete(F.col("id") == 4),
    ),
}


# Every case on a change-feed table (change files are the harder half); these without too.
WITHOUT_CDF = ("sql-update-one-row", "sql-delete", "sql-delete-whole-files", "api-delete-column")


@pytest.mark.parametrize(
    ("case", "cdf"),
    [(c, True) for c in CASES] + [(c, False) for c in WITHOUT_CDF],
    ids=[*CASES, *(f"{c}-no-cdf" for c in WITHOUT_CDF)],
)
def test_both_routes_give_the_same_table_history_and_changes(spark, table_path, case, cdf):
    operation, statement = CASES[case]
    one_job, two_jobs = _make(spark, table_path(), cdf=cdf), table_path()
    shutil.copytree(one_job, two_jobs)
    start = DeltaTable.forPath(spark, one_job).history(1).collect()[0]["version"]
    results, jobs = {}, {}
    for path, on in ((one_job, True), (two_jobs, False)):
        before = _jobs_started(spark)
        with _route(spark, on):
            statement(spark, path)
        jobs[on] = _jobs_started(spark) - before
        entry = DeltaTable.forPath(spark, path).history(1).collect()[0]
        committed = entry["version"] > start
        results[on] = (
            _rows(spark, path),
            committed,
            _changes(spark, path, entry["version"]) if committed and cdf else None,
            entry["operation"] if committed else None,
            entry["operationParameters"] if committed else None,
            {k: entry["operationMetrics"][k] for k in METRICS[operation]} if committed else None,
        )
    assert results[True] == results[False]
    if case == "sql-delete-nothing":
        assert not results[True][1]
        return
    assert results[True][3] == operation
    # One job, where the two-job route needs a second to rewrite files (a DELETE of whole
    # files rewrites none; with the change feed it does, when it also rewrites a part).
    rewrote = operation == "UPDATE" or results[True][5]["numCopiedRows"] != "0"
    assert jobs[True] == 1 and jobs[False] == (2 if rewrote else 1), jobs
    if cdf:
        assert results[True][2]  # committed, with change rows


def test_a_check_violation_fails_both_routes_the_same_way_and_commits_nothing(spark, table_path):
    path = _make(spark, table_path())
    version = DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]
    before = _rows(spark, path)
    messages = []
    for on in (True, False):
        with _route(spark, on), pytest.raises(ConstraintViolationError) as caught:
            spark.sql(f"UPDATE delta.`{path}` SET value = 5000 WHERE id = 4").collect()
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "small" in messages[0]
    assert DeltaTable.forPath(spark, path).history(1).collect()[0]["version"] == version
    assert _rows(spark, path) == before


def test_a_table_over_the_size_bound_takes_two_jobs(spark, table_path):
    path = _make(spark, table_path(), cdf=False)
    spark.conf.set(_local_rewrite.MAX_BYTES_CONF, "1")
    try:
        before = _jobs_started(spark)
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3").collect()
        assert _jobs_started(spark) - before >= 2
    finally:
        spark.conf.unset(_local_rewrite.MAX_BYTES_CONF)
    assert (3,) not in {r[:1] for r in _rows(spark, path)}


def test_a_bad_bound_is_a_typed_error_naming_the_conf(spark, table_path):
    from deltaflow.errors import InvalidOptionError

    path = _make(spark, table_path(), cdf=False)
    spark.conf.set(_local_rewrite.MAX_BYTES_CONF, "lots")
    try:
        with pytest.raises(InvalidOptionError, match="localRewriteMaxBytes"):
            DeltaTable.forPath(spark, path).delete("id = 3")
    finally:
        spark.conf.unset(_local_rewrite.MAX_BYTES_CONF)


def test_a_variant_table_keeps_two_jobs_and_its_nulls(spark, table_path):
    """pyspark's toArrow() cannot cast a NULL VARIANT (its Arrow children are non-nullable),
    so a VARIANT table keeps the two-job route, whose writer is Spark's."""
    path = table_path()
    t = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {t} (id INT, v VARIANT) USING delta").collect()
    spark.sql(
        f"INSERT INTO {t} VALUES (1, parse_json('{{\"a\": 1}}')), (2, parse_json('\"s\"')),"
        " (3, NULL)"
    ).collect()
    before = _jobs_started(spark)
    spark.sql(f"DELETE FROM {t} WHERE id = 2").collect()
    assert _jobs_started(spark) - before == 2
    rows = spark.sql(f"SELECT id, to_json(v) FROM {t} ORDER BY id").collect()
    assert [tuple(r) for r in rows] == [(1, '{"a":1}'), (3, None)]
