package io.deltaflow.spark

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation

/**
 * Read options that change what a catalog table *is* for one read:
 * `spark.read.option("readChangeFeed", "true").table(t)` reads the table's change feed,
 * with three more columns. Spark loads a catalog table before it looks at the read's
 * options, so the relation it made has the table's own columns; this rule replaces it
 * with the change feed's relation (delta-spark does the same in its analysis rules).
 * Time travel options need nothing here: Spark hands them to the catalog's `loadTable`.
 */
class ChangeFeedRelations(session: SparkSession) extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = plan.resolveOperatorsDown {
    case relation: DataSourceV2Relation if needsChangeFeed(relation) =>
      val table = relation.table.asInstanceOf[DeltaTable]
      val options = relation.options.asCaseSensitiveMap().asScala.toMap + ("path" -> table.info.uri)
      DataSourceV2Relation.create(DeltaDataSource.tableFor(options.asJava, table.entry),
        relation.catalog, relation.identifier, relation.options, relation.timeTravelSpec)
  }

  private def needsChangeFeed(relation: DataSourceV2Relation): Boolean =
    relation.table.isInstanceOf[DeltaTable] && Seq("readChangeFeed", "readChangeData").exists {
      key => Option(relation.options.get(key)).exists(_.trim.equalsIgnoreCase("true"))
    }
}
