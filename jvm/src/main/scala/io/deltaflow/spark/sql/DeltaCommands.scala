package io.deltaflow.spark.sql

import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.sql.{Row, SparkSession}
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.command.LeafRunnableCommand
import org.apache.spark.sql.types.StructType

import io.deltaflow.spark.{Brain, DeltaflowException}

/**
 * Delta's SQL commands. Each resolves its table ([[DeltaTables]]), asks the brain to do
 * the work (`sql.*` ops, `deltaflow/spark/bridge/_commands.py`) and turns the rows it
 * answers into Spark rows of delta-spark's output schema ([[JsonRows]]). The schemas are
 * the ones `deltaflow/spark/commands/_maintenance.py` declares for the Python API.
 */
private[sql] abstract class BrainCommand extends LeafRunnableCommand {
  /** The statement, for errors: `VACUUM`, `DESCRIBE HISTORY`, ... */
  def statement: String
  def target: TableRef
  def op: String
  def outputSchema: StructType
  /** Fills the op's arguments besides `uri`. */
  def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit = ()

  override lazy val output: Seq[Attribute] = DataTypeUtils.toAttributes(outputSchema)

  override def run(session: SparkSession): Seq[Row] = {
    val table = DeltaTables.resolve(target, statement)
    val args = Brain.newArgs()
    args.put("uri", table.uri)
    arguments(session, table, args)
    val answer = Brain.call(op, args)
    finish(table, answer)
    JsonRows.toRows(answer.get("rows"), outputSchema)
  }

  /** After the brain's work (CONVERT updates the catalog here). */
  def finish(table: ResolvedTable, answer: com.fasterxml.jackson.databind.JsonNode): Unit = ()
}

private[sql] object Schemas {
  val History: StructType = StructType.fromDDL(
    "version bigint, timestamp timestamp, userId string, userName string, operation string, " +
      "operationParameters map<string,string>, job struct<jobId:string,jobName:string," +
      "jobRunId:string,runId:string,jobOwnerId:string,triggerType:string>, " +
      "notebook struct<notebookId:string>, clusterId string, readVersion bigint, " +
      "isolationLevel string, isBlindAppend boolean, operationMetrics map<string,string>, " +
      "userMetadata string, engineInfo string")

  val Detail: StructType = StructType.fromDDL(
    "format string, id string, name string, description string, location string, " +
      "createdAt timestamp, lastModified timestamp, partitionColumns array<string>, " +
      "clusteringColumns array<string>, numFiles bigint, sizeInBytes bigint, " +
      "properties map<string,string>, minReaderVersion int, minWriterVersion int, " +
      "tableFeatures array<string>")

  private val FileStats =
    "struct<min:bigint,max:bigint,avg:double,totalFiles:bigint,totalSize:bigint>"

  private val CubeFiles = "struct<num:bigint,size:bigint>"

  val Optimize: StructType = StructType.fromDDL(
    s"path string, metrics struct<numFilesAdded:bigint,numFilesRemoved:bigint," +
      s"filesAdded:$FileStats,filesRemoved:$FileStats,partitionsOptimized:bigint," +
      s"zOrderStats:struct<strategyName:string,inputCubeFiles:$CubeFiles," +
      s"inputOtherFiles:$CubeFiles,inputNumCubes:bigint,mergedFiles:$CubeFiles," +
      "numOutputCubes:bigint,mergedNumCubes:bigint>," +
      "numBatches:bigint,totalConsideredFiles:bigint,totalFilesSkipped:bigint," +
      "preserveInsertionOrder:boolean>")

  val Restore: StructType = StructType.fromDDL(
    "table_size_after_restore bigint, num_of_files_after_restore bigint, " +
      "num_removed_files bigint, num_restored_files bigint, removed_files_size bigint, " +
      "restored_files_size bigint")

  val Vacuum: StructType = StructType.fromDDL("path string")

  val Clone: StructType = StructType.fromDDL(
    "source_table_size bigint, source_num_of_files bigint, num_removed_files bigint, " +
      "num_copied_files bigint, removed_files_size bigint, copied_files_size bigint")

  val Empty: StructType = new StructType()
}

/** `DESCRIBE HISTORY <table> [LIMIT n]`: commits, newest first. */
private[sql] case class DescribeHistoryCommand(target: TableRef, limit: Option[Long])
  extends BrainCommand {
  override def statement: String = "DESCRIBE HISTORY"
  override def op: String = "sql.history"
  override def outputSchema: StructType = Schemas.History
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit =
    limit.foreach(args.put("limit", _))
}

/** `DESCRIBE DETAIL <table>`: one row about the table. */
private[sql] case class DescribeDetailCommand(target: TableRef) extends BrainCommand {
  override def statement: String = "DESCRIBE DETAIL"
  override def op: String = "sql.detail"
  override def outputSchema: StructType = Schemas.Detail
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit =
    table.name.foreach(args.put("name", _))
}

/** `OPTIMIZE <table> [FULL] [WHERE ...] [ZORDER BY (...)]`. */
private[sql] case class OptimizeCommand(
    target: TableRef, where: Option[String], zorderBy: Seq[String], full: Boolean = false)
  extends BrainCommand {
  override def statement: String = "OPTIMIZE"
  override def op: String = "sql.optimize"
  override def outputSchema: StructType = Schemas.Optimize
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit = {
    where.foreach { predicate =>
      args.put("where", predicate)
      // The commit's `predicate` parameter, as delta-spark records it: the parsed
      // (unresolved) expression's simpleString, e.g. `('key = a)`.
      val parsed = scala.util.Try(session.sessionState.sqlParser.parseExpression(predicate))
      parsed.foreach(e => args.putArray("predicates").add(
        e.simpleString(session.sessionState.conf.maxToStringFields)))
    }
    val columns = args.putArray("zorderBy")
    zorderBy.foreach(columns.add)
    if (full) args.put("full", true)
  }
}

/** `REORG TABLE <table> [WHERE ...] APPLY (PURGE)`: OPTIMIZE's output row. */
private[sql] case class ReorgPurgeCommand(target: TableRef, where: Option[String])
  extends BrainCommand {
  override def statement: String = "REORG"
  override def op: String = "sql.reorg"
  override def outputSchema: StructType = Schemas.Optimize
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit =
    where.foreach(args.put("where", _))
}

/** `VACUUM <table> [RETAIN n HOURS] [DRY RUN]`. */
private[sql] case class VacuumCommand(target: TableRef, retentionHours: Option[Double], dryRun: Boolean)
  extends BrainCommand {
  override def statement: String = "VACUUM"
  override def op: String = "sql.vacuum"
  override def outputSchema: StructType = Schemas.Vacuum
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit = {
    retentionHours.foreach(args.put("retentionHours", _))
    args.put("dryRun", dryRun)
    // delta-spark's switch for the retention check, read from the session as it does.
    val check = session.conf.get(VacuumCommand.RetentionCheckConf, "true")
    args.put("checkRetention", !check.trim.equalsIgnoreCase("false"))
  }
}

private[sql] object VacuumCommand {
  val RetentionCheckConf = "spark.databricks.delta.retentionDurationCheck.enabled"
}

/** `RESTORE [TABLE] <table> [TO] VERSION AS OF n | TIMESTAMP AS OF ts`. */
private[sql] case class RestoreCommand(target: TableRef, version: Option[Long], timestamp: Option[String])
  extends BrainCommand {
  override def statement: String = "RESTORE"
  override def op: String = "sql.restore"
  override def outputSchema: StructType = Schemas.Restore
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit = {
    version.foreach(args.put("version", _))
    timestamp.foreach(text => args.put("timestamp", RestoreCommand.instant(session, text)))
  }
}

private[sql] object RestoreCommand {
  /** The timestamp expression (a literal, or e.g. `current_timestamp() - INTERVAL 1 DAY`),
   *  evaluated by Spark in the session's time zone, as an ISO instant. */
  def instant(session: SparkSession, text: String, statement: String = "RESTORE"): String = {
    val value = try {
      session.sql(s"SELECT CAST(($text) AS TIMESTAMP)").head().get(0)
    } catch {
      case e: Exception =>
        throw DeltaflowException.of("InvalidOptionError",
          s"$statement ... TIMESTAMP AS OF $text: not a timestamp (${firstLine(e)}). Write a " +
            "timestamp literal such as '2026-01-31 12:00:00' or an expression of type TIMESTAMP.",
          Map("option" -> "timestampAsOf"))
    }
    value match {
      case t: java.sql.Timestamp => t.toInstant.toString
      case i: java.time.Instant => i.toString
      case _ =>
        throw DeltaflowException.of("InvalidOptionError",
          s"$statement ... TIMESTAMP AS OF $text: the timestamp is null. Write a timestamp " +
            "literal such as '2026-01-31 12:00:00'.",
          Map("option" -> "timestampAsOf"))
    }
  }

  private def firstLine(e: Exception): String =
    Option(e.getMessage).map(_.linesIterator.next()).getOrElse(e.getClass.getSimpleName)
}

/** `CONVERT TO DELTA <parquet table> [PARTITIONED BY (...)]`: no output rows, as delta-spark. */
private[sql] case class ConvertCommand(target: TableRef, partitionSchema: Option[StructType])
  extends BrainCommand {
  override def statement: String = "CONVERT TO DELTA"
  override def op: String = "sql.convert"
  override def outputSchema: StructType = Schemas.Empty
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit = {
    val schema = partitionSchema.orElse(table.entry.map(_.partitionSchema)).filter(_.nonEmpty)
    schema.foreach(s => args.set[ObjectNode]("partitionSchema", Brain.json.readTree(s.json)
      .asInstanceOf[ObjectNode]))
  }
  override def finish(table: ResolvedTable, answer: com.fasterxml.jackson.databind.JsonNode)
      : Unit = DeltaTables.markConverted(table)
}

/** `GENERATE symlink_format_manifest FOR TABLE <table>`: no output rows, as delta-spark. */
private[sql] case class GenerateCommand(target: TableRef, mode: String) extends BrainCommand {
  override def statement: String = s"GENERATE $mode"
  override def op: String = "sql.generate"
  override def outputSchema: StructType = Schemas.Empty
  override def arguments(session: SparkSession, table: ResolvedTable, args: ObjectNode): Unit =
    args.put("mode", mode)
}

/**
 * `CREATE [OR REPLACE] TABLE [IF NOT EXISTS] <target> SHALLOW CLONE <source> [VERSION AS OF
 * n | TIMESTAMP AS OF ts] [TBLPROPERTIES (...)] [LOCATION '...']`: the brain writes the
 * clone's version 0 (`sql.clone`), then a catalog target gets its entry, managed unless a
 * LOCATION was given, as `CREATE TABLE` would make it. OR REPLACE over an existing table:
 * the brain commits the clone on its log (an empty table only, as delta-spark) and the
 * entry stays. delta-spark's output row.
 */
private[sql] case class CloneCommand(
    target: TableRef,
    source: TableRef,
    replace: Boolean,
    ifNotExists: Boolean,
    version: Option[Long],
    timestamp: Option[String],
    properties: Map[String, String],
    location: Option[String]) extends LeafRunnableCommand {

  override lazy val output: Seq[Attribute] = DataTypeUtils.toAttributes(Schemas.Clone)

  override def run(session: SparkSession): Seq[Row] = {
    val from = DeltaTables.resolve(source, "SHALLOW CLONE")
    val into = DeltaTables.cloneTarget(target, location)
    if (into.exists && !replace) {
      if (ifNotExists) return Seq.empty
      throw DeltaflowException.of("TableAlreadyExistsError",
        s"SHALLOW CLONE into ${into.shown}: the table exists already. Use CREATE TABLE IF NOT " +
          "EXISTS or CREATE OR REPLACE TABLE, or drop it first.",
        Map("table_uri" -> into.shown))
    }
    val args = Brain.newArgs()
    args.put("uri", from.uri)
    args.put("target", into.uri)
    args.put("replace", replace)
    args.put("sourceName", from.name.getOrElse(s"delta.`${from.uri}`"))
    version.foreach(args.put("version", _))
    timestamp.foreach(text =>
      args.put("timestamp", RestoreCommand.instant(session, text, "SHALLOW CLONE")))
    val props = args.putObject("properties")
    properties.foreach { case (k, v) => props.put(k, v) }
    val answer = Brain.call("sql.clone", args)
    into.register(session)
    JsonRows.toRows(answer.get("rows"), Schemas.Clone)
  }
}
