"""Writes to catalog tables: ``INSERT INTO`` / ``INSERT OVERWRITE`` and ``insertInto``.

Spark hands a Python data source neither options nor the target table when it writes a
catalog table: only the *query's* schema. deltaflow keeps a table's location in the
catalog schema's field metadata (``_source.with_location``), but a query's columns carry
the metadata of the table they were *read* from, so ``INSERT INTO dst SELECT * FROM src``
would reach the source with ``src``'s location — and a query with no such columns
(``SELECT id FROM range(3)``) with none. The destination is only known where the user
named it, so deltaflow takes these writes over there:

* ``spark.sql("INSERT INTO|OVERWRITE [TABLE] t [(cols)] [BY NAME] <query>")`` — Spark's
  parser reads the statement; for a deltaflow table the query runs as a DataFrame, its
  columns are matched to the table's (by position, by the column list, or by name),
  cast to the table's types as Spark's store assignment does, and written with
  ``df.write.format("delta").mode("append" | "overwrite").save(location)``;
* ``df.write.insertInto(t, overwrite)`` — the same, by position.

Every other catalog write route (``DataFrameWriterV2``, ``saveAsTable`` on an existing
table, parameterized ``spark.sql``) is refused by the source with a typed error rather
than guessed: see ``_source.DeltaDataSource.writer``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaflow.errors import InvalidOptionError
from deltaflow.table.errors import SchemaMismatchError, UnsupportedFeatureError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def catalog_location(spark: SparkSession, name: str) -> str | None:
    """The Delta location of catalog table ``name``, or None if it is not a deltaflow table."""
    from deltaflow.spark._source import table_location

    try:
        if not spark.catalog.tableExists(name):
            return None
        return table_location(spark, name)
    except Exception:  # not a table Spark can resolve: not ours to take over
        return None


def insert_from_sql(spark: SparkSession, statement: str) -> DataFrame | None:
    """Run ``statement`` if it is an INSERT into a deltaflow table; None otherwise."""
    if "insert" not in statement.lower():
        return None
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)
    except Exception:
        return None  # Spark reports the syntax error when it runs the statement itself
    if plan.getClass().getSimpleName() != "InsertIntoStatement":
        return None
    table = plan.table()
    if table.getClass().getSimpleName() != "UnresolvedRelation":
        return None
    name = str(table.tableName())
    location = catalog_location(spark, name)
    if location is None:
        return None
    if not plan.partitionSpec().isEmpty():
        raise UnsupportedFeatureError(
            f"INSERT INTO {name} PARTITION (...): static partition specs are not supported"
            " for deltaflow tables yet. Put the partition values in the query instead, e.g."
            " INSERT INTO t SELECT a, b, 'x' AS p FROM ...",
            table_uri=location,
            feature="insertPartitionSpec",
        )
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

    jdf = spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan.query())
    query = ClassicDataFrame(jdf, spark)
    columns = [str(c) for c in scala_list(plan.userSpecifiedCols())]
    write(spark, name, location, query, bool(plan.overwrite()), columns, bool(plan.byName()))
    return spark.range(0).select()  # what INSERT returns: nothing


def write(
    spark: SparkSession,
    name: str,
    location: str,
    query: DataFrame,
    overwrite: bool,
    columns: list[str] | None = None,
    by_name: bool = False,
) -> None:
    """Write ``query`` into the table at ``location`` with INSERT's column matching."""
    target = spark.read.format("delta").load(location).schema
    aligned = _align(name, location, query, target, columns or [], by_name)
    aligned.write.format("delta").mode("overwrite" if overwrite else "append").save(location)


def _align(
    name: str,
    location: str,
    query: DataFrame,
    target: Any,
    columns: list[str],
    by_name: bool,
) -> DataFrame:
    from pyspark.sql import functions as F

    fields = {f.name.lower(): f for f in target.fields}
    positional = [f"__deltaflow_c{i}" for i in range(len(query.columns))]
    if by_name:
        given = {c.lower(): p for c, p in zip(query.columns, positional, strict=True)}
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise SchemaMismatchError(
                f"INSERT INTO {name} BY NAME: the query has columns the table lacks:"
                f" {', '.join(unknown)}. Table columns: {', '.join(target.names)}.",
                table_uri=location,
                columns=tuple(unknown),
            )
    else:
        names = columns or target.names
        unknown = sorted({c.lower() for c in names} - set(fields))
        if unknown:
            raise SchemaMismatchError(
                f"INSERT INTO {name}: no such column(s) {', '.join(unknown)}; the table has"
                f" {', '.join(target.names)}.",
                table_uri=location,
                columns=tuple(unknown),
            )
        if len(names) != len(positional):
            raise SchemaMismatchError(
                f"INSERT INTO {name}: the query gives {len(positional)} column(s) but"
                f" {len(names)} are expected ({', '.join(names)}). List the columns you"
                f" insert, e.g. INSERT INTO {name} (a, b) SELECT ..., or use BY NAME.",
                table_uri=location,
                columns=tuple(names),
            )
        given = {c.lower(): p for c, p in zip(names, positional, strict=True)}
    renamed = query.toDF(*positional)
    return renamed.select(
        *(
            F.col(given[f.name.lower()]).cast(f.dataType).alias(f.name)
            if f.name.lower() in given
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in target.fields
        )
    )


def refuse_unrouted_write(location: str) -> InvalidOptionError:
    """The error for a catalog write Spark routed without telling us the destination."""
    return InvalidOptionError(
        f"Spark asked deltaflow to write a catalog table without naming it (the query's"
        f" columns point at {location}, which may be the table it reads from). Write to"
        " deltaflow catalog tables with spark.sql('INSERT INTO t ...'), df.write.insertInto(t),"
        " or df.write.format('delta').mode(...).save('<the table's location>');"
        " DataFrameWriterV2 (df.writeTo) and saveAsTable on an existing table are not"
        " supported yet.",
        option="path",
    )


def scala_list(scala_seq: Any) -> list[Any]:
    """A Scala ``Seq`` (a py4j proxy) as a Python list."""
    iterator = scala_seq.iterator()
    out = []
    while iterator.hasNext():
        out.append(iterator.next())
    return out
