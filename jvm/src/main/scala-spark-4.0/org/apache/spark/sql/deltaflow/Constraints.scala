package org.apache.spark.sql.deltaflow

import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.connector.catalog.{Identifier, TableCatalog, TableChange}

/**
 * Spark 4.0 has no constraint plans or table changes (Spark 4.1 added them: see
 * `scala-spark-4.1+/.../Constraints.scala`): its parser refuses ALTER TABLE ... ADD
 * CONSTRAINT, so there is nothing to translate. CHECK constraints that a table already
 * has are still enforced on every write (the brain reads them from the log).
 */
object Constraints {
  /** Spark parses ALTER TABLE ... ADD CONSTRAINT / DROP CONSTRAINT on this Spark. */
  val parsedBySpark: Boolean = false

  def describe(change: TableChange, node: ObjectNode): Boolean = false

  def alterRule(
      deltaTableOf: LogicalPlan => Option[(TableCatalog, Identifier)],
      alter: (TableCatalog, Identifier, Seq[TableChange]) => LogicalPlan)
    : PartialFunction[LogicalPlan, LogicalPlan] = PartialFunction.empty
}
