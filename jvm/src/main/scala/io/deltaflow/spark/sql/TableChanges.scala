package io.deltaflow.spark.sql

import org.apache.spark.sql.catalyst.FunctionIdentifier
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

import io.deltaflow.spark.DeltaflowException

/**
 * `table_changes('<table>', start [, end])` and `table_changes_by_path('<path>', start
 * [, end])`: a table's change data feed as a table-valued function, as delta-spark's. It
 * is the change-feed read (`readChangeFeed`), whose versions or timestamps (`start`,
 * `end`: a version number, or a timestamp string) go in as `startingVersion` /
 * `startingTimestamp` and `endingVersion` / `endingTimestamp`. Change-feed reads run on
 * deltaflow's Python data source, so they need a PySpark session.
 */
private[spark] object TableChanges {
  def functions: Seq[(FunctionIdentifier, ExpressionInfo, Seq[Expression] => LogicalPlan)] =
    Seq(
      (FunctionIdentifier("table_changes"),
        new ExpressionInfo(getClass.getName, "table_changes"),
        (args: Seq[Expression]) => plan("table_changes", args, byPath = false)),
      (FunctionIdentifier("table_changes_by_path"),
        new ExpressionInfo(getClass.getName, "table_changes_by_path"),
        (args: Seq[Expression]) => plan("table_changes_by_path", args, byPath = true)))

  private def plan(function: String, args: Seq[Expression], byPath: Boolean): LogicalPlan = {
    val usage = s"$function('<${if (byPath) "path" else "table"}>', <start version or " +
      "timestamp> [, <end version or timestamp>])"
    if (args.length < 2 || args.length > 3) {
      throw invalid(s"$function takes 2 or 3 arguments, got ${args.length}. Usage: $usage.")
    }
    val values = args.map { e =>
      if (!e.foldable) throw invalid(s"$function arguments must be constants. Usage: $usage.")
      Option(e.eval()).map(_.toString).getOrElse(
        throw invalid(s"$function arguments must not be NULL. Usage: $usage."))
    }
    val table = values.head
    val ref = if (byPath) PathRef(table)
      else NameRef(DeltaSqlParserAccess.parts(table))
    val resolved = DeltaTables.resolve(ref, function)
    def bound(value: String, prefix: String): (String, String) =
      if (value.nonEmpty && value.forall(_.isDigit)) s"${prefix}Version" -> value
      else s"${prefix}Timestamp" -> value
    val options = Map("readChangeFeed" -> "true") + bound(values(1), "starting") ++
      values.lift(2).map(bound(_, "ending"))
    val session = org.apache.spark.sql.classic.SparkSession.active
    session.read.format("delta").options(options).load(resolved.uri).queryExecution.analyzed
  }

  private def invalid(message: String): DeltaflowException =
    DeltaflowException.of("InvalidOptionError", message, Map("option" -> "table_changes"))
}

/** A table name as its parts, by Spark's parser. */
private[sql] object DeltaSqlParserAccess {
  def parts(name: String): Seq[String] =
    org.apache.spark.sql.classic.SparkSession.active.sessionState.sqlParser
      .parseMultipartIdentifier(name)
}
