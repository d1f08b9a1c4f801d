package io.deltaflow.spark.catalog

import org.apache.spark.sql.{Row, SparkSession}
import org.apache.spark.sql.catalyst.analysis.ResolvedTable
import org.apache.spark.sql.catalyst.plans.logical.{AlterColumns, LogicalPlan, UnsetTableProperties}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.connector.catalog.{Identifier, TableCatalog, TableChange}
import org.apache.spark.sql.deltaflow.Constraints
import org.apache.spark.sql.execution.command.LeafRunnableCommand
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation

import io.deltaflow.spark.DeltaTable

/**
 * The ALTER TABLE statements Spark's own analysis would refuse for a Delta table before
 * its catalog sees them, handed to the catalog's `alterTable` (and so to [[AlterTable]])
 * as delta-spark's analysis rules hand them to its commands:
 *
 *  - `ADD CONSTRAINT ... CHECK` and `DROP CONSTRAINT`: Spark wants the catalog to declare
 *    `SUPPORT_TABLE_CONSTRAINT`, and would then enforce the constraints itself on V2
 *    writes only; deltaflow enforces them on every write path instead;
 *  - `ALTER COLUMN` (SET NOT NULL, type changes): Spark refuses SET NOT NULL on V2 tables
 *    and judges type changes by its own rules; Delta's (checked existing rows, type
 *    widening) are the brain's.
 */
class AlterTableRule(session: SparkSession) extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = plan.resolveOperatorsDown(
    // ADD CONSTRAINT ... CHECK and DROP CONSTRAINT (Spark 4.1+; see Constraints).
    Constraints.alterRule(deltaTableOf, DeltaAlterCommand(_, _, _)).orElse {
    // Spark does not tell the catalog whether UNSET TBLPROPERTIES said IF EXISTS.
    case UnsetTableProperties(ResolvedTable(catalog, ident, table: DeltaTable, _), keys, false) =>
      DeltaAlterCommand(catalog, ident, keys.map(k => TableChange.removeProperty(k)),
        Some(table))
    // By its fields, not its pattern: AlterColumns has a third field since Spark 4.1.
    case alter: AlterColumns if alter.resolved && deltaResolvedTable(alter.table).isDefined =>
      val (catalog, ident) = deltaResolvedTable(alter.table).get
      DeltaAlterCommand(catalog, ident, alter.changes)
  })

  private def deltaResolvedTable(plan: LogicalPlan): Option[(TableCatalog, Identifier)] =
    plan match {
      case ResolvedTable(catalog, ident, _: DeltaTable, _) => Some((catalog, ident))
      case _ => None
    }

  private def deltaTableOf(plan: LogicalPlan): Option[(TableCatalog, Identifier)] =
    plan.collectFirst {
      case ResolvedTable(catalog, ident, _: DeltaTable, _) => (catalog, ident)
      // By its fields: DataSourceV2Relation has a sixth field since Spark 4.1.
      case r: DataSourceV2Relation if r.table.isInstanceOf[DeltaTable] &&
          r.catalog.exists(_.isInstanceOf[TableCatalog]) && r.identifier.isDefined =>
        (r.catalog.get.asInstanceOf[TableCatalog], r.identifier.get)
    }
}

/** Runs `changes` through the catalog's `alterTable`, as Spark's `AlterTableExec` does. */
case class DeltaAlterCommand(
    catalog: TableCatalog,
    ident: Identifier,
    changes: Seq[TableChange],
    strictUnset: Option[DeltaTable] = None) extends LeafRunnableCommand {
  override def run(sparkSession: SparkSession): Seq[Row] = {
    strictUnset match {
      // UNSET without IF EXISTS: a missing property is an error, which only the brain
      // can tell (the log is the table), so it is told.
      case Some(table) => AlterTable(table.info.uri, table.name(), changes, strictUnset = true)
      case None => catalog.alterTable(ident, changes: _*)
    }
    Seq.empty
  }
}
