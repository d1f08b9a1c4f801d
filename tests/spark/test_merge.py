"""DeltaTable.merge: every case against a plain-Python MERGE of the same input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake
from pyspark.sql import functions as F

from deltaflow import ConcurrentWriteError, DeltaTable, InvalidOptionError, SchemaMismatchError
from deltaflow.spark.dml import _merge, _target_scan
from deltaflow.spark.errors import MultipleSourceRowMatchingTargetRowError
from deltaflow.table.errors import UnsupportedFeatureError

COLUMNS = ("id", "kind", "value", "note")
SCHEMA = "id long, kind string, value int, note string"
# Three writes -> files: kind=a (ids 0-3), kind=b (ids 4-7), then kind=a (ids 8-9).
BATCHES = (
    [(0, "a", 1, "x"), (1, "a", None, "y"), (2, "a", 7, None), (3, "a", 9, "x")],
    [(4, "b", 2, "x"), (5, "b", 8, "y"), (6, "b", None, "z"), (7, "b", 3, "x")],
    [(8, "a", 5, "q"), (9, "a", 6, "r")],
)
TARGET = [dict(zip(COLUMNS, r, strict=True)) for batch in BATCHES for r in batch]

Row = dict[str, Any]
# (kind, condition(t, s) -> bool | None, new row(t, s) | None for deletes)
Clause = tuple[str, Callable[[Row, Row], Any], Callable[[Row, Row], Row] | None]


def _make(path: str) -> str:
    for batch in BATCHES:
        table = pa.table(
            {
                "id": pa.array([r[0] for r in batch], pa.int64()),
                "kind": pa.array([r[1] for r in batch], pa.string()),
                "value": pa.array([r[2] for r in batch], pa.int32()),
                "note": pa.array([r[3] for r in batch], pa.string()),
            }
        )
        write_deltalake(path, table, mode="append", partition_by=["kind"])
    return path


def reference_merge(
    target: list[Row], source: list[Row], on: Callable[[Row, Row], Any], clauses: list[Clause]
) -> list[Row]:
    """MERGE by the book: first applicable clause wins; NULL (None) is not true."""
    out: list[Row] = []
    matched_sources: set[int] = set()
    for t in target:
        pairs = [(i, s) for i, s in enumerate(source) if on(t, s) is True]
        matched_sources.update(i for i, _ in pairs)
        if pairs:
            assert len(pairs) == 1, "the reference does not model multiple matches"
            s = pairs[0][1]
            kinds = ("matchedUpdate", "matchedDelete")
        else:
            s = {}
            kinds = ("bySourceUpdate", "bySourceDelete")
        row: Row | None = t
        for kind, condition, new in clauses:
            if kind in kinds and condition(t, s) is True:
                row = None if new is None else {**t, **new(t, s)}
                break
        if row is not None:
            out.append(row)
    for i, s in enumerate(source):
        if i in matched_sources:
            continue
        for kind, condition, new in clauses:
            if kind == "insert" and condition({}, s) is True:
                assert new is not None
                out.append(new({}, s))
                break
    return out


def _always(t: Row, s: Row) -> bool:
    return True


def _on_id(t: Row, s: Row) -> bool | None:
    return None if t["id"] is None or s["id"] is None else t["id"] == s["id"]


def _rows(spark, path: str, columns: tuple[str, ...] = COLUMNS) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(path).select(*columns)
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _tuples(rows: list[Row], columns: tuple[str, ...] = COLUMNS) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.get(c) for c in columns) for r in rows), key=repr)


def _source(spark, rows: list[tuple[Any, ...]], schema: str = SCHEMA):
    return spark.createDataFrame(rows, schema).alias("s")


def _as_dicts(rows: list[tuple[Any, ...]], columns: tuple[str, ...] = COLUMNS) -> list[Row]:
    return [dict(zip(columns, r, strict=True)) for r in rows]


def _last_commit(spark, path: str) -> dict[str, Any]:
    return DeltaTable.forPath(spark, path).history(1).collect()[0].asDict()


def _files(path: str) -> set[str]:
    return set(RsTable(path).file_uris())


def test_builder_is_immutable_and_declarative(spark, table_path):
    path = _make(table_path())
    base = DeltaTable.forPath(spark, path).alias("t").merge(_source(spark, []), "t.id = s.id")
    with_delete = base.whenMatchedDelete()
    assert base.spec.clauses == ()
    assert [c.kind for c in with_delete.spec.clauses] == ["matchedDelete"]
    assert with_delete.withSchemaEvolution().spec.schema_evolution
    assert not with_delete.spec.schema_evolution
    assert base.spec.target_alias == "t"


def test_upsert_with_null_keys_keeps_untouched_files(spark, table_path):
    path = _make(table_path())
    before = _files(path)
    untouched = {p for p in before if "kind=a" in p}
    source = [(1, "a", 100, "u"), (5, "b", 500, "u"), (20, "b", 2, "new"), (None, "a", 3, "nk")]
    result = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    assert tuple(result.collect()[0]) == (4, 2, 0, 2)
    expected = reference_merge(
        TARGET,
        _as_dicts(source),
        _on_id,
        [("matchedUpdate", _always, lambda t, s: s), ("insert", _always, lambda t, s: s)],
    )
    assert _rows(spark, path) == _tuples(expected)
    after = _files(path)
    # The file of ids 8-9 has no match: still referenced, not rewritten.
    kept = before & after
    assert len(kept) == 1 and kept < untouched
    commit = _last_commit(spark, path)
    assert commit["operation"] == "MERGE"
    assert commit["readVersion"] == 2
    metrics = commit["operationMetrics"]
    assert metrics["numSourceRows"] == "4"
    assert metrics["numTargetRowsInserted"] == "2"  # the NULL key never matches
    assert metrics["numTargetRowsUpdated"] == "2"
    assert metrics["numTargetRowsDeleted"] == "0"
    assert metrics["numTargetRowsCopied"] == "6"
    assert metrics["numTargetFilesRemoved"] == "2"


def test_clauses_in_order_conditional_update_and_delete(spark, table_path):
    path = _make(table_path())
    source = [(0, "a", 5, "del"), (2, "a", 3, "u"), (3, "a", 20, "u"), (5, "b", 1, None)]
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source), F.col("t.id") == F.col("s.id"))  # a Column condition
        .whenMatchedDelete("s.note = 'del'")
        .whenMatchedUpdate("s.value > t.value", set={"value": "s.value", "t.note": "'bigger'"})
        .whenMatchedUpdate(set={"note": "concat(t.note, '-seen')"})
        .execute()
    )

    def gt(t: Row, s: Row) -> bool | None:
        return None if s["value"] is None or t["value"] is None else s["value"] > t["value"]

    def seen(t: Row, s: Row) -> Row:
        return {"note": None if t["note"] is None else t["note"] + "-seen"}

    expected = reference_merge(
        TARGET,
        _as_dicts(source),
        _on_id,
        [
            ("matchedDelete", lambda t, s: s["note"] == "del" if s["note"] else None, None),
            ("matchedUpdate", gt, lambda t, s: {"value": s["value"], "note": "bigger"}),
            ("matchedUpdate", _always, seen),
        ],
    )
    assert _rows(spark, path) == _tuples(expected)
    metrics = _last_commit(spark, path)["operationMetrics"]
    assert (metrics["numTargetRowsDeleted"], metrics["numTargetRowsUpdated"]) == ("1", "3")
    assert metrics["numTargetRowsInserted"] == "0"


def test_not_matched_by_source_delete_and_update(spark, table_path):
    path = _make(table_path())
    source = [(1, "a", 10, "s"), (4, "b", 40, "s")]
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source), "t.id = s.id AND t.kind = 'a'")  # 4 is not matched
        .whenMatchedUpdate(set={"value": "s.value"})
        .whenNotMatchedBySourceDelete("t.kind = 'b'")
        .whenNotMatchedBySourceUpdate("t.value > 5", set={"note": "'orphan'"})
        .execute()
    )
    expected = reference_merge(
        TARGET,
        _as_dicts(source),
        lambda t, s: t["id"] == s["id"] and t["kind"] == "a",
        [
            ("matchedUpdate", _always, lambda t, s: {"value": s["value"]}),
            ("bySourceDelete", lambda t, s: t["kind"] == "b", None),
            (
                "bySourceUpdate",
                lambda t, s: None if t["value"] is None else t["value"] > 5,
                lambda t, s: {"note": "orphan"},
            ),
        ],
    )
    assert _rows(spark, path) == _tuples(expected)
    metrics = _last_commit(spark, path)["operationMetrics"]
    assert metrics["numTargetRowsDeleted"] == "4"  # kind b, 4 included
    assert metrics["numTargetRowsUpdated"] == str(1 + 3)  # matched 1 + ids 2, 3, 9


def test_insert_only_rewrites_no_file_and_null_condition_keys(spark, table_path):
    path = _make(table_path())
    before = _files(path)
    # Target rows with a NULL note never match, so the source's (None) note is inserted.
    source = [(30, "a", 1, None), (31, "c", 2, "x"), (32, "c", 3, "new")]
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source), "t.note = s.note")
        .whenNotMatchedInsert("s.id > 30", values={"id": "s.id", "kind": "s.kind", "note": "'i'"})
        .whenNotMatchedInsertAll()
        .execute()
    )

    def on_note(t: Row, s: Row) -> bool | None:
        return None if t["note"] is None or s["note"] is None else t["note"] == s["note"]

    expected = reference_merge(
        TARGET,
        _as_dicts(source),
        on_note,
        [
            ("insert", lambda t, s: s["id"] > 30, lambda t, s: {**s, "value": None, "note": "i"}),
            ("insert", _always, lambda t, s: s),
        ],
    )
    assert _rows(spark, path) == _tuples(expected)
    assert before < _files(path)
    metrics = _last_commit(spark, path)["operationMetrics"]
    assert (metrics["numTargetRowsInserted"], metrics["numTargetFilesRemoved"]) == ("2", "0")


def test_append_only_table_takes_insert_only_merges(spark, table_path):
    path = _make(table_path())
    table = DeltaTable.forPath(spark, path)
    table.setProperties({"delta.appendOnly": "true"})
    source = _source(spark, [(1, "a", 0, "dup"), (60, "b", 6, "new")])
    merge = table.alias("t").merge(source, "t.id = s.id")
    with pytest.raises(UnsupportedFeatureError) as info:
        merge.whenMatchedDelete().execute()
    assert info.value.feature == "appendOnly"
    merge.whenNotMatchedInsertAll().execute()
    expected = [*TARGET, dict(zip(COLUMNS, (60, "b", 6, "new"), strict=True))]
    assert _rows(spark, path) == _tuples(expected)


def test_multiple_matches_fail_typed_and_commit_nothing(spark, table_path):
    path = _make(table_path())
    version = RsTable(path).version()
    duplicated = _source(spark, [(1, "a", 10, "p"), (1, "a", 11, "q"), (2, "a", 1, "r")])
    table = DeltaTable.forPath(spark, path).alias("t")
    with pytest.raises(MultipleSourceRowMatchingTargetRowError) as info:
        table.merge(duplicated, "t.id = s.id").whenMatchedUpdateAll().execute()
    assert info.value.table_uri == DeltaTable.forPath(spark, path)._uri
    assert RsTable(path).version() == version
    assert _rows(spark, path) == _tuples(TARGET)

    # No matched clause applies to the duplicates: no ambiguity, no error.
    table.merge(duplicated, "t.id = s.id").whenMatchedUpdate(
        "s.note = 'r'", set={"note": "'r'"}
    ).execute()
    expected = [{**r, "note": "r"} if r["id"] == 2 else r for r in TARGET]
    assert _rows(spark, path) == _tuples(expected)
    # delta-spark: one unconditional delete is unambiguous whatever the number of matches.
    table.merge(duplicated, "t.id = s.id").whenMatchedDelete().execute()
    assert _rows(spark, path) == _tuples([r for r in expected if r["id"] not in (1, 2)])


def test_partition_column_update_moves_rows(spark, table_path):
    path = _make(table_path())
    source = [(0, "a", 0, ""), (9, "a", 0, "")]
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source), "t.id = s.id AND t.kind = 'a'")
        .whenMatchedUpdate(set={"kind": "'c'"})
        .execute()
    )
    expected = [{**r, "kind": "c"} if r["id"] in (0, 9) else r for r in TARGET]
    assert _rows(spark, path) == _tuples(expected)
    adds = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    moved = [a for a in adds if a["partition.kind"] == "c"]
    assert sum(a["num_records"] for a in moved) == 2
    assert all("kind=c/" in a["path"] for a in moved)
    # t.kind = 'a' pruned the kind=b file: it was never a candidate.
    assert _last_commit(spark, path)["operationMetrics"]["numTargetFilesRemoved"] == "2"


@pytest.mark.usefixtures("merge_as_spark_jobs")  # the Spark jobs' file pruning
def test_partition_equality_with_source_prunes_files(spark, table_path, monkeypatch):
    path = _make(table_path())
    scanned: list[int] = []
    original = _target_scan.scan

    def recording_scan(spark, snapshot, struct, files, alias, **kwargs):
        scanned.append(len(files))
        return original(spark, snapshot, struct, files, alias, **kwargs)

    monkeypatch.setattr(_target_scan, "scan", recording_scan)
    before = _files(path)
    b_files = {p for p in before if "kind=b" in p}
    source = [(4, "b", 44, "s"), (50, "b", 5, "n"), (None, None, 1, "n")]
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source), "t.kind = s.kind AND t.id = s.id")
        .whenMatchedUpdate(set={"value": "s.value"})
        .whenNotMatchedInsertAll()
        .execute()
    )

    def on(t: Row, s: Row) -> bool | None:
        return _on_id(t, s) and t["kind"] == s["kind"]

    expected = reference_merge(
        TARGET,
        _as_dicts(source),
        on,
        [
            ("matchedUpdate", _always, lambda t, s: {"value": s["value"]}),
            ("insert", _always, lambda t, s: s),
        ],
    )
    assert _rows(spark, path) == _tuples(expected)
    after = _files(path)
    assert not b_files & after and before - b_files <= after  # the kind=a files stay
    # The source's kinds are {b}: only the kind=b file was read (by job 1, then job 2).
    assert scanned and set(scanned) == {1}
    assert _last_commit(spark, path)["operationMetrics"]["numTargetFilesRemoved"] == "1"


def test_schema_evolution_adds_source_columns(spark, table_path):
    path = _make(table_path())
    schema = f"{SCHEMA}, extra string"
    source = [(1, "a", 10, "u", "e1"), (40, "b", 4, "n", "e2")]
    columns = (*COLUMNS, "extra")
    builder = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, source, schema), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
    )
    with pytest.raises(SchemaMismatchError) as info:  # updateAll needs every table column
        DeltaTable.forPath(spark, path).alias("t").merge(
            _source(spark, [], "id long, kind string, value int"), "t.id = s.id"
        ).whenMatchedUpdateAll().execute()
    assert info.value.columns == ("note",)
    builder.execute()  # without evolution the extra column is ignored
    assert spark.read.format("delta").load(path).columns == list(COLUMNS)
    builder.withSchemaEvolution().execute()
    target = [{**r, "extra": None} for r in TARGET]
    expected = reference_merge(
        target,
        _as_dicts(source, columns),
        _on_id,
        [("matchedUpdate", _always, lambda t, s: s), ("insert", _always, lambda t, s: s)],
    )
    assert _rows(spark, path, columns) == _tuples(expected, columns)


def test_foreach_batch_upsert_from_a_stream(spark, table_path, tmp_path):
    path = _make(table_path())
    feed = table_path("feed")
    spark.createDataFrame([(1, "a", 50, "s1"), (11, "b", 1, "s1")], SCHEMA).write.format(
        "delta"
    ).save(feed)

    def upsert(batch, batch_id: int) -> None:
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(batch.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    query = (
        spark.readStream.format("delta")
        .load(feed)
        .writeStream.foreachBatch(upsert)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    expected = reference_merge(
        TARGET,
        _as_dicts([(1, "a", 50, "s1"), (11, "b", 1, "s1")]),
        _on_id,
        [("matchedUpdate", _always, lambda t, s: s), ("insert", _always, lambda t, s: s)],
    )
    assert _rows(spark, path) == _tuples(expected)


@pytest.mark.usefixtures("merge_as_spark_jobs")  # the Spark jobs' commit seam
def test_merge_conflicts_with_concurrent_delete_of_a_file_it_read(spark, table_path, monkeypatch):
    path = _make(table_path())
    original = _merge.commit

    def commit_after_concurrent_delete(request):
        RsTable(path).delete("id <= 3")  # removes the whole ids 0-3 file the MERGE read
        return original(request)

    monkeypatch.setattr(_merge, "commit", commit_after_concurrent_delete)
    builder = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, [(3, "a", 30, "u")]), "t.id = s.id")
        .whenMatchedUpdateAll()
    )
    with pytest.raises(ConcurrentWriteError) as info:
        builder.execute()
    assert info.value.kind == "ConcurrentDeleteRead"
    monkeypatch.undo()
    assert _rows(spark, path) == _tuples([r for r in TARGET if r["id"] > 3])


def test_unreachable_clause_is_refused(spark, table_path):
    path = _make(table_path())
    builder = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(_source(spark, []), "t.id = s.id")
        .whenMatchedDelete()
        .whenMatchedUpdateAll()
    )
    with pytest.raises(InvalidOptionError) as info:
        builder.execute()
    assert info.value.option == "condition"


def test_multiple_match_error_pickles_and_crosses_the_wire():
    import pickle

    from deltaflow.errors import from_wire, to_wire

    error = MultipleSourceRowMatchingTargetRowError("several matches", table_uri="file:///t")
    for copy in (pickle.loads(pickle.dumps(error)), from_wire(to_wire(error))):
        assert isinstance(copy, MultipleSourceRowMatchingTargetRowError)
        assert copy.table_uri == "file:///t"


@pytest.mark.usefixtures("merge_as_spark_jobs")  # the Spark jobs' session settings
def test_small_merge_runs_without_adaptive_execution_and_restores_the_session(
    spark, table_path, monkeypatch
):
    """A MERGE over a few KB turns adaptive execution off for its own jobs only (fewer
    jobs: each re-planned stage is one), and leaves the session's setting as it was."""
    path = _make(table_path())
    seen: list[str] = []
    original = _target_scan.session_conf

    def recording(session, settings):
        seen.append(str(settings.get(_target_scan.ADAPTIVE_CONF)))
        return original(session, settings)

    before = spark.conf.get(_target_scan.ADAPTIVE_CONF)
    monkeypatch.setattr(_target_scan, "session_conf", recording)
    DeltaTable.forPath(spark, path).alias("t").merge(
        _source(spark, [(1, "a", 100, "u")]), "t.id = s.id"
    ).whenMatchedUpdateAll().execute()
    assert "false" in seen
    assert spark.conf.get(_target_scan.ADAPTIVE_CONF) == before
    assert (1, "a", 100, "u") in _rows(spark, path)
