package io.deltaflow.spark

import java.nio.charset.StandardCharsets
import java.util.Base64

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.internal.Logging
import org.apache.spark.sql.{Column, DataFrame, SaveMode, SparkSession}
import org.apache.spark.sql.deltaflow.DirectWrite
import org.apache.spark.sql.functions.{col, concat, expr, lit, when}
import org.apache.spark.sql.types.{DataType, StructType}

/**
 * `df.write.format("delta").save(path)`, every save mode: one Delta commit.
 *
 * 1. The brain plans the write (`write.plan`): schema enforcement and evolution,
 *    partitioning, save mode against the table as it is, the app transaction
 *    (`txnAppId`/`txnVersion`); it answers skip, `jvm` or `python`.
 * 2. `jvm`: Spark's Parquet writer writes the DataFrame, shaped to the table's columns,
 *    into a private staging directory under the table (`_delta_staging/<job>`);
 *    `write.commit` then reads the footers for stats, moves the files into the table
 *    and commits once (conflict checks, app transaction). When the plan says `direct`
 *    (object stores, `deltaflow.write.directWrite`), the tasks write final names under
 *    the table root instead ([[DirectWrite]]) and `write.commit` gets their list. On any failure
 *    `write.abort` deletes what was staged or moved: nothing is visible before the
 *    commit, and a crash leaves only files no commit references (VACUUM removes them).
 * 3. `python`: what the JVM path does not implement yet (column mapping, replaceWhere,
 *    object stores, ...) goes through deltaflow's Python data source.
 *
 * Generated and identity columns the data lacks are added first ([[GeneratedValues]]), as
 * the brain's plan says; generated columns are then checked like constraints.
 *
 * Either way, a table with NOT NULL columns or CHECK constraints gets its rows checked
 * on the way ([[RowChecks]]): the first violating row fails the job, so nothing is
 * committed, and the error is the brain's typed `ConstraintViolationError`.
 */
object DeltaBatchWrite extends Logging {
  private val TimestampConf = "spark.sql.parquet.outputTimestampType"
  // Settings the brain's plan depends on, read from the session.
  private val PlanConfs = Seq("deltaflow.write.nativeWrite", "deltaflow.write.directWrite",
    "spark.sql.parquet.writeLegacyFormat")
  private val SessionWriteConfs = Seq("spark.databricks.delta.autoCompact.",
    "spark.databricks.delta.optimizeWrite.", "spark.deltaflow.autoCompact.",
    "spark.databricks.delta.schema.autoMerge.")
  private val AdvisorySizeConf = "spark.sql.adaptive.advisoryPartitionSizeInBytes"
  private val AdaptiveConf = "spark.sql.adaptive.enabled"

  /** Write `data`; the route the brain chose (`jvm`, `python`, `skip`). `stream`: the
   *  micro-batch this write is (app transaction id, batch id, the streaming query's id),
   *  recorded in the commit's info. */
  def save(data: DataFrame, mode: SaveMode, parameters: Map[String, String],
      stream: Option[(String, Long, String)] = None): String = {
    val plan = this.plan(data.sparkSession, data.schema, mode, parameters, stream)
    val route = plan.get("route").asText()
    val guard = Option(plan.get("checks")).filterNot(_.isNull)
    val checked = prepared(data, plan, shape = false)
    val optimized = Option(plan.get("optimizeWrite")).filterNot(_.isNull)
    val rows = optimized.map(optimizedWrite(checked, _)).getOrElse(checked)
    val committed = try withBinSize(data.sparkSession, optimized) {
      route match {
        case "skip" => None
        case "python" => writeThroughPython(rows, plan); None
        case _ => Some(writeOnJvm(rows, plan))
      }
    } catch {
      case NonFatal(e) => throw guard.flatMap(RowChecks.violation(e, _)).getOrElse(e)
    }
    report(plan, parameters, committed)
    route
  }

  /** The brain's plan for writing rows of `schema` (`write.plan`): the route (`skip`,
   *  `jvm`, `python`) and, for `jvm`, the staging directory and how to shape the rows. */
  private[spark] def plan(session: SparkSession, schema: StructType, mode: SaveMode,
      parameters: Map[String, String], stream: Option[(String, Long, String)],
      staging: Option[String] = None): JsonNode =
    Brain.call("write.plan", planArgs(session, schema, mode, parameters, stream, staging))

  /** `write.plan`'s arguments (a real-time sink's `sink.commitRolls` plans with them too). */
  private[spark] def planArgs(session: SparkSession, schema: StructType, mode: SaveMode,
      parameters: Map[String, String], stream: Option[(String, Long, String)],
      staging: Option[String]): com.fasterxml.jackson.databind.node.ObjectNode = {
    val args = Brain.newArgs()
    args.put("mode", modeName(mode))
    // A real-time roll's files are staged already, where its task wrote them.
    staging.foreach(args.put("staging", _))
    stream.foreach(putStream(args, _))
    args.put("schema", schema.json)
    val opts = args.putObject("options")
    // Table properties a new table gets from the session (they only apply at creation).
    TableDefaults.applyTo(parameters, session).foreach { case (k, v) => opts.put(k, v) }
    // The session's auto compaction / optimized write / schema auto-merge settings travel
    // as write options, so the plan and the commit see them on either route (the Python
    // data source has no session).
    session.conf.getAll.foreach { case (k, v) =>
      if (SessionWriteConfs.exists(k.startsWith) && !opts.has(k)) opts.put(k, v)
    }
    val conf = args.putObject("conf")
    PlanConfs.foreach(k => session.conf.getOption(k).foreach(conf.put(k, _)))
    args
  }

  /** The `stream` of `write.plan`'s arguments: the app id, batch and query of a stream's write. */
  private[spark] def putStream(args: com.fasterxml.jackson.databind.node.ObjectNode,
      stream: (String, Long, String)): Unit = {
    val s = args.putObject("stream")
    s.put("queryId", stream._1)
    s.put("batchId", stream._2)
    s.put("streamQueryId", stream._3)
  }

  /** `data` with the generated values it lacks and the row checks the plan asks for;
   *  with `shape`, also as the table's columns ([[shaped]]; the `jvm` route's rows). */
  private[spark] def prepared(data: DataFrame, plan: JsonNode, shape: Boolean): DataFrame = {
    val guard = Option(plan.get("checks")).filterNot(_.isNull)
    val generated = Option(plan.get("generate")).filterNot(_.isNull)
      .map(GeneratedValues.added(data, _)).getOrElse(data)
    val checked = guard.map(RowChecks.guarded(generated, _)).getOrElse(generated)
    if (shape) shaped(checked, plan) else checked
  }

  /** Record the write for the caller's report (its table, route, version, files). */
  private[spark] def report(plan: JsonNode, parameters: Map[String, String],
      committed: Option[JsonNode]): Unit = {
    val report = Brain.newArgs()
    report.put("table_uri", plan.path("tableUri").asText(parameters.getOrElse("path", "")))
    report.put("route", plan.get("route").asText())
    committed.foreach { result =>
      report.set[JsonNode]("version", result.get("version"))
      report.set[JsonNode]("files", result.get("files"))
    }
    WriteReports.add(report)
  }

  /** delta-spark's optimized write: the rows shuffled by the table's partition columns
   *  before the write, so each partition's rows reach one task (one file), with Spark's
   *  `REBALANCE` (adaptive execution splits a skewed partition and merges small ones
   *  toward the bin size). Spark drops that hint when adaptive execution is off (a stream's
   *  micro-batches always run without it), so there a partitioned table gets a plain hash
   *  shuffle by its partition columns instead; an unpartitioned one is written as it comes
   *  (a round-robin shuffle would only spread it over more files). */
  private def optimizedWrite(data: DataFrame, spec: JsonNode): DataFrame = {
    val columns = spec.get("columns").elements().asScala
      .map(c => col("`" + c.asText().replace("`", "``") + "`")).toSeq
    val adaptive = data.sparkSession.conf.get(AdaptiveConf, "true").toBoolean
    if (adaptive) data.hint("rebalance", columns: _*)
    else if (columns.nonEmpty) data.repartition(columns: _*)
    else data
  }

  /** `body` with adaptive execution's target shuffle partition size at the optimized
   *  write's bin size (`spark.databricks.delta.optimizeWrite.binSize`), then restored. */
  private def withBinSize[T](session: SparkSession, spec: Option[JsonNode])(body: => T): T =
    spec match {
      case None => body
      case Some(s) =>
        val previous = session.conf.getOption(AdvisorySizeConf)
        session.conf.set(AdvisorySizeConf, s.get("binSize").asLong().toString)
        try body finally previous match {
          case Some(v) => session.conf.set(AdvisorySizeConf, v)
          case None => session.conf.unset(AdvisorySizeConf)
        }
    }

  private[spark] def modeName(mode: SaveMode): String = mode match {
    case SaveMode.Append => "append"
    case SaveMode.Overwrite => "overwrite"
    case SaveMode.ErrorIfExists => "error"
    case SaveMode.Ignore => "ignore"
  }

  private def writeThroughPython(data: DataFrame, plan: JsonNode): Unit = {
    val options = plan.get("delegateOptions").properties().asScala
      .map(e => e.getKey -> e.getValue.asText()).toMap
    PythonDelegate.requireRegistered(options.getOrElse("path", "(no path)"))
    data.write.format(PythonDelegate.Name).mode("append").options(options).save()
  }

  /** The commit's answer: `version`, `files`, `skipped`. */
  private def writeOnJvm(data: DataFrame, plan: JsonNode): JsonNode = {
    val handle = plan.get("handle").asText()
    val partitions = plan.get("partitionColumns").elements().asScala.map(_.asText()).toSeq
    val hasTimestamps = plan.get("hasTimestamps").asBoolean()
    var committed = false
    try {
      val args = Brain.newArgs()
      args.put("handle", handle)
      if (plan.path("direct").asBoolean(false)) {
        // Final names under the table root; the brain commits the reported files.
        val files = DirectWrite.write(shaped(data, plan), plan.get("tableUri").asText(),
          plan.get("jobId").asText(), partitions, plan.get("codec").asText(),
          plan.get("maxRecordsPerFile").asLong(), hasTimestamps)
        putFiles(args, files)
      } else {
        writeStaged(data, plan, partitions, hasTimestamps)
      }
      val result = Brain.call("write.commit", args)
      committed = true
      logInfo(s"deltaflow wrote ${result.path("files").asInt()} files to " +
        s"${plan.get("tableUri").asText()} at version ${result.path("version").asText()}")
      result
    } finally {
      if (!committed) {
        // A direct write's files were deleted by its protocol (a failed job) or by the
        // brain (a failed commit); this only forgets the planned write.
        val args = Brain.newArgs()
        args.put("handle", handle)
        try Brain.call("write.abort", args)
        catch { case e: Exception => logWarning(s"deltaflow could not clean up a failed write: $e") }
      }
    }
  }

  /** `write.commit`'s `files` for a direct write: relative path and size of each. */
  private[spark] def putFiles(args: ObjectNode, files: Seq[DirectWrite.Written]): Unit = {
    val list = args.putArray("files")
    files.foreach { f =>
      val o = list.addObject()
      o.put("path", f.relative)
      o.put("size", f.size)
    }
  }

  /** Spark's Parquet writer into the plan's staging directory (`_delta_staging/<job>`). */
  private def writeStaged(data: DataFrame, plan: JsonNode, partitions: Seq[String],
      hasTimestamps: Boolean): Unit = {
    val session = data.sparkSession
    val previous = session.conf.getOption(TimestampConf)
    // Spark's default INT96 timestamps carry no footer statistics.
    if (hasTimestamps) session.conf.set(TimestampConf, "TIMESTAMP_MICROS")
    try {
      shaped(data, plan).write.format("parquet").mode("append")
        .partitionBy(partitions: _*)
        .option("compression", plan.get("codec").asText())
        .option("maxRecordsPerFile", plan.get("maxRecordsPerFile").asLong())
        .save(plan.get("staging").asText())
    } finally {
      if (hasTimestamps) previous match {
        case Some(v) => session.conf.set(TimestampConf, v)
        case None => session.conf.unset(TimestampConf)
      }
    }
  }

  /** `data` as the table's columns, in order, cast where the plan says, with string
   *  partition values Spark cannot tell apart in a directory name marked. */
  private[spark] def shaped(data: DataFrame, plan: JsonNode): DataFrame = {
    val escaped = plan.get("escapedPartitions").elements().asScala.map(_.asText()).toSet
    val mark = plan.get("escapeMark").asText()
    val hiveNull = plan.get("hiveNull").asText()
    val columns = plan.get("columns").elements().asScala.map { c =>
      val name = c.get("name").asText()
      val source = Option(c.get("source")).filterNot(_.isNull).map(_.asText())
      var column: Column = source.map(s => col("`" + s.replace("`", "``") + "`"))
        .getOrElse(lit(null))
      if (c.get("cast").asBoolean()) {
        column = column.cast(DataType.fromJson(c.get("type").toString))
      }
      if (escaped.contains(name)) {
        val ambiguous = column === "" || column === hiveNull || column.startsWith(mark)
        column = when(ambiguous, concat(lit(mark), column)).otherwise(column)
      }
      column.alias(name)
    }.toSeq
    data.select(columns: _*)
  }
}

/**
 * The generated and identity columns a write's data lacks, added as one projection (so
 * they are computed on the executors), as the brain's `write.plan` lists them
 * (`deltaflow/spark/write/_generated.py`): each `sql` (the generation expression cast to
 * the column's type, or an identity column's next values by `monotonically_increasing_id()`,
 * unique across tasks) parsed by Spark, added or replacing the column.
 */
object GeneratedValues {
  def added(data: DataFrame, generate: JsonNode): DataFrame =
    generate.elements().asScala.foldLeft(data) { (df, g) =>
      df.withColumn(g.get("name").asText(), expr(g.get("sql").asText()))
    }
}

/**
 * A table's row rules (NOT NULL columns, CHECK constraints) applied to the rows of a
 * write, as the brain spells them (`write.plan`'s `checks`, from
 * `deltaflow/table/_constraints.py`): a projection that raises on the first violating
 * row. It is an expression of a written column, so Spark never prunes it, and it runs
 * above the query's own filters.
 */
object RowChecks {
  private val Mark = """(?s)\[deltaflow-check#(\d+)\](.*?)\[/deltaflow-check\]""".r

  def guarded(data: DataFrame, checks: JsonNode): DataFrame = {
    def texts(key: String) = checks.get(key).elements().asScala.map(_.asText()).toSeq
    data.selectExpr(texts("widen"): _*).selectExpr(texts("guarded"): _*)
  }

  /** The typed error for a failure a guard raised (anywhere in `e`'s causes), if any. */
  def violation(e: Throwable, checks: JsonNode): Option[DeltaflowException] = {
    var current = e
    val seen = scala.collection.mutable.Set[Throwable]()
    while (current != null && seen.add(current)) {
      Option(current.getMessage).flatMap(m => Mark.findFirstMatchIn(m)).foreach { m =>
        val index = m.group(1).toInt
        val values = m.group(2)
        val about = checks.get("violations").get(index)
        val message = about.get("message").asText().replace("{values}", values)
        // The brain's fields keep their JSON types (columns is a list) on the wire.
        val payload = Brain.json.createObjectNode()
        payload.put("type", "ConstraintViolationError")
        payload.put("message", message)
        val wireFields = about.get("fields").deepCopy[ObjectNode]()
        wireFields.put("values", values)
        payload.set[JsonNode]("fields", wireFields)
        val wire = "[deltaflow-error:" + Base64.getEncoder.encodeToString(
          Brain.json.writeValueAsString(payload).getBytes(StandardCharsets.UTF_8)) + "]"
        val fields = wireFields.properties().asScala
          .map(f => f.getKey -> (if (f.getValue.isTextual) f.getValue.asText() else f.getValue.toString))
          .toMap
        return Some(new DeltaflowException("ConstraintViolationError", message, fields, wire, e))
      }
      current = current.getCause
    }
    None
  }
}
