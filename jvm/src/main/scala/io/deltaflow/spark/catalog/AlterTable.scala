package io.deltaflow.spark.catalog


import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.sql.AnalysisException
import org.apache.spark.sql.connector.catalog.TableChange
import org.apache.spark.sql.connector.catalog.TableChange._
import org.apache.spark.sql.deltaflow.Constraints

import io.deltaflow.spark.{Brain, DeltaflowException}

/**
 * `ALTER TABLE` on a Delta table: the changes Spark parsed, applied to the Delta log by
 * the brain in one metadata commit (`catalog.alter`), or refused with a typed error and
 * nothing changed. Never a catalog-only change: the log is the table.
 *
 * The Delta rules are the brain's. This side translates each `TableChange` to JSON and,
 * when the brain asks (a new CHECK constraint, SET NOT NULL that statistics cannot
 * settle), counts the rows of the version the brain names that break each rule, with
 * Spark; any such row refuses the change with `ConstraintViolationError` (count and an
 * example), else the brain is called again to commit on that very version.
 */
object AlterTable {
  /** Apply `changes` to the Delta table at `uri` (`name` is how the user named it). */
  def apply(uri: String, name: String, changes: Seq[TableChange]): Unit =
    apply(uri, name, changes, strictUnset = false)

  /** `strictUnset`: UNSET TBLPROPERTIES without IF EXISTS (a missing key is an error). */
  def apply(uri: String, name: String, changes: Seq[TableChange], strictUnset: Boolean): Unit = {
    val args = Brain.newArgs()
    args.put("uri", uri)
    args.put("name", name)
    val list = args.putArray("changes")
    changes.foreach { c =>
      val node = toJson(c)
      if (strictUnset && c.isInstanceOf[RemoveProperty]) node.put("ifExists", false)
      list.add(node)
    }
    val answer = Brain.call("catalog.alter", args)
    val check = answer.get("check")
    if (check != null && !check.isNull) {
      val version = check.get("version").asLong()
      checkRows(uri, name, version, check.get("checks"))
      args.put("checkedVersion", version)
      Brain.call("catalog.alter", args)
    }
  }

  private def checkRows(uri: String, name: String, version: Long, checks: JsonNode): Unit = {
    val session = org.apache.spark.sql.classic.SparkSession.active
    val table = session.read.format("delta").option("versionAsOf", version.toString).load(uri)
    checks.elements().forEachRemaining { check =>
      val kind = check.get("kind").asText()
      val ruleName = check.get("name").asText()
      val expression = check.get("expression").asText()
      val (count, example) = try {
        val broken = table.where(check.get("violation").asText())
        val n = broken.count()
        val shown = if (n > 0) {
          Option(broken.selectExpr(check.get("values").asText()).head().getString(0)).getOrElse("")
        } else ""
        (n, shown)
      } catch {
        case e: AnalysisException if kind == "check" =>
          throw DeltaflowException.of("InvalidConstraintError",
            s"ALTER TABLE $name ADD CONSTRAINT $ruleName CHECK ($expression): the expression " +
              s"is not a valid boolean condition on the table's columns: ${e.getMessage}",
            Map("table_uri" -> uri, "constraint" -> ruleName, "expression" -> expression))
      }
      if (count > 0) {
        val what = if (kind == "check") {
          s"ALTER TABLE $name ADD CONSTRAINT $ruleName CHECK ($expression): $count existing " +
            s"row(s) violate it, for example a row with values: $example. Fix or delete " +
            "them (UPDATE / DELETE), then add the constraint again."
        } else {
          s"ALTER TABLE $name ALTER COLUMN $ruleName SET NOT NULL: $count existing row(s) " +
            s"have a null there. Fill them (UPDATE ... SET $ruleName = ... WHERE $ruleName " +
            "IS NULL) or delete them, then set NOT NULL again."
        }
        throw DeltaflowException.of("ConstraintViolationError", what,
          Map("table_uri" -> uri, "constraint" -> ruleName, "kind" -> kind,
            "expression" -> expression, "values" -> example, "rows" -> count.toString))
      }
    }
  }

  private def position(node: ObjectNode, key: String, p: ColumnPosition): Unit = p match {
    case null =>
    case _: First => node.putObject(key).put("first", true)
    case a: After => node.putObject(key).put("after", a.column())
    case other => node.putObject(key).put("after", other.toString)
  }

  private def fieldNames(node: ObjectNode, names: Array[String]): Unit = {
    val array = node.putArray("field")
    names.foreach(array.add)
  }

  /** One change as the brain reads it (see `deltaflow/table/_alter.py`). */
  def toJson(change: TableChange): ObjectNode = {
    val node = Brain.newArgs()
    node.put("text", change.toString)
    change match {
      case c: AddColumn =>
        node.put("op", "addColumn")
        fieldNames(node, c.fieldNames())
        node.set[JsonNode]("type", Brain.json.readTree(c.dataType().json))
        node.put("nullable", c.isNullable())
        Option(c.comment()).foreach(node.put("comment", _))
        position(node, "position", c.position())
        Option(c.defaultValue()).foreach(d => node.put("default", d.toString))
      case c: RenameColumn =>
        node.put("op", "renameColumn")
        fieldNames(node, c.fieldNames())
        node.put("newName", c.newName())
      case c: DeleteColumn =>
        node.put("op", "dropColumn")
        fieldNames(node, c.fieldNames())
        node.put("ifExists", Boolean.box(c.ifExists()).booleanValue())
      case c: UpdateColumnType =>
        node.put("op", "updateColumnType")
        fieldNames(node, c.fieldNames())
        node.set[JsonNode]("type", Brain.json.readTree(c.newDataType().json))
      case c: UpdateColumnNullability =>
        node.put("op", "updateColumnNullability")
        fieldNames(node, c.fieldNames())
        node.put("nullable", c.nullable())
      case c: UpdateColumnComment =>
        node.put("op", "updateColumnComment")
        fieldNames(node, c.fieldNames())
        node.put("comment", c.newComment())
      case c: UpdateColumnPosition =>
        node.put("op", "updateColumnPosition")
        fieldNames(node, c.fieldNames())
        position(node, "position", c.position())
      case c: UpdateColumnDefaultValue =>
        node.put("op", "updateColumnDefault")
        fieldNames(node, c.fieldNames())
      case c: SetProperty =>
        node.put("op", "setProperty")
        node.put("key", c.property())
        node.put("value", c.value())
      case c: RemoveProperty =>
        node.put("op", "removeProperty")
        node.put("key", c.property())
        node.put("ifExists", true)
      case c: ClusterBy =>
        node.put("op", "clusterBy")
        node.put("feature", "clustering")
        val columns = node.putArray("columns")
        c.clusteringColumns().foreach { ref =>
          val path = columns.addArray()
          ref.fieldNames().foreach(path.add)
        }
      case c if Constraints.describe(c, node) => // ADD / DROP CONSTRAINT (Spark 4.1+)
      case _ =>
        node.put("op", "unknown")
    }
    node
  }
}
