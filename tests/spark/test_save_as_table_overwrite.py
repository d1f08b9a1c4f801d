"""``df.write.mode("overwrite").saveAsTable(t)`` as delta-spark's V1 writer does it, on every
host: it keeps the table's properties and comment (a REPLACE does not), and with
``replaceWhere`` it overwrites only the rows matching the predicate. Classic session and a
Spark Connect client (a server started with only ``deltaflow.spark_conf()``)."""

from __future__ import annotations

import textwrap
import uuid
from urllib.parse import urlparse

import deltalake
import pytest

from deltaflow.errors import typed_error
from deltaflow.spark._compat import PYSPARK_MINOR
from tests.spark.test_hosts import run_connect_client

pytestmark = pytest.mark.slow


def _name() -> str:
    return "sat_" + uuid.uuid4().hex[:8]


def _location(spark, name: str) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    return urlparse(next(r.data_type for r in rows if r.col_name == "Location")).path


def test_classic_overwrite_keeps_properties_and_comment(spark):
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, part STRING) USING delta COMMENT 'kept'"
        " TBLPROPERTIES ('team' = 'ingest', 'delta.enableChangeDataFeed' = 'true')"
    )
    try:
        spark.range(3).selectExpr("id", "'a' AS part").write.format("delta").mode(
            "overwrite"
        ).saveAsTable(name)
        metadata = deltalake.DeltaTable(_location(spark, name)).metadata()
        assert metadata.configuration == {"team": "ingest", "delta.enableChangeDataFeed": "true"}
        assert metadata.description == "kept"
        assert spark.catalog.getTable(name).description == "kept"
        assert spark.table(name).count() == 3
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_classic_replace_where_with_save_as_table_overwrites_only_matching_rows(spark):
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, part STRING) USING delta PARTITIONED BY (part)")
    try:
        spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'a'), (3, 'b')")
        spark.createDataFrame([(10, "a")], "id BIGINT, part STRING").write.format("delta").mode(
            "overwrite"
        ).option("replaceWhere", "part = 'a'").saveAsTable(name)
        rows = sorted((r.id, r.part) for r in spark.table(name).collect())
        assert rows == [(3, "b"), (10, "a")]
        # The data must match the predicate, as delta-spark requires.
        with pytest.raises(Exception) as refused:
            spark.createDataFrame([(11, "b")], "id BIGINT, part STRING").write.format("delta").mode(
                "overwrite"
            ).option("replaceWhere", "part = 'a'").saveAsTable(name)
        assert typed_error(refused.value) is not None, refused.value
        assert sorted((r.id, r.part) for r in spark.table(name).collect()) == rows
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_classic_overwrite_repartitions_only_with_overwrite_schema(spark):
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, a BIGINT, b BIGINT) USING delta PARTITIONED BY (a)")
    rows = spark.range(6).selectExpr("id", "id % 2 AS a", "id % 3 AS b")
    try:
        spark.sql(f"INSERT INTO {name} VALUES (100, 1, 1)")
        location = _location(spark, name)
        # delta-spark's V1 writer: another partitionBy needs overwriteSchema
        # (DELTA_METADATA_MISMATCH), none keeps the table's partitioning.
        with pytest.raises(Exception) as refused:
            rows.write.format("delta").mode("overwrite").partitionBy("b").saveAsTable(name)
        assert type(typed_error(refused.value)).__name__ == "SchemaMismatchError", refused.value
        assert deltalake.DeltaTable(location).version() == 1
        rows.write.format("delta").mode("overwrite").saveAsTable(name)
        assert deltalake.DeltaTable(location).metadata().partition_columns == ["a"]

        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy(
            "b"
        ).saveAsTable(name)
        table = deltalake.DeltaTable(location)
        assert table.metadata().partition_columns == ["b"]
        assert table.history(1)[0]["operation"] == "CREATE OR REPLACE TABLE AS SELECT"
        assert sorted((r.id, r.b) for r in spark.table(name).where("b = 2").collect()) == [
            (2, 2),
            (5, 2),
        ]
        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").saveAsTable(
            name
        )
        assert deltalake.DeltaTable(location).metadata().partition_columns == []
        assert spark.table(name).count() == 6
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_classic_overwrite_enforces_the_schema_unless_asked(spark):
    """A new column or another type is refused and changes nothing; a column left out is
    written as nulls under the table's schema; mergeSchema adds, overwriteSchema replaces
    (delta-spark's V1 writer, tests/reference/test_overwrite_schema_parity.py)."""
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, a BIGINT) USING delta")
    rows = spark.range(3).selectExpr("id", "id % 2 AS a")
    try:
        spark.sql(f"INSERT INTO {name} VALUES (100, 1)")
        location = _location(spark, name)
        for refused_rows in (
            rows.selectExpr("*", "'x' AS c"),
            rows.selectExpr("id", "CAST(a AS STRING) AS a"),
        ):
            with pytest.raises(Exception) as refused:
                refused_rows.write.format("delta").mode("overwrite").saveAsTable(name)
            error = typed_error(refused.value)
            assert type(error).__name__ == "SchemaMismatchError", refused.value
            assert "overwriteSchema" in str(error)  # says what to do
            assert deltalake.DeltaTable(location).version() == 1
            assert [tuple(r) for r in spark.table(name).collect()] == [(100, 1)]

        rows.select("a", "id").write.format("delta").mode("overwrite").saveAsTable(name)
        assert spark.table(name).columns == ["id", "a"]
        rows.select("id").write.format("delta").mode("overwrite").saveAsTable(name)
        assert spark.table(name).columns == ["id", "a"]
        assert sorted(tuple(r) for r in spark.table(name).collect()) == [
            (0, None),
            (1, None),
            (2, None),
        ]
        last = spark.sql(f"DESCRIBE HISTORY {name}").collect()[0]
        assert last.operation == "CREATE OR REPLACE TABLE AS SELECT"
        assert last.operationParameters["isV1SaveAsTableOverwrite"] == "true"
        assert last.operationParameters["description"] is None

        rows.selectExpr("*", "'x' AS c").write.format("delta").mode("overwrite").option(
            "mergeSchema", "true"
        ).saveAsTable(name)
        assert spark.table(name).columns == ["id", "a", "c"]
        rows.selectExpr("CAST(id AS STRING) AS s").write.format("delta").mode("overwrite").option(
            "overwriteSchema", "true"
        ).saveAsTable(name)
        assert spark.table(name).columns == ["s"]
        last = spark.sql(f"DESCRIBE HISTORY {name}").collect()[0]
        assert last.operationParameters["canOverwriteSchema"] == "true"
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


CONNECT_CLIENT = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    import deltaflow

    port = sys.argv[1]
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    spark.sql(
        "CREATE TABLE kept (id BIGINT, part STRING) USING delta COMMENT 'kept'"
        " TBLPROPERTIES ('team' = 'ingest')"
    )
    spark.range(3).selectExpr("id", "'a' AS part").write.format("delta").mode(
        "overwrite"
    ).saveAsTable("kept")
    props = {r.key: r.value for r in spark.sql("SHOW TBLPROPERTIES kept").collect()}
    print("TEAM", props.get("team"))
    print("COMMENT", spark.catalog.getTable("kept").description)
    print("KEPT_ROWS", spark.table("kept").count())
    print("KEPT_AT", spark.sql("DESCRIBE TABLE EXTENDED kept").where(
        "col_name = 'Location'").collect()[0].data_type)
    try:
        spark.range(3).selectExpr("id", "'a' AS part", "1 AS extra").write.format(
            "delta").mode("overwrite").saveAsTable("kept")
        print("NEW_COLUMN written")
    except Exception as exc:
        print("NEW_COLUMN refused", type(deltaflow.typed_error(exc)).__name__)
    print("KEPT_COLUMNS", spark.table("kept").columns)

    def replace_where(label, rows):
        try:
            spark.createDataFrame(rows, "id BIGINT, part STRING").write.format("delta").mode(
                "overwrite"
            ).option("replaceWhere", "part = 'a'").saveAsTable("parts")
            print(label, "written")
        except Exception as exc:
            error = deltaflow.typed_error(exc)
            print(label, "refused", type(error).__name__, getattr(error, "feature", ""))
        print(label, "ROWS", sorted((r.id, r.part) for r in spark.table("parts").collect()))

    spark.sql("CREATE TABLE parts (id BIGINT, part STRING) USING delta PARTITIONED BY (part)")
    spark.sql("INSERT INTO parts VALUES (1, 'a'), (2, 'a'), (3, 'b')")
    # The server has no Python data source until a client registers it (issue 26 part 2).
    replace_where("BARE", [(10, "a")])
    from deltaflow.spark._source import DeltaDataSource

    spark.dataSource.register(DeltaDataSource)
    replace_where("REGISTERED", [(10, "a")])
    replace_where("MISMATCH", [(11, "b")])
    spark.stop()
    """
)


def test_a_connect_client_keeps_metadata_and_replaces_where(tmp_path):
    result, log = run_connect_client(tmp_path, CONNECT_CLIENT, "unused")
    assert result.returncode == 0, result.stderr[-3000:] + log
    out = result.stdout.splitlines()
    assert "TEAM ingest" in out, result.stdout
    assert "COMMENT kept" in out, result.stdout
    assert "KEPT_ROWS 3" in out, result.stdout
    if PYSPARK_MINOR >= (4, 1):  # Spark 4.0 marks saveAsTable's overwrite only in classic
        assert "NEW_COLUMN refused SchemaMismatchError" in out, result.stdout
        assert "KEPT_COLUMNS ['id', 'part']" in out, result.stdout
    location = urlparse(next(x for x in out if x.startswith("KEPT_AT ")).split(" ", 1)[1]).path
    metadata = deltalake.DeltaTable(location).metadata()
    assert metadata.configuration == {"team": "ingest"}
    assert metadata.description == "kept"
    # Never "replaceWhere and overwriteSchema cannot be used together": without the Python
    # data source on the server, the write is refused for that reason alone, typed.
    bare = next(x for x in out if x.startswith("BARE ") and " ROWS " not in x)
    assert bare in ("BARE written", "BARE refused UnsupportedFeatureError pythonDataSource"), bare
    assert "REGISTERED written" in out, result.stdout
    assert "REGISTERED ROWS [(3, 'b'), (10, 'a')]" in out, result.stdout
    assert any(x.startswith("MISMATCH refused") for x in out), result.stdout
    assert "MISMATCH ROWS [(3, 'b'), (10, 'a')]" in out, result.stdout
