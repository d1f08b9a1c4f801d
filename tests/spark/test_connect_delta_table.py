"""``deltaflow.tables.DeltaTable`` over Spark Connect: every method runs on the server.

One Connect server per module, started from the wheel with ``deltaflow.spark_conf()``,
and one client process (``_connect_client.py``) whose working directory is elsewhere
and which, when the tests run as root, sees the tables' directory as an empty tmpfs (a
mount namespace of its own): the client cannot open table storage, so anything that
works here ran on the server. The test process checks the tables with delta-rs, from
the server's side of the disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from deltalake import DeltaTable as DeltaRsTable
from deltalake import write_deltalake

from tests._waiting import wait_until
from tests.spark.test_hosts import start_connect_server, stop, wait_for_port

pytestmark = pytest.mark.slow

CLIENT = Path(__file__).with_name("_connect_client.py")


class Client:
    """The client process: ``run(code)`` executes ``code`` there and returns its
    ``result`` (JSON) or raises :class:`ClientError` with the typed error's name."""

    def __init__(self, process: subprocess.Popen[str], hidden: bool) -> None:
        self.process = process
        self.hidden = hidden

    def run(self, code: str) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"code": textwrap.dedent(code)}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the Connect client process died"
        answer = json.loads(line)
        if "error" in answer:
            raise ClientError(answer["error"])
        return answer["result"]


class ClientError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(
            f"{error['type']} ({error['condition']}): {error['message']}\n{error['traceback']}"
        )
        self.type = error["type"]
        self.mro = error["mro"]
        self.fields = error["fields"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server_tables")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, tables: Path) -> Iterator[Client]:
    server_dir = tmp_path_factory.mktemp("connect_server")
    server, port = start_connect_server(server_dir, {"spark.sql.shuffle.partitions": "2"})
    process = None
    try:
        wait_for_port(port, server, timeout=180)
        command = [sys.executable, str(CLIENT), str(port), str(tables)]
        hidden = os.geteuid() == 0 and shutil.which("unshare") is not None
        if hidden:  # the tables' directory is an empty tmpfs for the client
            command = [
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs deltaflow-hidden "{tables}" && exec "$@"', "client",
                *command,
            ]  # fmt: skip
        client_dir = tmp_path_factory.mktemp("connect_client")
        process = subprocess.Popen(
            command,
            cwd=client_dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(client_dir / "client.log").open("w"),
            text=True,
        )
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready, (client_dir / "client.log").read_text()[-3000:]
        yield Client(process, hidden)
    finally:
        if process is not None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        stop(server, server_dir)


def seeded(path: Path, rows: int = 3, **kwargs: Any) -> str:
    ids = list(range(1, rows + 1))
    data = pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})
    write_deltalake(str(path), data, **kwargs)
    return str(path)


def test_the_client_cannot_see_the_tables(client: Client, tables: Path) -> None:
    seeded(tables / "visible_to_server")
    listing = client.run("result = os.listdir(tables)")
    if not client.hidden:
        pytest.skip("not root: the client's view of the disk cannot be hidden here")
    assert listing == []


def test_for_path_is_delta_table_and_to_df(client: Client, tables: Path) -> None:
    path = seeded(tables / "for_path")
    result = client.run(
        f"""
        t = DeltaTable.forPath(spark, {path!r})
        rows = sorted(r.id for r in t.toDF().collect())
        aliased = t.alias("x").toDF().where("x.id > 1").select("x.id")
        aliased = sorted(r.id for r in aliased.collect())
        result = [rows, aliased, DeltaTable.isDeltaTable(spark, {path!r}),
                  DeltaTable.isDeltaTable(spark, {path + "_missing"!r}), repr(t)]
        """
    )
    assert result[:4] == [[1, 2, 3], [2, 3], True, False]
    assert result[4] == f"DeltaTable('file://{path}')"


def test_for_path_of_a_missing_table_is_table_not_found(client: Client, tables: Path) -> None:
    with pytest.raises(ClientError) as caught:
        client.run(f"DeltaTable.forPath(spark, {str(tables / 'nothing_here')!r})")
    assert caught.value.type == "TableNotFoundError"
    assert caught.value.fields["table_uri"].endswith("nothing_here")


def test_a_plain_read_over_connect_sees_appends_and_a_missing_path_fails_typed(
    client: Client, tables: Path
) -> None:
    """Connect hosts never had the classic reader's driver check, so nothing changed for
    them: reads go through the brain's snapshot cache (an append is seen by name), and a
    missing path fails typed when the read runs."""
    path = seeded(tables / "read_twice")
    read = f"result = sorted(r.id for r in spark.read.format('delta').load({path!r}).collect())"
    assert client.run(read) == [1, 2, 3]
    assert client.run(read) == [1, 2, 3]
    write_deltalake(
        path, pa.table({"id": pa.array([9], pa.int64()), "name": ["n9"]}), mode="append"
    )
    assert client.run(read) == [1, 2, 3, 9]
    missing = str(tables / "never_written")
    with pytest.raises(ClientError) as caught:
        client.run(f"spark.read.format('delta').load({missing!r}).collect()")
    assert caught.value.type == "TableNotFoundError"


def test_create_builder_runs_on_the_server(client: Client, tables: Path) -> None:
    path = tables / "built"
    result = client.run(
        f"""
        t = (DeltaTable.create(spark).location({str(path)!r})
             .addColumn("id", "BIGINT", nullable=False)
             .addColumn("name", "STRING", comment="who")
             .addColumn("day", "DATE", generatedAlwaysAs="CAST('2026-01-01' AS DATE)")
             .partitionedBy("day")
             .property("delta.enableChangeDataFeed", "true")
             .comment("built remotely")
             .execute())
        again = DeltaTable.createIfNotExists(spark).location({str(path)!r}).addColumn(
            "id", "BIGINT").execute()
        d = t.detail().first()
        result = [d.description, d.partitionColumns, d.properties, repr(again)]
        """
    )
    assert result[0] == "built remotely"
    assert result[1] == ["day"]
    assert result[2]["delta.enableChangeDataFeed"] == "true"
    table = DeltaRsTable(str(path))
    schema = table.schema()
    assert [f.name for f in schema.fields] == ["id", "name", "day"]
    assert schema.fields[0].nullable is False
    assert schema.fields[1].metadata["comment"] == "who"
    assert "delta.generationExpression" in schema.fields[2].metadata
    assert table.metadata().description == "built remotely"
    with pytest.raises(ClientError) as caught:
        client.run(
            f"DeltaTable.create(spark).location({str(path)!r}).addColumn('id', 'INT').execute()"
        )
    assert caught.value.type == "TableAlreadyExistsError"


def test_named_table_builder_for_name_and_cluster_by(client: Client) -> None:
    result = client.run(
        """
        DeltaTable.createOrReplace(spark).tableName("remote_named").addColumn(
            "id", "BIGINT").addColumn("k", "STRING").clusterBy("k").execute()
        spark.createDataFrame([(1, "a"), (2, "b")], "id long, k string").writeTo(
            "remote_named").append()
        t = DeltaTable.forName(spark, "remote_named")
        d = t.detail().first()
        result = [repr(t), sorted(r.id for r in t.toDF().collect()), d.clusteringColumns]
        """
    )
    assert result == ["DeltaTable('remote_named')", [1, 2], ["k"]]
    with pytest.raises(ClientError) as caught:
        client.run("DeltaTable.forName(spark, 'no_such_table')")
    assert caught.value.type == "TableNotFoundError"


def test_history_detail_optimize_vacuum_restore(client: Client, tables: Path) -> None:
    path = seeded(tables / "maintained")
    for start in (10, 20):
        more = pa.table({"id": pa.array([start], pa.int64()), "name": ["x"]})
        write_deltalake(path, more, mode="append")
    result = client.run(
        f"""
        t = DeltaTable.forPath(spark, {path!r})
        history = [(r.version, r.operation) for r in t.history().collect()]
        limited = t.history(1).count()
        files_before = t.detail().first().numFiles
        compacted = t.optimize().executeCompaction().first().metrics.numFilesAdded
        restored = t.restoreToVersion(1).first().num_of_files_after_restore
        zordered = t.optimize().executeZOrderBy("id").first().metrics.numFilesRemoved
        vacuumed = t.vacuum().count()
        result = [history, limited, files_before, compacted, restored, zordered, vacuumed]
        """
    )
    assert result[0] == [(2, "WRITE"), (1, "WRITE"), (0, "CREATE TABLE")] or [
        v for v, _ in result[0]
    ] == [2, 1, 0]
    assert result[1] == 1
    assert result[2] == 3
    assert result[3] == 1
    assert result[4] == 2
    table = DeltaRsTable(path)
    operations = [h["operation"] for h in table.history()]
    assert operations[:3] == ["OPTIMIZE", "RESTORE", "OPTIMIZE"]
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3, 10]


def test_restore_to_timestamp_upgrade_protocol_and_features(client: Client, tables: Path) -> None:
    path = seeded(tables / "protocol")
    write_deltalake(path, pa.table({"id": pa.array([9], pa.int64()), "name": ["z"]}), mode="append")
    first_commit = DeltaRsTable(path).history()[-1]["timestamp"]  # ms since the epoch
    restored = client.run(
        f"""
        import datetime as dt
        t = DeltaTable.forPath(spark, {path!r})
        at = dt.datetime.fromtimestamp({first_commit} / 1000, dt.timezone.utc)
        t.restoreToTimestamp(at + dt.timedelta(milliseconds=1))
        result = sorted(r.id for r in t.toDF().collect())
        t.upgradeTableProtocol(1, 4)
        t.addFeatureSupport("deletionVectors")
        t.setProperties({{"delta.appendOnly": "false", "team": "lake"}})
        t.generate("symlink_format_manifest")
        """
    )
    assert restored == [1, 2, 3]
    table = DeltaRsTable(path)
    assert "RESTORE" in [h["operation"] for h in table.history()]
    protocol = table.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "deletionVectors" in (protocol.writer_features or [])
    assert table.metadata().configuration["team"] == "lake"
    assert (Path(path) / "_symlink_format_manifest" / "manifest").exists()
    with pytest.raises(ClientError) as caught:
        client.run(f"DeltaTable.forPath(spark, {path!r}).dropFeatureSupport('deletionVectors')")
    assert caught.value.type == "UnsupportedFeatureError"


def test_convert_to_delta(client: Client, tables: Path) -> None:
    import pyarrow.parquet as pq

    folder = tables / "plain_parquet"
    folder.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), folder / "part-0.parquet")
    result = client.run(
        f"""
        t = DeltaTable.convertToDelta(spark, "parquet.`{folder}`")
        result = sorted(r.id for r in t.toDF().collect())
        """
    )
    assert result == [1, 2]
    assert DeltaRsTable(str(folder)).version() == 0


def test_column_conditions_are_refused_exactly_when_they_have_no_sql(
    client: Client, tables: Path
) -> None:
    path = seeded(tables / "refusals")
    refused = {
        "condition": "t.delete(F.row_number().over(Window.orderBy('id')) == 1)",
        "set": "t.update('id = 1', {'name': F.udf(lambda v: v)('name')})",
        "values": "t.merge(src, 'id = 1').whenNotMatchedInsert(values={'id': other['id']})"
        ".execute()",
    }
    for option, call in refused.items():
        with pytest.raises(ClientError) as caught:
            client.run(
                f"""
                from pyspark.sql.window import Window
                t = DeltaTable.forPath(spark, {path!r})
                src = spark.range(1)
                other = spark.range(2)
                {call}
                """
            )
        assert caught.value.type == "InvalidOptionError", call
        assert caught.value.fields["option"] == option, call
    assert DeltaRsTable(path).version() == 0


COLUMNS = [
    "(F.col('id') == 1) & F.col('name').isNotNull() | ~F.col('id').isin(1, 2)",
    "F.when(F.col('id') > 1, F.lit('big')).otherwise(F.upper(F.col('name')))",
    "F.col('id') * 2 + 1 - F.lit(-3) / F.lit(2.5)",
    "F.col('name').like('n%') & F.col('id').between(1, 5)",
    "F.lit(None).cast('string')",
    "F.lit(-2147483648)",
    "F.lit(float('nan'))",
    "F.lit(__import__('decimal').Decimal('-12.340'))",
    "F.lit(__import__('datetime').date(2026, 2, 3))",
    "F.lit(__import__('datetime').datetime(2026, 2, 3, 4, 5, 6, 7))",
    "F.lit(b'\\x00\\xff')",
    'F.lit("it\'s a \\\\ test")',
    "F.col('`odd.name`') + 1",
    "F.expr('id % 2') == 0",
    "F.coalesce(F.col('name'), F.lit('none'))",
    "F.col('id').cast('decimal(10,2)')",
    "F.col('id').try_cast('int')",
    "-F.col('id')",
    "F.col('id').eqNullSafe(None)",
    "F.concat_ws('-', F.col('name'), F.col('id').cast('string'))",
    "(F.col('id') != 2) & F.col('name').startswith('n') | F.col('name').rlike('^x')",
    "F.col('name').substr(1, 2)",
    "F.lit(3000000000) + F.lit(True).cast('int') + F.lit(1.5)",
    "F.lit(__import__('decimal').Decimal('0.010'))",
    "F.array(F.col('id'), F.lit(2))[0]",
]


def test_column_sql_text_evaluates_as_the_column(client: Client) -> None:
    """Each Connect Column, written as SQL by ``_sql_text``, gives the same values and
    type on the server as the Column itself."""
    cases = ", ".join(COLUMNS)
    result = client.run(
        f"""
        from deltaflow.spark.remote._sql_text import sql_text
        df = spark.createDataFrame([(1, "n1", 7), (2, None, 8), (3, "x", 9)],
                                   "id long, name string, `odd.name` int")
        cases = [{cases}]
        texts = [sql_text(spark, c, "test") for c in cases]
        direct = df.select("id", *[c.alias(f"v{{i}}") for i, c in enumerate(cases)])
        via_sql = df.selectExpr("id", *[f"{{t}} AS v{{i}}" for i, t in enumerate(texts)])
        direct_rows = direct.orderBy("id").collect()
        sql_rows = via_sql.orderBy("id").collect()
        result = [
            [t, repr([r[i + 1] for r in direct_rows]), repr([r[i + 1] for r in sql_rows]),
             direct.schema.fields[i + 1].dataType.simpleString(),
             via_sql.schema.fields[i + 1].dataType.simpleString()]
            for i, t in enumerate(texts)
        ]
        """
    )
    for text, direct, via_sql, direct_type, sql_type in result:
        assert via_sql == direct, text
        assert sql_type == direct_type, text


# ---- DML over Connect: the server runs UPDATE / DELETE / MERGE INTO itself --------------


def test_delete_and_update_with_strings_and_columns(client: Client, tables: Path) -> None:
    path = seeded(tables / "dml", rows=5, configuration={"delta.enableChangeDataFeed": "true"})
    client.run(
        f"""
        t = DeltaTable.forPath(spark, {path!r})
        t.delete("id = 1")
        t.delete(F.col("id") == 2)
        t.update("id = 3", {{"name": "'three'"}})
        t.alias("t").update(F.col("t.id") == 4, {{"name": F.upper(F.col("t.name"))}})
        """
    )
    table = DeltaRsTable(path)
    rows = sorted(zip(*table.to_pyarrow_table().to_pydict().values(), strict=True))
    assert rows == [(3, "three"), (4, "N4"), (5, "n5")]
    history = table.history()
    assert [h["operation"] for h in history[:4]] == ["UPDATE", "UPDATE", "DELETE", "DELETE"]
    assert history[0]["operationMetrics"]["numUpdatedRows"] in (1, "1")
    changes = pa.table(table.load_cdf(starting_version=1).read_all()).to_pydict()
    assert sorted(set(changes["_change_type"])) == ["delete", "update_postimage", "update_preimage"]


def test_merge_every_clause_kind_and_schema_evolution(client: Client, tables: Path) -> None:
    path = seeded(tables / "merged", rows=4, configuration={"delta.enableChangeDataFeed": "true"})
    result = client.run(
        f"""
        t = DeltaTable.forPath(spark, {path!r})
        src = spark.createDataFrame([(2, "two", 20), (3, "gone", 30), (9, "nine", 90)],
                                    "id long, name string, extra int").alias("s")
        out = (t.alias("t").merge(src, F.col("t.id") == F.col("s.id"))
               .whenMatchedDelete(condition="s.name = 'gone'")
               .whenMatchedUpdate(set={{"name": src["name"]}})
               .whenNotMatchedInsertAll()
               .whenNotMatchedBySourceUpdate(condition=F.col("t.id") == 1,
                                             set={{"name": F.lit("kept")}})
               .whenNotMatchedBySourceDelete()
               .withSchemaEvolution()
               .execute())
        unaliased = spark.createDataFrame([(9, "NINE")], "id long, name string")
        again = (t.alias("t").merge(unaliased, F.col("t.id") == unaliased["id"])
                 .whenMatchedUpdate(set={{"name": unaliased["name"]}}).execute())
        result = [out.first().asDict(), [t.name for t in spark.catalog.listTables()],
                  again.first().num_updated_rows]
        """
    )
    assert result[0] == {
        "num_affected_rows": 5,
        "num_updated_rows": 2,
        "num_deleted_rows": 2,
        "num_inserted_rows": 1,
    }
    assert not any(name.startswith("deltaflow_merge_source_") for name in result[1])
    table = DeltaRsTable(path)
    data = table.to_pyarrow_table().to_pydict()
    rows = sorted(zip(data["id"], data["name"], data["extra"], strict=True))
    assert rows == [(1, "kept", None), (2, "two", None), (9, "NINE", 90)]
    assert result[2] == 1
    entry = table.history()[1]
    assert entry["operation"] == "MERGE"
    assert int(entry["operationMetrics"]["numTargetRowsInserted"]) == 1


def test_the_sessions_auto_merge_over_connect(client: Client, tables: Path) -> None:
    """A Connect client's spark.databricks.delta.schema.autoMerge.enabled reaches the
    server's writes and MERGE, as a classic session's does."""
    path = seeded(tables / "auto_merged")
    client.run(
        f"""
        spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
        try:
            spark.createDataFrame([(4, "n4", 1)], "id long, name string, a int").write.format(
                "delta").mode("append").save({path!r})
            src = spark.createDataFrame([(1, "one", "b1")], "id long, name string, b string")
            (DeltaTable.forPath(spark, {path!r}).alias("t").merge(src.alias("s"), "t.id = s.id")
             .whenMatchedUpdateAll().execute())
        finally:
            spark.conf.unset("spark.databricks.delta.schema.autoMerge.enabled")
        result = None
        """
    )
    data = DeltaRsTable(path).to_pyarrow_table().to_pydict()
    rows = sorted(zip(data["id"], data["name"], data["a"], data["b"], strict=True))
    assert rows == [(1, "one", None, "b1"), (2, "n2", None, None), (3, "n3", None, None),
                    (4, "n4", 1, None)]  # fmt: skip


def test_clone_methods_run_on_the_server(client: Client, tables: Path) -> None:
    """DeltaTable.clone / cloneAtVersion from a Connect client: the server writes the
    clones (the client cannot open table storage)."""
    source = seeded(tables / "clone_source")
    write_deltalake(
        source, pa.table({"id": pa.array([4], pa.int64()), "name": ["n4"]}), mode="append"
    )
    latest, first = tables / "clone_latest", tables / "clone_first"
    counts = client.run(
        f"""
        table = DeltaTable.forPath(spark, {source!r})
        result = [table.clone({str(latest)!r}, isShallow=True).toDF().count(),
                  table.cloneAtVersion(0, {str(first)!r}, isShallow=True).toDF().count()]
        """
    )
    assert counts == [4, 3]
    assert [h["operation"] for h in DeltaRsTable(str(first)).history()] == ["CLONE"]


def test_catalog_writes_evolve_the_schema_over_connect(client: Client, tables: Path) -> None:
    """A Connect client's saveAsTable / writeTo with mergeSchema, and its SQL INSERT under
    autoMerge, add the new columns to a catalog table on the server."""
    path = tables / "evolved"
    client.run(
        f"""
        spark.sql("CREATE TABLE evolved (id BIGINT, name STRING) USING delta LOCATION '{path}'")
        spark.createDataFrame([(1, "a", 1)], "id long, name string, a int").write.format(
            "delta").mode("append").option("mergeSchema", "true").saveAsTable("evolved")
        spark.createDataFrame([("b", 2, "x")], "name string, id long, b string").writeTo(
            "evolved").option("mergeSchema", "true").append()
        spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
        try:
            spark.sql("INSERT INTO evolved BY NAME SELECT 3 AS id, 'c' AS name, 3.5D AS c")
        finally:
            spark.conf.unset("spark.databricks.delta.schema.autoMerge.enabled")
        result = None
        """
    )
    data = DeltaRsTable(str(path)).to_pyarrow_table()
    assert data.column_names == ["id", "name", "a", "b", "c"]
    assert sorted(zip(*data.to_pydict().values(), strict=True)) == [
        (1, "a", 1, None, None), (2, "b", None, "x", None), (3, "c", None, None, 3.5)
    ]  # fmt: skip


@pytest.mark.skipif(
    tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (4, 2),
    reason="pyspark's trigger(realTime=...) came with 4.2 (4.1 has it on the JVM only)",
)
def test_a_real_time_query_from_a_delta_table_into_another(client: Client, tables: Path) -> None:
    """A Connect client runs a real-time query Delta -> Delta on the server: rows committed
    while it runs land in the target once each."""
    source = seeded(tables / "rt_source")
    target, checkpoint = tables / "rt_target", tables / "rt_checkpoint"
    client.run(
        f"""
        spark.conf.set("spark.sql.streaming.realTimeMode.minBatchDuration", "1000")
        spark.conf.set("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
        spark.sql("CREATE TABLE rt_target (id BIGINT, name STRING) USING delta"
                  " LOCATION '{target}'")
        rt_query = (
            spark.readStream.format("delta").load({source!r})
            .writeStream.outputMode("update")
            .option("checkpointLocation", {str(checkpoint)!r})
            .trigger(realTime="2 seconds")
            .toTable("rt_target")
        )
        result = rt_query.isActive
        """
    )
    for first in (4, 7):
        ids = list(range(first, first + 3))
        write_deltalake(
            source,
            pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}),
            mode="append",
        )

    def landed() -> list[int]:
        if not (target / "_delta_log").exists():
            return []
        return sorted(DeltaRsTable(str(target)).to_pyarrow_table().column("id").to_pylist())

    try:
        wait_until(lambda: len(landed()) >= 9, 180, "nine rows in the real-time target")
        assert landed() == list(range(1, 10))
    finally:
        failure = client.run("rt_query.stop(); result = repr(rt_query.exception())")
    assert failure == "None"
