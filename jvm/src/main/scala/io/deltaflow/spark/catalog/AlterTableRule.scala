package io.deltaflow.spark.catalog

import org.apache.spark.sql.{Row, SparkSession}
import org.apache.spark.sql.catalyst.analysis.ResolvedTable
import org.apache.spark.sql.catalyst.plans.logical.{AddCheckConstraint, AlterColumns, DropConstraint, LogicalPlan, UnsetTableProperties}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.connector.catalog.{Identifier, TableCatalog, TableChange}
import org.apache.spark.sql.connector.catalog.constraints.Constraint
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
  override def apply(plan: LogicalPlan): LogicalPlan = plan.resolveOperatorsDown {
    // Spark resolves the table of ADD CONSTRAINT into a scan of the rows that break the
    // constraint (it would check them itself); the brain asks for that check instead.
    case AddCheckConstraint(child, check) if deltaTableOf(child).isDefined =>
      val (catalog, ident) = deltaTableOf(child).get
      val constraint = Constraint.check(check.name)
        .predicateSql(check.condition)
        .build()
      DeltaAlterCommand(catalog, ident, Seq(TableChange.addConstraint(constraint, null)))
    case drop @ DropConstraint(ResolvedTable(catalog, ident, _: DeltaTable, _), _, _, _) =>
      DeltaAlterCommand(catalog, ident, drop.changes)
    // Spark does not tell the catalog whether UNSET TBLPROPERTIES said IF EXISTS.
    case UnsetTableProperties(ResolvedTable(catalog, ident, table: DeltaTable, _), keys, false) =>
      DeltaAlterCommand(catalog, ident, keys.map(k => TableChange.removeProperty(k)),
        Some(table))
    case alter @ AlterColumns(ResolvedTable(catalog, ident, _: DeltaTable, _), _, _)
        if alter.resolved =>
      DeltaAlterCommand(catalog, ident, alter.changes)
  }

  private def deltaTableOf(plan: LogicalPlan): Option[(TableCatalog, Identifier)] =
    plan.collectFirst {
      case ResolvedTable(catalog, ident, _: DeltaTable, _) => (catalog, ident)
      case DataSourceV2Relation(_: DeltaTable, _, Some(catalog: TableCatalog), Some(ident), _, _)
        => (catalog, ident)
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
