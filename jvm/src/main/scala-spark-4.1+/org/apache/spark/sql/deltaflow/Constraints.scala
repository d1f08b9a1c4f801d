package org.apache.spark.sql.deltaflow

import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.sql.catalyst.plans.logical.{AddCheckConstraint, DropConstraint, LogicalPlan}
import org.apache.spark.sql.connector.catalog.{Identifier, TableCatalog, TableChange}
import org.apache.spark.sql.connector.catalog.TableChange.{AddConstraint, DropConstraint => DropConstraintChange}
import org.apache.spark.sql.connector.catalog.constraints.{Check, Constraint}

/**
 * CHECK constraints through Spark's own ALTER TABLE plans and table changes, which Spark
 * 4.1 added (`ADD CONSTRAINT`, `DROP CONSTRAINT`, `TableChange.AddConstraint`,
 * `connector.catalog.constraints`). Compiled for Spark 4.1 and newer; Spark 4.0 gets
 * `scala-spark-4.0/.../Constraints.scala` (docs/architecture.md, "Every Spark 4.x").
 */
object Constraints {
  /** Spark parses ALTER TABLE ... ADD CONSTRAINT / DROP CONSTRAINT on this Spark. */
  val parsedBySpark: Boolean = true

  /** Writes `change` as the brain's JSON into `node` if it is a constraint change. */
  def describe(change: TableChange, node: ObjectNode): Boolean = change match {
    case c: AddConstraint =>
      node.put("op", "addConstraint")
      node.put("name", c.constraint().name())
      c.constraint() match {
        case check: Check =>
          node.put("kind", "check")
          node.put("expression", Option(check.predicateSql()).getOrElse(check.toDDL))
        case other =>
          node.put("kind", other.getClass.getSimpleName.toLowerCase)
          node.put("expression", other.toDDL)
      }
      true
    case c: DropConstraintChange =>
      node.put("op", "dropConstraint")
      node.put("name", c.name())
      node.put("ifExists", c.ifExists())
      true
    case _ => false
  }

  /**
   * ADD CONSTRAINT ... CHECK and DROP CONSTRAINT on a Delta table (`deltaTableOf` finds
   * its catalog and identifier in the statement's table) as `alter(catalog, ident,
   * changes)`. Spark resolves the table of ADD CONSTRAINT into a scan of the rows that
   * break the constraint (it would check them itself); the brain asks for that check.
   */
  def alterRule(
      deltaTableOf: LogicalPlan => Option[(TableCatalog, Identifier)],
      alter: (TableCatalog, Identifier, Seq[TableChange]) => LogicalPlan)
    : PartialFunction[LogicalPlan, LogicalPlan] = {
    case add: AddCheckConstraint if deltaTableOf(add.child).isDefined =>
      val (catalog, ident) = deltaTableOf(add.child).get
      val check = add.checkConstraint
      val constraint = Constraint.check(check.name).predicateSql(check.condition).build()
      alter(catalog, ident, Seq(TableChange.addConstraint(constraint, null)))
    case drop: DropConstraint if deltaTableOf(drop.table).isDefined =>
      val (catalog, ident) = deltaTableOf(drop.table).get
      alter(catalog, ident, drop.changes)
  }
}
