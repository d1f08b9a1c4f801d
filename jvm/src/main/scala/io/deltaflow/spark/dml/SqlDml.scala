package io.deltaflow.spark.dml

import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.sql.{Row, SparkSession}
import org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference, Expression}
import org.apache.spark.sql.catalyst.plans.logical._
import org.apache.spark.sql.execution.command.LeafRunnableCommand
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation
import org.apache.spark.sql.deltaflow.Plans
import org.apache.spark.sql.types.LongType

import io.deltaflow.spark.{Brain, DeltaflowException, DeltaTable, PythonDelegate}

/**
 * `UPDATE` / `DELETE FROM` / `MERGE INTO` as parsed by Spark, run by deltaflow when the
 * target is a Delta table and by Spark otherwise. Expressions travel as the SQL text the
 * user wrote (the parser keeps each expression's position in the statement).
 *
 * deltaflow runs them in its brain (`dml.run`), in the statement's own session lent to it
 * ([[Brain.callInSession]]), with the code behind the `DeltaTable` API
 * (`deltaflow/spark/dml/`): one implementation, its conflict rules, change-data files,
 * deletion vectors and history metrics, on every host Spark runs the connector in.
 */
case class DeltaDmlCommand(statement: LogicalPlan) extends LeafRunnableCommand {
  private val kind = statement match {
    case _: DeleteFromTable => "DELETE"
    case _: UpdateTable => "UPDATE"
    case _ => "MERGE"
  }

  override val output: Seq[Attribute] = (kind match {
    case "MERGE" => Seq("num_affected_rows", "num_updated_rows", "num_deleted_rows",
      "num_inserted_rows")
    case _ => Seq("num_affected_rows")
  }).map(name => AttributeReference(name, LongType, nullable = false)())

  override def run(session: SparkSession): Seq[Row] = {
    val classic = session.asInstanceOf[org.apache.spark.sql.classic.SparkSession]
    val (targetPlan, alias) = SqlDml.target(statement match {
      case d: DeleteFromTable => d.table
      case u: UpdateTable => u.table
      case m: MergeIntoTable => m.targetTable
    })
    val analyzed = classic.sessionState.executePlan(targetPlan).analyzed
    val delta = analyzed.collectFirst {
      case r: DataSourceV2Relation if r.table.isInstanceOf[DeltaTable] =>
        val table = r.table.asInstanceOf[DeltaTable]
        (table.info.uri, table.name())
      // A Delta table the brain routes to the Python data source (an object store):
      // named by its path, `delta.`s3://...``, or by the path the relation was read with.
      case r: DataSourceV2Relation if r.table.name() == PythonDelegate.Name &&
          SqlDml.pathOf(targetPlan, r).isDefined =>
        val path = SqlDml.pathOf(targetPlan, r).get
        (path, s"delta.`$path`")
    }
    delta match {
      case None =>
        // Not a Delta table: Spark's own DML (or its error).
        Plans.ofRows(classic, statement).collect().toSeq
      case Some((uri, name)) => SqlDml.runOnDelta(classic, kind, statement, uri, name, alias)
    }
  }
}

object SqlDml {
  /** Wrap Spark's parsed DML statements so deltaflow runs those on Delta tables. */
  def wrap(plan: LogicalPlan): LogicalPlan = plan match {
    case _: DeleteFromTable | _: UpdateTable | _: MergeIntoTable => DeltaDmlCommand(plan)
    case other => other
  }

  /** A statement's table (or MERGE source) and the name its columns are qualified by:
   *  its alias, else the table's own name, as in Spark (`UPDATE t SET ... WHERE t.id = 1`). */
  private[dml] def target(plan: LogicalPlan): (LogicalPlan, Option[String]) = plan match {
    case SubqueryAlias(alias, child) => (child, Some(alias.name))
    case r: org.apache.spark.sql.catalyst.analysis.UnresolvedRelation =>
      (r, r.multipartIdentifier.lastOption)
    case other => (other, None)
  }

  /**
   * The SQL text the user wrote for `e` (the parser records where it is). A predicate's
   * own origin starts at its operator (`IN (1, 9)`, `IS NULL`, `BETWEEN 1 AND 3`, `LIKE`
   * of `id IN (1, 9)`), so the span is that of the whole tree: from the first position any
   * node of it starts at to the last one any ends at.
   */
  def text(e: Expression): String = {
    val spans = e.collect {
      case node if node.origin.sqlText.isDefined && node.origin.startIndex.isDefined &&
          node.origin.stopIndex.isDefined =>
        (node.origin.sqlText.get, node.origin.startIndex.get, node.origin.stopIndex.get)
    }
    e.origin.sqlText match {
      case Some(sql) =>
        val own = spans.filter(_._1 == sql)
        val start = own.map(_._2).minOption
        val stop = own.map(_._3).maxOption
        (start, stop) match {
          case (Some(a), Some(b)) if a >= 0 && b < sql.length => sql.substring(a, b + 1)
          case _ => e.sql
        }
      case None => e.sql
    }
  }

  private def column(key: Expression, alias: Option[String]): String = key match {
    case u: UnresolvedAttribute =>
      val parts = u.nameParts
      val kept = if (alias.exists(a => parts.length > 1 && parts.head.equalsIgnoreCase(a))) {
        parts.tail
      } else parts
      kept.map(p => if (p.matches("[A-Za-z_][A-Za-z0-9_]*")) p else s"`${p.replace("`", "``")}`")
        .mkString(".")
    case other => text(other)
  }

  private def putAssignments(node: ObjectNode, assignments: Seq[Assignment],
      alias: Option[String]): Unit = {
    val array = node.putArray("assignments")
    assignments.foreach { a =>
      val pair = array.addArray()
      pair.add(column(a.key, alias))
      pair.add(text(a.value))
    }
  }

  private def putAction(array: com.fasterxml.jackson.databind.node.ArrayNode, group: String,
      action: MergeAction, alias: Option[String]): Unit = {
    val node = array.addObject()
    node.put("group", group)
    action.condition.foreach(c => node.put("condition", text(c)))
    action match {
      case _: DeleteAction => node.put("action", "delete")
      case u: UpdateAction => node.put("action", "update"); putAssignments(node, u.assignments, alias)
      case _: UpdateStarAction => node.put("action", "updateAll")
      case i: InsertAction => node.put("action", "insert"); putAssignments(node, i.assignments, alias)
      case _: InsertStarAction => node.put("action", "insertAll")
      case other =>
        throw DeltaflowException.of("UnsupportedFeatureError",
          s"MERGE action $other is not supported by deltaflow.",
          Map("feature" -> "mergeAction"))
    }
  }

  /** The path of a Python-routed Delta table: the relation's `path` option, or the
   *  identifier `delta.`path`` the statement named it by. */
  private[dml] def pathOf(target: LogicalPlan, relation: DataSourceV2Relation): Option[String] =
    Option(relation.options.get("path")).orElse(target match {
      case r: org.apache.spark.sql.catalyst.analysis.UnresolvedRelation
          if r.multipartIdentifier.length == 2 &&
            r.multipartIdentifier.head.equalsIgnoreCase("delta") =>
        Some(r.multipartIdentifier(1))
      case _ => None
    })

  private[dml] def runOnDelta(session: org.apache.spark.sql.classic.SparkSession, kind: String,
      statement: LogicalPlan, uri: String, name: String, alias: Option[String]): Seq[Row] = {
    val request = Brain.newArgs()
    request.put("kind", kind)
    request.put("uri", uri)
    request.put("name", name)
    alias.foreach(request.put("alias", _))
    var view: Option[String] = None
    statement match {
      case d: DeleteFromTable =>
        if (!isTrue(d.condition)) request.put("condition", text(d.condition))
      case u: UpdateTable =>
        u.condition.foreach(c => request.put("condition", text(c)))
        putAssignments(request, u.assignments, alias)
      case m: MergeIntoTable =>
        val (source, sourceAlias) = target(m.sourceTable)
        val name = "deltaflow_merge_source_" + java.util.UUID.randomUUID().toString.replace("-", "")
        // A temporary view of the statement's own session (the one lent to the brain): a
        // global one would open the metastore (its global_temp check), seconds on a fresh
        // embedded Derby, and fail where another process holds it, for a MERGE by path.
        Plans.ofRows(session, source).createTempView(name)
        view = Some(name)
        request.put("sourceView", name)
        sourceAlias.foreach(request.put("sourceAlias", _))
        request.put("condition", text(m.mergeCondition))
        request.put("schemaEvolution", m.withSchemaEvolution)
        val clauses = request.putArray("clauses")
        m.matchedActions.foreach(putAction(clauses, "matched", _, alias))
        m.notMatchedActions.foreach(putAction(clauses, "notMatched", _, alias))
        m.notMatchedBySourceActions.foreach(putAction(clauses, "notMatchedBySource", _, alias))
    }
    val answer = try Brain.callInSession("dml.run", request, session)
    finally view.foreach(v => session.catalog.dropTempView(v))
    val counts = answer.get("counts")
    Seq(Row.fromSeq((0 until counts.size()).map(i => counts.get(i).asLong())))
  }

  private def isTrue(e: Expression): Boolean = e match {
    case org.apache.spark.sql.catalyst.expressions.Literal(true, _) => true
    case _ => false
  }
}
