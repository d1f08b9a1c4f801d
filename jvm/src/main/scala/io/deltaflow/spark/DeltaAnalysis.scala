package io.deltaflow.spark

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.Literal
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, OverwriteByExpression, OverwritePartitionsDynamic}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.catalyst.streaming.StreamingRelationV2
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation

/**
 * What Spark's analyzer needs to be told about Delta tables (delta-spark has its own
 * analysis rules for the same needs):
 *
 *  - `spark.read.option("readChangeFeed", "true").table(t)` reads the table's change feed,
 *    with three more columns. Spark loads a catalog table before it looks at the read's
 *    options, so the relation it made has the table's own columns; it is replaced with the
 *    change feed's relation. (Time travel options need nothing here: Spark hands them to
 *    the catalog's `loadTable`.) So does `spark.readStream.option("readChangeFeed", "true")
 *    .table(t)`'s streaming relation.
 *  - A dynamic partition overwrite (`writeTo(t).overwritePartitions()`, `INSERT OVERWRITE`
 *    with `spark.sql.sources.partitionOverwriteMode=dynamic`) needs a V2 batch write in
 *    Spark; Delta tables are written through the V1 write path, so it becomes an
 *    overwrite with delta-spark's write option `partitionOverwriteMode=dynamic`, which
 *    replaces exactly the partitions the rows fall in.
 */
class DeltaAnalysis(session: SparkSession) extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = plan.resolveOperatorsDown {
    case relation: DataSourceV2Relation if readsChangeFeed(relation) =>
      val table = relation.table.asInstanceOf[DeltaTable]
      val options = relation.options.asCaseSensitiveMap().asScala.toMap + ("path" -> table.info.uri)
      val feed = DataSourceV2Relation.create(DeltaDataSource.tableFor(options.asJava, table.entry),
        relation.catalog, relation.identifier, relation.options)
      // copy, not create: the relation's other fields (Spark 4.1+ adds a time travel spec)
      // stay as Spark resolved them.
      relation.copy(table = feed.table, output = feed.output)

    case relation: StreamingRelationV2 if relation.table.isInstanceOf[DeltaTable] &&
        ChangeFeed.requested(relation.extraOptions) =>
      val table = relation.table.asInstanceOf[DeltaTable]
      val options = relation.extraOptions.asCaseSensitiveMap().asScala.toMap + ("path" -> table.info.uri)
      val feed = DeltaDataSource.tableFor(options.asJava, table.entry)
      relation.copy(table = feed, output = DataTypeUtils.toAttributes(feed.schema()))

    case overwrite: OverwritePartitionsDynamic if isDelta(overwrite.table) =>
      val options = overwrite.writeOptions + ("partitionOverwriteMode" -> "dynamic")
      if (overwrite.isByName) {
        OverwriteByExpression.byName(overwrite.table, overwrite.query, Literal(true), options)
      } else {
        OverwriteByExpression.byPosition(overwrite.table, overwrite.query, Literal(true), options)
      }
  }

  private def isDelta(plan: LogicalPlan): Boolean = plan match {
    case relation: DataSourceV2Relation =>
      relation.table.isInstanceOf[DeltaTable] || relation.table.isInstanceOf[LocatedPythonTable]
    case _ => false
  }

  private def readsChangeFeed(relation: DataSourceV2Relation): Boolean =
    relation.table.isInstanceOf[DeltaTable] && Seq("readChangeFeed", "readChangeData").exists {
      key => Option(relation.options.get(key)).exists(_.trim.equalsIgnoreCase("true"))
    }
}
