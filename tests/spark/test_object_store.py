"""Tables on an object store (``s3://``), read and written by Spark through the Python data
path, against a real S3 server (SeaweedFS, see ``tests/_object_store.py``).

Spark's Hadoop layer cannot open ``s3://`` from the pyspark wheel, so the connector routes
these tables to the Python data source; delta-rs and pyarrow talk to the server, with the
settings the environment gave every process at JVM launch.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
import deltaflow.table._uri
from deltaflow import ObjectStoreError

pytestmark = pytest.mark.slow

ROWS = [(1, "a"), (2, "b"), (3, "c")]


def spark_rows(spark: Any, uri: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())


def delta_rs_rows(store: Any, uri: str) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri, storage_options=store.storage_options)
    return sorted(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist())


def frame(spark: Any, rows: list[tuple[int, str]]) -> Any:
    return spark.createDataFrame(rows, "id long, name string")


def test_spark_appends_and_overwrites_a_table_on_s3(spark, object_store):
    uri = object_store.uri()
    frame(spark, ROWS[:2]).write.format("delta").save(uri)
    frame(spark, ROWS[2:]).write.format("delta").mode("append").save(uri)
    assert spark_rows(spark, uri) == ROWS
    assert delta_rs_rows(object_store, uri) == ROWS

    frame(spark, [(9, "z")]).write.format("delta").mode("overwrite").save(uri)
    assert spark_rows(spark, uri) == [(9, "z")]
    assert delta_rs_rows(object_store, uri) == [(9, "z")]
    table = DeltaTable(uri, storage_options=object_store.storage_options)
    assert table.version() == 2
    assert [h["operation"] for h in table.history()] == ["WRITE", "WRITE", "CREATE TABLE"]


def test_spark_writes_a_partitioned_table_and_filters_it(spark, object_store):
    uri = object_store.uri()
    frame(spark, ROWS).write.format("delta").partitionBy("name").save(uri)
    df = spark.read.format("delta").load(uri)
    assert sorted(tuple(r) for r in df.where("name = 'b'").collect()) == [(2, "b")]
    table = DeltaTable(uri, storage_options=object_store.storage_options)
    assert table.metadata().partition_columns == ["name"]
    assert delta_rs_rows(object_store, uri) == ROWS


def test_a_commit_racing_another_on_s3_does_not_overwrite_it(object_store):
    """Commits are safe without AWS_S3_ALLOW_UNSAFE_RENAME: delta-rs puts the next log entry
    only if absent (If-None-Match), and the server honours it."""
    uri, options = object_store.uri(), object_store.storage_options
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=options)
    stale = DeltaTable(uri, storage_options=options)
    write_deltalake(uri, pa.table({"id": [2]}), mode="append", storage_options=options)
    # The stale writer's commit finds version 1 taken and lands at version 2.
    write_deltalake(stale, pa.table({"id": [3]}), mode="append")
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]


def test_s3a_uris_name_the_same_tables(spark, object_store):
    uri = object_store.uri()
    hadoop_style = "s3a://" + uri.removeprefix("s3://")
    frame(spark, ROWS).write.format("delta").save(hadoop_style)
    assert spark_rows(spark, hadoop_style) == ROWS
    assert delta_rs_rows(object_store, uri) == ROWS


def test_a_table_written_by_delta_rs_reads_the_same_through_spark(spark, object_store):
    uri = object_store.uri()
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})
    write_deltalake(uri, data, storage_options=object_store.storage_options)
    more = pa.table({"id": pa.array([4], pa.int64()), "name": ["d"]})
    write_deltalake(uri, more, mode="append", storage_options=object_store.storage_options)
    assert spark_rows(spark, uri) == [*ROWS, (4, "d")]
    assert spark_rows(spark, uri) == delta_rs_rows(object_store, uri)
    # Time travel reads the pinned version from the object store too.
    old = spark.read.format("delta").option("versionAsOf", 0).load(uri).collect()
    assert sorted(tuple(r) for r in old) == ROWS


def test_a_stream_from_s3_to_s3_delivers_each_row_once(spark, object_store, tmp_path):
    source, sink = object_store.uri("src"), object_store.uri("dst")
    frame(spark, ROWS[:2]).write.format("delta").save(source)
    frame(spark, ROWS[2:]).write.format("delta").mode("append").save(source)
    checkpoint = str(tmp_path / "checkpoint")

    def run() -> None:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(sink)
        )
        assert query.awaitTermination(timeout=300)
        assert query.exception() is None

    run()
    assert spark_rows(spark, sink) == ROWS
    version = DeltaTable(sink, storage_options=object_store.storage_options).version()
    run()  # nothing new in the source: nothing new in the sink
    assert spark_rows(spark, sink) == ROWS
    assert DeltaTable(sink, storage_options=object_store.storage_options).version() == version

    frame(spark, [(4, "d")]).write.format("delta").mode("append").save(source)
    run()
    assert spark_rows(spark, sink) == [*ROWS, (4, "d")]
    assert delta_rs_rows(object_store, sink) == [*ROWS, (4, "d")]
    # Every batch committed with the query's app transaction (first run: the connector's
    # sink, the table did not exist yet; later runs: the Python source's sink).
    table = DeltaTable(sink, storage_options=object_store.storage_options)
    query_id = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    assert table.transaction_version(query_id) == 1  # batches 0 and 1


def test_s3_tables_take_the_python_path_and_local_ones_the_connector(
    spark, object_store, table_path
):
    uri, local = object_store.uri(), table_path()
    reports = spark._jvm.io.deltaflow.spark.WriteReports
    reports.clear()
    for location in (uri, local):
        frame(spark, ROWS).write.format("delta").save(location)
    routes = {r["table_uri"]: r["route"] for r in json.loads(reports.json())}
    assert routes == {uri: "python", deltaflow.table._uri.normalize_uri(local): "jvm"}

    def physical_plan(location: str) -> str:
        df = spark.read.format("delta").load(location)
        return str(df._jdf.queryExecution().executedPlan().toString())

    assert "BatchScan deltaflow_python" in physical_plan(uri)
    assert "DeltaScan delta.`file://" in physical_plan(local)


def test_wrong_credentials_raise_a_typed_error_naming_the_settings(object_store):
    from deltaflow.table._snapshot import load_snapshot

    uri = object_store.uri()
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=object_store.storage_options)
    with pytest.raises(ObjectStoreError) as caught:
        load_snapshot(uri, storage_options={"AWS_SECRET_ACCESS_KEY": "wrong"})
    assert caught.value.table_uri == uri
    assert caught.value.kind == "credentials"
    assert "AWS_SECRET_ACCESS_KEY" in str(caught.value)
    assert not caught.value.retryable
    assert deltaflow.typed_error(caught.value) is caught.value


@pytest.fixture
def silent_endpoint() -> Iterator[Callable[[], str]]:
    """Endpoints that refuse every connection for the whole test: a socket bound to each
    port and never listening. A port that is merely free may be taken meanwhile by a
    server another test process starts (CI once got a SeaweedFS's 403 there)."""
    held: list[socket.socket] = []

    def endpoint() -> str:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
        return f"http://127.0.0.1:{s.getsockname()[1]}"

    yield endpoint
    for s in held:
        s.close()


def test_an_endpoint_that_does_not_answer_is_a_retryable_typed_error(object_store, silent_endpoint):
    from deltaflow.table._snapshot import table_exists

    silent = silent_endpoint()
    # The store's whole settings, not only the endpoint: run alone, no Spark session has
    # exported the credentials into the environment, and their absence would be the error.
    options = {**object_store.storage_options, "AWS_ENDPOINT_URL": silent}
    with pytest.raises(ObjectStoreError) as caught:
        table_exists(object_store.uri(), storage_options=options)
    assert caught.value.kind == "unreachable"
    assert caught.value.retryable


def test_a_missing_bucket_is_a_typed_error_through_spark(spark, object_store):
    with pytest.raises(Exception) as caught:
        spark.read.format("delta").load("s3://no-such-bucket/t").collect()
    error = deltaflow.typed_error(caught.value)
    assert isinstance(error, ObjectStoreError), caught.value
    assert error.table_uri == "s3://no-such-bucket/t"
    assert error.kind == "other"
    assert not error.retryable


def test_a_commit_to_an_endpoint_that_does_not_answer_is_a_retryable_typed_error(
    object_store, silent_endpoint
):
    """A store that vanishes mid-stream fails the sink's commit typed, not as a bare OSError."""
    from deltaflow.table import _commit

    silent = silent_endpoint()
    uri = object_store.uri()
    request = _commit.CommitRequest(
        table_uri=uri,
        schema={
            "type": "struct",
            "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
        },
        partition_columns=(),
        adds=(),
        storage_options={**object_store.storage_options, "AWS_ENDPOINT_URL": silent},
    )
    with pytest.raises(ObjectStoreError) as caught:
        _commit.commit(request)
    assert (caught.value.kind, caught.value.table_uri) == ("unreachable", uri)
    assert caught.value.retryable
