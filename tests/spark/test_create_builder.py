"""DeltaTable.create / createIfNotExists / replace / createOrReplace, and CREATE TABLE (cols)."""

from __future__ import annotations

import decimal
import os
import threading
import uuid

import deltalake
import polars as pl
import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql.types import (
    ArrayType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from deltaflow import DeltaTable
from deltaflow.errors import InvalidOptionError
from deltaflow.spark.catalog._jvm_catalog import (
    create_database_if_missing,
    register_external,
    table_in_catalog,
)
from deltaflow.table.errors import (
    GeneratedColumnError,
    SchemaMismatchError,
    TableAlreadyExistsError,
    TableNotFoundError,
)


def _name() -> str:
    return "cb_" + uuid.uuid4().hex[:8]


@pytest.fixture
def database(spark, tmp_path):
    """A database whose location is this test's temp dir (managed tables land there)."""
    name = "db_" + uuid.uuid4().hex[:8]
    spark.sql(f"CREATE DATABASE {name} LOCATION '{tmp_path / name}'")
    yield name
    spark.sql(f"DROP DATABASE {name} CASCADE")


def _fields(path: str) -> list[tuple[str, str, bool]]:
    schema = pa.schema(deltalake.DeltaTable(path).schema().to_arrow())
    return [(f.name, str(f.type), f.nullable) for f in schema]


def test_create_at_a_location_with_types_partitions_properties_and_comment(spark, table_path):
    path = table_path("created")
    table = (
        DeltaTable.create(spark)
        .location(path)
        .addColumn("id", "BIGINT", nullable=False, comment="the key")
        .addColumn("price", "DECIMAL(10,2)")
        .addColumn("tags", "ARRAY<STRING>")
        .addColumn("attrs", MapType(StringType(), LongType()))
        .addColumn("ts", TimestampType())
        .addColumn("kind", "STRING")
        .partitionedBy("kind")
        .property("delta.enableChangeDataFeed", "true")
        .property("owner.team", "data")
        .comment("orders, one row per order")
        .execute()
    )

    detail = table.detail().first()
    assert detail.description == "orders, one row per order"
    assert detail.partitionColumns == ["kind"]
    assert detail.properties == {"delta.enableChangeDataFeed": "true", "owner.team": "data"}
    assert detail.numFiles == 0
    assert [h.version for h in table.history().collect()] == [0]

    log_table = deltalake.DeltaTable(path)
    assert log_table.version() == 0
    assert log_table.metadata().partition_columns == ["kind"]
    assert log_table.metadata().description == "orders, one row per order"
    schema = log_table.schema()
    assert schema.fields[0].metadata == {"comment": "the key"}
    assert _fields(path) == [
        ("id", "int64", False),
        ("price", "decimal128(10, 2)", True),
        ("tags", "list<element: string>", True),
        ("attrs", "map<string, int64>", True),
        ("ts", "timestamp[us, tz=UTC]", True),
        ("kind", "string", True),
    ]
    assert pl.read_delta(path).height == 0

    rows = spark.createDataFrame(
        [(1, decimal.Decimal("2.50"), ["a"], {"x": 1}, None, "k")], table.toDF().schema
    )
    rows.write.format("delta").mode("append").save(path)
    frame = pl.read_delta(path)
    assert frame.select("id", "kind").rows() == [(1, "k")]
    assert frame["price"].to_list() == [decimal.Decimal("2.50")]
    assert os.path.isdir(os.path.join(path, "kind=k"))


def test_session_defaults_apply_to_builder_tables_unless_set(spark, table_path):
    """delta-spark's ``spark.databricks.delta.properties.defaults.*`` reach tables the
    builder creates; a property the builder sets itself wins."""
    prefix = "spark.databricks.delta.properties.defaults."
    spark.conf.set(prefix + "appendOnly", "true")
    spark.conf.set(prefix + "enableChangeDataFeed", "true")
    try:
        defaulted, explicit = table_path("defaulted"), table_path("explicit")
        DeltaTable.create(spark).location(defaulted).addColumn("id", "INT").execute()
        (
            DeltaTable.create(spark)
            .location(explicit)
            .addColumn("id", "INT")
            .property("delta.appendOnly", "false")
            .execute()
        )
    finally:
        spark.conf.unset(prefix + "appendOnly")
        spark.conf.unset(prefix + "enableChangeDataFeed")
    assert deltalake.DeltaTable(defaulted).metadata().configuration == {
        "delta.appendOnly": "true",
        "delta.enableChangeDataFeed": "true",
    }
    assert deltalake.DeltaTable(explicit).metadata().configuration == {
        "delta.appendOnly": "false",
        "delta.enableChangeDataFeed": "true",
    }


def test_add_columns_takes_a_struct_type_or_fields(spark, table_path):
    path = table_path("fields")
    schema = StructType([StructField("a", LongType(), False), StructField("b", StringType())])
    extra = [StructField("c", ArrayType(LongType()))]
    DeltaTable.create(spark).location(path).addColumns(schema).addColumns(extra).execute()
    assert _fields(path) == [
        ("a", "int64", False),
        ("b", "string", True),
        ("c", "list<element: int64>", True),
    ]


def test_create_with_a_name_registers_the_table_in_the_catalog(spark, table_path):
    path, name = table_path("named"), _name()
    table = (
        DeltaTable.create(spark)
        .tableName(name)
        .location(path)
        .addColumn("id", "INT")
        .addColumn("s", "STRING")
        .execute()
    )
    assert table.detail().first().name == f"spark_catalog.default.{name}"  # as delta-spark
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b')")
    assert sorted(r.id for r in spark.table(name).collect()) == [1, 2]
    assert spark.sql(f"SELECT s FROM {name} WHERE id = 2").first().s == "b"
    assert DeltaTable.forName(spark, name).toDF().count() == 2
    assert deltalake.DeltaTable(path).to_pyarrow_table().num_rows == 2


def _entry(spark, name: str) -> dict[str, str]:
    """The session catalog's entry for ``name``, as the fields DESCRIBE / SHOW / DROP use."""
    state = spark._jsparkSession.sessionState()
    entry = state.catalog().getTableMetadata(state.sqlParser().parseTableIdentifier(name))
    return {
        "type": entry.tableType().name(),
        "provider": str(entry.provider().get()),
        "location": str(entry.location()),
        "storage": entry.storage().toString(),
        "schema": entry.schema().json(),
        "properties": entry.properties().toString(),
        "owner": entry.owner(),
        "comment": str(entry.comment()),
    }


@pytest.mark.parametrize("uri", [False, True], ids=["path", "uri"])
def test_a_named_table_at_a_location_gets_the_entry_create_table_location_makes(
    spark, table_path, uri
):
    """The builder registers without a SQL statement (one call to the connector's
    catalog): the entry is the one CREATE TABLE ... USING delta LOCATION makes."""
    built, by_sql = _name(), _name()
    path = table_path("entry")
    location = f"file://{path}" if uri else path
    (
        DeltaTable.createIfNotExists(spark)
        .tableName(f"default.{built}")
        .location(location)
        .addColumn("id", "BIGINT")
        .comment("in the log, not the entry")
        .execute()
    )
    spark.sql(f"CREATE TABLE {by_sql} USING delta LOCATION '{location}'")
    assert _entry(spark, built) == _entry(spark, by_sql)
    # The call itself, from a thread with no active session (as pipelines make it).
    direct, done = _name(), []
    thread = threading.Thread(
        target=lambda: done.append(
            register_external(spark, f"spark_catalog.default.{direct}", location)
        )
    )
    thread.start()
    thread.join(timeout=60)
    assert done == [True]
    assert _entry(spark, direct) == _entry(spark, by_sql)
    spark.sql(f"DROP TABLE {direct}")
    assert _entry(spark, built)["type"] == "EXTERNAL"
    described = {
        r.col_name: r.data_type for r in spark.sql(f"DESCRIBE TABLE EXTENDED {built}").collect()
    }
    assert described["Type"] == "EXTERNAL"
    assert described["Provider"] == "delta"
    assert described["Location"] == f"file://{path}"
    assert described["Comment"] == "in the log, not the entry"
    assert built in {r.tableName for r in spark.sql("SHOW TABLES IN default").collect()}
    with pytest.raises(TableAlreadyExistsError):
        DeltaTable.create(spark).tableName(built).location(location).addColumn(
            "id", "BIGINT"
        ).execute()
    spark.sql(f"DROP TABLE {built}")
    spark.sql(f"DROP TABLE {by_sql}")
    assert not spark.catalog.tableExists(built)
    assert deltalake.DeltaTable(path).version() == 0  # external: dropping kept the table


def test_a_named_table_on_an_object_store_gets_the_entry_create_table_makes(spark, object_store):
    """A scheme Hadoop cannot open here (s3://) is kept as written, as the statement does."""
    uri, built, by_sql = object_store.uri(), _name(), _name()
    DeltaTable.createIfNotExists(spark).tableName(built).location(uri).addColumn(
        "id", "BIGINT"
    ).execute()
    spark.sql(f"CREATE TABLE {by_sql} USING delta LOCATION '{uri}'")
    try:
        assert _entry(spark, built) == _entry(spark, by_sql)
        assert _entry(spark, built)["location"].startswith("s3://")
    finally:
        spark.sql(f"DROP TABLE {built}")
        spark.sql(f"DROP TABLE {by_sql}")


def test_the_catalog_look_up_answers_as_spark_catalog_table_exists(spark, table_path):
    name = _name()
    DeltaTable.create(spark).tableName(name).location(table_path("t")).addColumn(
        "id", "INT"
    ).execute()
    spark.range(1).createOrReplaceTempView(f"{name}_view")
    spark.range(1).createOrReplaceGlobalTempView(f"{name}_global")
    names = [
        f"default.{name}",
        f"DEFAULT.{name.upper()}",
        f"default.{name}_missing",
        f"no_such_db_{name}.{name}",
        name,
        f"{name}_view",
        f"default.{name}_view",
        f"global_temp.{name}_global",
        f"spark_catalog.default.{name}",
    ]
    try:
        assert [table_in_catalog(spark, n) for n in names] == [
            spark.catalog.tableExists(n) for n in names
        ]
        assert table_in_catalog(spark, f"default.{name}")
        assert table_in_catalog(spark, f"global_temp.{name}_global")
    finally:
        spark.sql(f"DROP TABLE {name}")
        spark.catalog.dropTempView(f"{name}_view")
        spark.catalog.dropGlobalTempView(f"{name}_global")


def test_a_database_made_by_the_catalog_call_is_the_one_create_database_makes(spark):
    by_call, by_sql = f"db_{uuid.uuid4().hex[:8]}", f"db_{uuid.uuid4().hex[:8]}"
    catalog = spark._jsparkSession.sessionState().catalog()
    try:
        access = spark._jvm.org.apache.spark.sql.deltaflow.CatalogAccess
        assert access.createDatabaseIfMissing(spark._jsparkSession, by_call) is True
        assert access.createDatabaseIfMissing(spark._jsparkSession, by_call) is False
        create_database_if_missing(spark, by_call)  # exists: nothing happens
        spark.sql(f"CREATE DATABASE {by_sql}")
        made, expected = catalog.getDatabaseMetadata(by_call), catalog.getDatabaseMetadata(by_sql)
        assert str(made.locationUri()) == str(expected.locationUri()).replace(by_sql, by_call)
        assert made.properties().toString() == expected.properties().toString()
        assert made.description() == expected.description()
        assert spark.catalog.databaseExists(by_call)
    finally:
        spark.sql(f"DROP DATABASE IF EXISTS {by_call}")
        spark.sql(f"DROP DATABASE IF EXISTS {by_sql}")


def test_a_name_without_location_is_a_table_in_the_database_location(spark, database, tmp_path):
    name = f"{database}.Events"
    table = DeltaTable.create(spark).tableName(name).addColumn("id", "LONG").execute()
    expected = tmp_path / database / "events"
    assert (expected / "_delta_log").is_dir()
    assert table.detail().first().location == f"file://{expected}"
    spark.sql(f"INSERT INTO {name} VALUES (0), (1), (2)")
    assert spark.table(name).count() == 3
    assert pl.read_delta(str(expected))["id"].sort().to_list() == [0, 1, 2]


def test_create_fails_when_the_table_exists(spark, table_path):
    path, name = table_path("exists"), _name()
    DeltaTable.create(spark).tableName(name).location(path).addColumn("id", "INT").execute()

    with pytest.raises(TableAlreadyExistsError) as by_path:
        DeltaTable.create(spark).location(path).addColumn("id", "INT").execute()
    assert by_path.value.table_uri == f"file://{path}"
    with pytest.raises(TableAlreadyExistsError) as by_name:
        DeltaTable.create(spark).tableName(name).addColumn("id", "INT").execute()
    assert by_name.value.table_uri == name
    assert deltalake.DeltaTable(path).version() == 0


def test_create_if_not_exists_keeps_an_existing_table(spark, table_path):
    path, name = table_path("keep"), _name()
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumn("id", "LONG")
    builder.execute()
    deltalake.write_deltalake(path, pa.table({"id": pa.array([7], pa.int64())}), mode="append")

    again = builder.addColumn("other", "STRING").execute()
    assert deltalake.DeltaTable(path).version() == 1
    assert again.toDF().collect()[0].id == 7
    assert [f.name for f in again.toDF().schema.fields] == ["id"]

    by_name = DeltaTable.createIfNotExists(spark).tableName(name).location(path).execute()
    assert spark.table(name).count() == 1
    assert DeltaTable.createIfNotExists(spark).tableName(name).execute().toDF().count() == 1
    assert by_name.detail().first().name == f"spark_catalog.default.{name}"


def test_create_or_replace_commits_new_metadata_and_removes_every_file(spark, table_path):
    path, name = table_path("replace"), _name()
    deltalake.write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64())}))
    deltalake.write_deltalake(path, pa.table({"id": pa.array([3], pa.int64())}), mode="append")
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{path}'")

    replaced = (
        DeltaTable.createOrReplace(spark)
        .tableName(name)
        .addColumn("key", "STRING")
        .addColumn("day", "DATE")
        .partitionedBy("day")
        .comment("replaced")
        .execute()
    )
    log_table = deltalake.DeltaTable(path)
    assert log_table.version() == 2
    assert log_table.to_pyarrow_table().num_rows == 0
    assert log_table.metadata().partition_columns == ["day"]
    assert [f[0] for f in _fields(path)] == ["key", "day"]
    assert [h.version for h in replaced.history().collect()] == [2, 1, 0]
    assert spark.read.format("delta").option("versionAsOf", 1).load(path).count() == 3
    # The catalog follows the new schema.
    assert spark.table(name).columns == ["key", "day"]
    spark.sql(f"INSERT INTO {name} VALUES ('a', DATE'2025-01-02')")
    assert spark.table(name).first().key == "a"

    # Replacing a table that is not there creates it.
    fresh = table_path("fresh")
    DeltaTable.createOrReplace(spark).location(fresh).addColumn("x", "INT").execute()
    assert deltalake.DeltaTable(fresh).version() == 0


def test_replace_needs_an_existing_table(spark, table_path):
    path = table_path("missing")
    with pytest.raises(TableNotFoundError) as info:
        DeltaTable.replace(spark).location(path).addColumn("x", "INT").execute()
    assert info.value.table_uri == f"file://{path}"
    assert not os.path.exists(path)


def test_naming_an_existing_location_registers_it_if_the_columns_match(spark, table_path):
    path = table_path("existing")
    deltalake.write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    name = _name()
    DeltaTable.create(spark).tableName(name).location(path).addColumn("id", "LONG").execute()
    assert spark.table(name).count() == 1

    with pytest.raises(SchemaMismatchError) as info:
        (
            DeltaTable.create(spark)
            .tableName(_name())
            .location(path)
            .addColumn("id", "STRING")
            .execute()
        )
    assert info.value.columns == ("id",)


@pytest.mark.parametrize(
    ("build", "error", "field", "value"),
    [
        (lambda b: b.addColumn("g", "INT", generatedAlwaysAs="nope + 1").execute(),
         GeneratedColumnError, "reason", "invalidExpression"),
        (lambda b: b.addColumn("x", "NOT A TYPE"), InvalidOptionError, "option", "dataType"),
        (lambda b: b.addColumn("v", "INT").partitionedBy("id").clusterBy("v").execute(),
         InvalidOptionError, "option", "clusterBy"),
        (lambda b: b.property("delta.enableChangeDataFeeed", "true"), InvalidOptionError,
         "option", "delta.enableChangeDataFeeed"),
        (lambda b: b.partitionedBy("nope").execute(), InvalidOptionError, "option",
         "partitionedBy"),
        (lambda b: b.addColumn("ID", "INT").execute(), InvalidOptionError, "option", "addColumn"),
        (lambda b: b.partitionedBy("id").execute(), InvalidOptionError, "option",
         "partitionedBy"),
    ],
)  # fmt: skip
def test_bad_declarations_raise_typed_errors(spark, table_path, build, error, field, value):
    path = table_path("bad")
    with pytest.raises(error) as info:
        build(DeltaTable.create(spark).location(path).addColumn("id", "INT"))
    assert getattr(info.value, field) == value
    assert not os.path.exists(path)


def test_a_table_needs_a_location_or_name_and_columns(spark, table_path):
    with pytest.raises(InvalidOptionError) as nowhere:
        DeltaTable.create(spark).addColumn("id", "INT").execute()
    assert nowhere.value.option == "location"
    with pytest.raises(InvalidOptionError) as no_columns:
        DeltaTable.create(spark).location(table_path("empty")).execute()
    assert no_columns.value.option == "addColumn"


def test_the_builder_adds_to_itself_as_delta_sparks_does(spark, table_path):
    # delta-spark's builder changes in place and returns itself: a call whose result is
    # not used still counts (delta-spark's own tests rely on it).
    path = table_path("in_place")
    builder = DeltaTable.create(spark).location(path).addColumn("id", "INT")
    same = builder.addColumn("extra", "STRING")
    builder.clusterBy("id")
    assert same is builder
    builder.execute()
    assert [f[0] for f in _fields(path)] == ["id", "extra"]
    assert DeltaTable.forPath(spark, path).detail().first().clusteringColumns == ["id"]
    assert builder.spec.clustering_columns == ("id",)


def test_the_scala_builder_view_takes_a_scala_seq(spark, table_path):
    # delta-spark code may call the Scala builder behind the Python one: _jbuilder.
    from pyspark.sql.classic.column import _to_seq

    path = table_path("jbuilder")
    builder = DeltaTable.create(spark).location(path).addColumn("p", "INT")
    builder = builder.addColumn("v", "STRING")
    builder._jbuilder = builder._jbuilder.partitionedBy(_to_seq(spark.sparkContext, ["p"]))
    builder.execute()
    assert deltalake.DeltaTable(path).metadata().partition_columns == ["p"]


def test_sql_create_table_with_columns_creates_the_delta_table(spark, table_path):
    path, name = table_path("sql"), _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT NOT NULL, amount DECIMAL(12, 3), day STRING)"
        f" USING delta PARTITIONED BY (day) LOCATION '{path}' COMMENT 'from sql'"
        " TBLPROPERTIES ('delta.appendOnly' = 'true')"
    )
    log_table = deltalake.DeltaTable(path)
    assert log_table.metadata().partition_columns == ["day"]
    assert log_table.metadata().configuration == {"delta.appendOnly": "true"}
    assert log_table.metadata().description == "from sql"
    assert _fields(path)[0] == ("id", "int64", False)
    spark.sql(f"INSERT INTO {name} VALUES (1, 2.5, 'mon')")
    assert spark.table(name).first().amount == decimal.Decimal("2.500")

    # IF NOT EXISTS keeps it; without, it is an error.
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name} (x INT) USING delta LOCATION '{path}'")
    assert deltalake.DeltaTable(path).version() == 1
    # Spark's own check, as with delta-spark: the catalog has the name already.
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_ALREADY_EXISTS"):
        spark.sql(f"CREATE TABLE {name} (x INT) USING delta LOCATION '{path}'")
