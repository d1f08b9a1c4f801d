"""The streaming source's remaining options and schema rules: startingTimestamp,
ignoreDeletes, additive and incompatible upstream schema changes (delta-spark semantics).

Sources are written with delta-rs, one commit per write; streams run with availableNow.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import unpack_remote_error
from deltaflow.spark.errors import ChangeCommitError, SourceSchemaChangedError
from tests.spark.test_streaming import append, ids, rows, run, sink, stream


def commit_time(path: str, version: int) -> dt.datetime:
    entry = next(h for h in DeltaTable(path).history() if h["version"] == version)
    return dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.timezone.utc)


def failure(writer, target: str) -> Exception:
    with pytest.raises(Exception) as caught:
        run(writer, target)
    error = unpack_remote_error(caught.value)
    assert error is not None, caught.value
    return error


def test_starting_timestamp_starts_at_the_first_commit_at_or_after_it(spark, table_path):
    source, target = table_path("src"), table_path("dst")
    for i in range(4):
        append(source, [i])  # versions 0..3
    start = commit_time(source, 2)
    when = start.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    run(sink(stream(spark, source, startingTimestamp=when), table_path("ck")), target)
    # Versions 2 and 3, unless version 1 shares version 2's millisecond (then it is
    # "at" the timestamp too): exactly the versions committed at or after it.
    expected = [v for v in range(4) if commit_time(source, v) >= start]
    assert ids(target) == expected


def running(spark, source: str, checkpoint: str, target: str):
    """A query that keeps polling the source (the schema it reads is pinned at start)."""
    return (
        sink(stream(spark, source), checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start(target)
    )


def stopped_with(query) -> Exception:
    with pytest.raises(Exception) as caught:
        query.processAllAvailable()
    query.stop()
    error = unpack_remote_error(caught.value)
    assert error is not None, caught.value
    return error


def test_ignore_deletes_skips_whole_file_deletes_but_not_rewrites(spark, table_path):
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])  # v0: a file holding only id 1
    append(source, [2, 3])  # v1
    run(sink(stream(spark, source, ignoreDeletes="true"), checkpoint), target)
    DeltaTable(source).delete("id = 1")  # v2: removes the whole file, adds nothing
    append(source, [4])  # v3
    run(sink(stream(spark, source, ignoreDeletes="true"), checkpoint), target)
    assert ids(target) == [1, 2, 3, 4]  # the delete does not reach the target (delta-spark)

    DeltaTable(source).delete("id = 2")  # v4: rewrites the file holding 2 and 3
    error = failure(sink(stream(spark, source, ignoreDeletes="true"), checkpoint), target)
    assert isinstance(error, ChangeCommitError) and error.version == 4
    assert "skipChangeCommits" in str(error)


def test_additive_upstream_schema_change_stops_once_then_restart_reads_it(spark, table_path):
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    query = running(spark, source, checkpoint, target)
    query.processAllAvailable()
    wider = pa.table(
        {
            "id": pa.array([2], pa.int64()),
            "name": pa.array(["n2"], pa.string()),
            "score": pa.array([2.5], pa.float64()),
        }
    )
    write_deltalake(source, wider, mode="append", schema_mode="merge")  # v1: new column

    error = stopped_with(query)
    assert isinstance(error, SourceSchemaChangedError)
    assert (error.version, error.additive) == (1, True)
    assert "score" in str(error) and "Restart" in str(error)

    restarted = sink(stream(spark, source), checkpoint).option("mergeSchema", "true")
    run(restarted, target)
    assert rows(target, "id", "name", "score") == [(1, "n1", None), (2, "n2", 2.5)]


def test_a_dropped_upstream_column_stops_the_stream_as_not_additive(spark, table_path):
    # Under column mapping DROP COLUMN is a metadata-only commit; the stream must not read
    # on past it with a column its schema no longer has (delta-spark stops there too).
    from deltalake import Schema

    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    DeltaTable.create(
        source, schema=Schema.from_arrow(schema), configuration={"delta.columnMapping.mode": "name"}
    )
    write_deltalake(source, pa.table({"id": [1], "name": ["n1"]}, schema=schema), mode="append")
    query = running(spark, source, checkpoint, target)
    query.processAllAvailable()
    spark.sql(f"ALTER TABLE delta.`{source}` DROP COLUMN name")  # v2

    error = stopped_with(query)
    assert isinstance(error, SourceSchemaChangedError)
    assert (error.version, error.additive) == (2, False)
    assert "name (dropped or renamed)" in str(error) and "new checkpointLocation" in str(error)


def test_incompatible_upstream_schema_change_fails_with_advice(spark, table_path):
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    query = running(spark, source, checkpoint, target)
    query.processAllAvailable()
    retyped = pa.table({"id": pa.array(["one"], pa.string()), "name": pa.array(["x"])})
    write_deltalake(source, retyped, mode="overwrite", schema_mode="overwrite")  # v1

    error = stopped_with(query)
    assert isinstance(error, SourceSchemaChangedError)
    assert (error.version, error.additive) == (1, False)
    assert "new checkpointLocation" in str(error)
    # After a restart the stream reads with the new schema, and version 1 is what it
    # also is: an overwrite, which a stream of appends cannot pass on (as delta-spark).
    error = failure(sink(stream(spark, source), checkpoint), target)
    assert isinstance(error, ChangeCommitError) and error.version == 1
    assert ids(target) == [1]
