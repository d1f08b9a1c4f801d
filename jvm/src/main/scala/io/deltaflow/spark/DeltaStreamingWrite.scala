package io.deltaflow.spark

import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.internal.Logging
import org.apache.spark.sql.{Row, SaveMode}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.write.{BatchWrite, DataWriter, DataWriterFactory, LogicalWriteInfo, PhysicalWriteInfo, WriterCommitMessage}
import org.apache.spark.sql.connector.write.streaming.{StreamingDataWriterFactory, StreamingWrite}
import org.apache.spark.sql.deltaflow.{DirectWrite, FileRolls, RealTimeCommitEndpoint, RealTimeCommits, RealTimeEpochEnd, RealTimeQueries, RealTimeWriterFactory, RowLogWrite, StagedFileWrite}
import org.apache.spark.sql.catalyst.plans.logical.{Aggregate, LogicalPlan}
import org.apache.spark.sql.catalyst.streaming.WriteToStream
import org.apache.spark.sql.execution.SortExec
import org.apache.spark.sql.functions.{lit, when}
import org.apache.spark.sql.streaming.OutputMode
import org.apache.spark.sql.types.StringType

/**
 * A stream into a Delta catalog table (`writeStream.toTable(name)`, Spark's declarative
 * pipelines' streaming tables): the table's DataSource V2 `StreamingWrite`, with the
 * V1 sink's ([[DeltaSink]]) delivery rules, on every host Spark runs the connector in.
 *
 * Spark builds one per micro-batch. On the driver, before the batch's tasks run, the
 * brain plans the batch as a write (`write.plan`, as [[DeltaBatchWrite]] does) with the
 * app transaction `txnAppId` = the query id (stable across restarts: Spark keeps it in
 * the checkpoint; a pipeline flow's identity when `deltaflow.pipelines.flowIdentity` is
 * set), `txnVersion` = the batch id, and the query named in the commit's info. A batch
 * already in the log (a replay after a crash) is planned `skip`: its tasks run (a stateful
 * query's state stores commit) and drop their rows. Otherwise the tasks shape each row as
 * the batch write shapes its DataFrame (generated values, row checks, the table's
 * columns) and write Parquet with Spark's file writer into the plan's staging directory;
 * at `commit` the committed task files are moved into place and the brain commits once
 * (`write.commit`: footers for stats, conflict checks, the app transaction). On object
 * stores the plan says `direct`: the tasks write final names under the table root
 * ([[org.apache.spark.sql.deltaflow.DirectWrite]]) and `write.commit` gets their list. A failed or
 * aborted batch deletes what it staged (`write.abort`); nothing is visible before the
 * commit. Output modes: append; complete overwrites the table in that one commit
 * (`overwrite`); update appends when the query has no per-key state ([[StreamWriteCheck]]
 * refuses it otherwise, when the stream starts).
 */
class DeltaStreamingWrite(info: TableInfo, writeInfo: LogicalWriteInfo, overwrite: Boolean)
  extends StreamingWrite with Logging {
  import DeltaStreamingWrite._

  private val session = SparkSession.active
  private val options = writeInfo.options().asCaseSensitiveMap().asScala.toMap
  private val checked = check(session, info, options, writeInfo.queryId(), overwrite)
  // The batch planned by createStreamingWriterFactory, committed or aborted next.
  @volatile private var planned: Option[Planned] = None

  override def createStreamingWriterFactory(physical: PhysicalWriteInfo): StreamingDataWriterFactory = {
    val batchId = Option(session.sparkContext.getLocalProperty(BatchIdKey)).map(_.toLong)
      .getOrElse(throw new IllegalStateException(
        s"deltaflow: a stream into ${info.uri} planned outside a micro-batch"))
    val queryId = writeInfo.queryId()
    val appId = checked.appId.getOrElse(queryId)
    val parameters = checked.writeOptions ++ Map("path" -> checked.path, "txnAppId" -> appId,
      "txnVersion" -> batchId.toString)
    RealTimeQueries.find(queryId).filter(RealTimeQueries.isRealTime).foreach { query =>
      return realTime(query, batchId, appId, queryId)
    }
    if (checked.rowLog) {
      // Refused, not ignored: real-time readers would tail a log nobody writes.
      throw DeltaflowException.of("InvalidOptionError",
        s"realTimeRowLog is on for the stream into ${info.uri}, which does not run in " +
          "real-time mode: the row log is written by the real-time sink only. Start the " +
          "query with .trigger(realTime='5 minutes'), or remove .option('realTimeRowLog', " +
          "'true').",
        Map("option" -> "realTimeRowLog"))
    }
    val mode = if (overwrite) SaveMode.Overwrite else SaveMode.Append
    val plan = DeltaBatchWrite.plan(session, writeInfo.schema(), mode, parameters,
      Some((appId, batchId, queryId)))
    plan.get("route").asText() match {
      case "skip" =>
        logInfo(s"deltaflow stream batch $batchId to ${info.uri} is in the log already: " +
          "not written")
        planned = Some(Planned(batchId, plan, parameters, None))
        new DroppingWriterFactory
      case "python" =>
        // The brain's Python writer takes what the connector's file write does not yet
        // (CHECK constraints, NOT NULL columns, column mapping, ...); Spark runs a Python
        // data source's writer as part of the query's plan, which a streaming write built
        // per batch cannot add. The V1 sink on the table's path can.
        throw DeltaflowException.of("UnsupportedFeatureError",
          s"A stream into the catalog table at ${info.uri} needs deltaflow's Python writer " +
            "(the table has CHECK constraints, NOT NULL columns or column mapping), which " +
            "a catalog table's streaming write cannot use yet: in a PySpark session, start " +
            "the stream on the table's location instead, .start('<location>') (DESCRIBE " +
            "DETAIL shows it).",
          Map("table_uri" -> info.uri, "feature" -> "streamingWritePythonRoute"))
      case _ =>
        val shape = StagedFileWrite.shape(session, writeInfo.schema(),
          df => DeltaBatchWrite.prepared(df, plan, shape = true))
        val partitions = plan.get("partitionColumns").elements().asScala.map(_.asText()).toSeq
        // A direct write's tasks write final names under the table root (DirectWrite).
        val direct = if (plan.path("direct").asBoolean(false)) Some(plan.get("jobId").asText())
          else None
        val directory = if (direct.isDefined) plan.get("tableUri").asText()
          else plan.get("staging").asText()
        val write = StagedFileWrite.batchWrite(session, directory,
          shape.output, partitions, plan.get("codec").asText(),
          plan.get("maxRecordsPerFile").asLong(), plan.get("hasTimestamps").asBoolean(), direct)
        planned = Some(Planned(batchId, plan, parameters, Some(write)))
        val lowered = partitions.map(_.toLowerCase).toSet
        val sortBy = shape.output.filter(a => lowered.contains(a.name.toLowerCase))
        val sort = if (sortBy.isEmpty) None else Some(StagedFileWrite.sorter(shape.output, sortBy))
        val checks = Option(plan.get("checks")).filterNot(_.isNull).map(_.toString)
        new ShapedWriterFactory(write.createBatchWriterFactory(physical), shape, sort, checks)
    }
  }

  /**
   * A real-time mode epoch ([[RealTimeCommits]]): the epoch's plan gives the rows' shape
   * and a staging directory; each task's rolls are committed by the driver as they come,
   * one Delta commit each, with the partition's app transaction.
   */
  private def realTime(query: AnyRef, epoch: Long, appId: String, queryId: String)
      : StreamingDataWriterFactory = {
    // The backstop of StreamTriggerCheck's refusal at start(): the physical plan shows
    // what analysis cannot (a source's partition count, a shuffle the planner added).
    val format = RealTimeQueries.checkpointFormat(query)
    val blocking = RealTimeQueries.executedPlan(query)
      .map(RealTimeQueries.notReplayable(_, format)).getOrElse(Nil)
    if (blocking.nonEmpty || overwrite) {
      val what = if (overwrite) "complete output mode" else blocking.mkString(", ")
      throw DeltaflowException.of("UnsupportedFeatureError",
        RealTimeRefusal.message(info.uri, what),
        Map("table_uri" -> info.uri, "feature" -> "realTimeSinkOperators",
          "operators" -> what, "alternative" -> RealTimeRefusal.Alternative))
    }
    val schema = writeInfo.schema()
    val base = checked.writeOptions ++ Map("path" -> checked.path)
    val plan = DeltaBatchWrite.plan(session, schema, SaveMode.Append, base, None)
    if (plan.get("route").asText() != "jvm") {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"A real-time mode stream into ${info.uri} needs the connector's own file write, " +
          "which this table cannot take (CHECK constraints, NOT NULL columns, column " +
          "mapping, or an object store Spark cannot open): run the query with a " +
          "micro-batch trigger instead.",
        Map("table_uri" -> info.uri, "feature" -> "realTimeSinkRoute"))
    }
    val shape = StagedFileWrite.shape(session, schema,
      df => DeltaBatchWrite.prepared(df, plan, shape = true))
    val partitions = plan.get("partitionColumns").elements().asScala.map(_.asText()).toSeq
    val template = FileRolls.template(session, shape.output, partitions,
      plan.get("codec").asText(), plan.get("maxRecordsPerFile").asLong(),
      plan.get("hasTimestamps").asBoolean())
    val lowered = partitions.map(_.toLowerCase).toSet
    val sortBy = shape.output.filter(a => lowered.contains(a.name.toLowerCase))
    val sort = if (sortBy.isEmpty) None else Some(StagedFileWrite.sorter(shape.output, sortBy))
    val checks = Option(plan.get("checks")).filterNot(_.isNull).map(_.toString)
    val failed: Throwable => Throwable =
      e => checks.flatMap(c => RowChecks.violation(e, Brain.json.readTree(c))).getOrElse(e)
    val hadoopConf = session.sessionState.newHadoopConf()
    val partitionApp = (p: Int) => s"$appId/rtm-p$p"
    // The commits' `write.plan` arguments, once per epoch: the query's session (Spark's
    // clone for the stream) and the epoch's plan do not change within it, and gathering
    // them (the session's confs, the schema's JSON) cost ~0.6 ms per commit (p99 4 ms).
    val commitArgs = DeltaBatchWrite.planArgs(session, schema, SaveMode.Append, base, None, None)
    // The epoch's start: the interval, and the row log's directory (its segments of
    // epochs before this one past their retention deleted).
    val first = transactions(Seq.empty, Some((appId, epoch)))
    val intervalMs = first.path("intervalMs").asLong()
    val rowLog = Option(first.get("rowLog")).filterNot(_.isNull).map { dir =>
      // The frames hold the values a reader of the table gets: the plan without the
      // Parquet files' partition value escapes, and without the row checks the Parquet
      // path runs first; an empty string partition value reads back as null (Delta).
      val logical = plan.deepCopy[ObjectNode]()
      logical.putArray("escapedPartitions")
      logical.remove("checks")
      val lowered = partitions.map(_.toLowerCase).toSet
      RowLogWrite.Target(dir.asText(), StagedFileWrite.shape(session, schema, { df =>
        val shaped = DeltaBatchWrite.prepared(df, logical, shape = true)
        shaped.select(shaped.schema.fields.toSeq.map { f =>
          val c = shaped.col("`" + f.name.replace("`", "``") + "`")
          if (f.dataType == StringType && lowered.contains(f.name.toLowerCase)) {
            when(c === "", lit(null).cast(StringType)).otherwise(c).alias(f.name)
          } else c
        }: _*)
      }))
    }
    val runId = RealTimeQueries.runId(query)
    val endpoint = RealTimeCommits.open(env => new RealTimeCommitEndpoint(env,
      p => committedRows(transactions(Seq(partitionApp(p))).path("versions")
        .path(partitionApp(p)), epoch),
      rolls => commitRolls(rolls, partitionApp, s"$appId/rtm", queryId, commitArgs, hadoopConf,
        rowLog.isDefined),
      dir => RealTimeQueries.delete(dir, hadoopConf), intervalMs,
      e => failEpoch(epoch, runId, e)))
    planned = Some(Planned(epoch, plan, base, None, Some(endpoint), rowLog.map(_.directory)))
    logInfo(s"deltaflow real-time epoch $epoch into ${info.uri}: commits as rows are ready, " +
      s"at most one every $intervalMs ms" + rowLog.map(t => s"; row log ${t.directory}").getOrElse(""))
    val graceMs = RealTimeCommits.graceMs(session.conf.getOption(RealTimeCommits.GraceConf))
    new RealTimeWriterFactory(endpoint.name, plan.get("staging").asText(), template, shape, sort,
      failed, intervalMs, graceMs, rowLog)
  }

  // A real-time commit failed: the epoch's job is cancelled now (RealTimeQueries.failRun
  // says why). The reason names the run (its job group): were the user's stop() to race
  // with this, Spark's `isInterruptionException` would still read a stop. It ends with the
  // error's own text and wire marker, which the query's exception then shows.
  private def failEpoch(epoch: Long, runId: String, e: Throwable): Unit = {
    val error = DeltaflowException.carried(e).map(_.getMessage).getOrElse(e.toString)
    val reason = s"because a real-time commit of epoch $epoch into ${info.uri} failed (query " +
      s"run $runId), so the query stops now rather than at the epoch's end: $error"
    logWarning(s"deltaflow cancels the running job of query run $runId: a real-time commit " +
      s"into ${info.uri} failed ($e)")
    RealTimeQueries.failRun(session.sparkContext, runId, reason)
  }

  private def transactions(appIds: Seq[String], start: Option[(String, Long)] = None): JsonNode = {
    val args = Brain.newArgs()
    args.put("path", checked.path)
    start.foreach { case (appId, epoch) => args.put("appId", appId); args.put("epoch", epoch) }
    val opts = args.putObject("options")
    options.foreach { case (k, v) => opts.put(k, v) }
    val ids = args.putArray("appIds")
    appIds.foreach(ids.add)
    Brain.call("sink.transactions", args)
  }

  // One interval's rolls, across partitions, as one Delta commit with each partition's app
  // transaction (`sink.commitRolls`: planned, moved and committed in one brain call).
  private def commitRolls(rolls: Seq[RealTimeCommits.Roll], app: Int => String,
      cacheKey: String, queryId: String, commitArgs: ObjectNode,
      hadoopConf: org.apache.hadoop.conf.Configuration, rowLog: Boolean): Unit = {
    def version(roll: RealTimeCommits.Roll): Long = {
      if (roll.toRow >= (1L << 32) || roll.epoch >= (1L << 31)) {
        throw new IllegalStateException(s"deltaflow: a real-time epoch of more than 2^32 " +
          s"rows in one partition (epoch ${roll.epoch}) cannot be recorded: use a shorter epoch")
      }
      (roll.epoch << 32) | roll.toRow
    }
    val head = rolls.head
    val args = commitArgs.deepCopy()
    args.put("staging", head.directory)
    DeltaBatchWrite.putStream(args, (cacheKey, version(head), queryId))
    // The brain tags each roll's adds with its row log positions.
    if (rowLog) args.put("rowLog", true)
    val list = args.putArray("rolls")
    rolls.foreach { r =>
      val o = list.addObject()
      o.put("directory", r.directory)
      o.put("appId", app(r.partition))
      // Where the roll starts: the brain commits it only if the log ends there.
      o.put("from", (r.epoch << 32) | r.fromRow)
      o.put("version", version(r))
    }
    val result = Brain.call("sink.commitRolls", args)
    if (result.path("route").asText() != "jvm") {
      rolls.foreach(r => RealTimeQueries.delete(r.directory, hadoopConf))
      throw new IllegalStateException(s"deltaflow: the real-time sink's rolls into ${info.uri} " +
        s"could not be committed by the connector's file write (${result.path("route").asText()})")
    }
  }

  override def commit(epochId: Long, messages: Array[WriterCommitMessage]): Unit = {
    val batch = current(epochId)
    (batch.realTime, batch.write) match {
      case (Some(opened), _) =>
        endRealTime(batch)
        RealTimeEpochEnd.check(info.uri, epochId, messages, opened.endpoint.committedRows,
          batch.rowLog)
      case (None, None) => DeltaBatchWrite.report(batch.plan, batch.parameters, None)
      case (None, Some(write)) =>
        var committed = false
        var asked = false
        try {
          write.commit(messages)
          val args = Brain.newArgs()
          args.put("handle", batch.plan.get("handle").asText())
          if (isDirect(batch)) DeltaBatchWrite.putFiles(args, DirectWrite.files(messages))
          asked = true
          val result = Brain.call("write.commit", args)
          committed = true
          logInfo(s"deltaflow stream batch $epochId wrote ${result.path("files").asInt()} " +
            s"files to ${info.uri} at version ${result.path("version").asText()}")
          DeltaBatchWrite.report(batch.plan, batch.parameters, Some(result))
        } finally {
          // Once asked, the brain deletes a direct write's files if it does not commit them.
          if (!committed) discard(batch, if (asked) Array.empty else messages)
        }
    }
  }

  private def isDirect(batch: Planned): Boolean = batch.plan.path("direct").asBoolean(false)

  // Spark's file writer asks the commit coordinator itself (Hadoop's commit protocol,
  // in the task's commit): a second ask for the same attempt would be denied.
  override def useCommitCoordinator(): Boolean = false

  override def abort(epochId: Long, messages: Array[WriterCommitMessage]): Unit =
    planned.filter(_.batchId == epochId).foreach { batch =>
      if (batch.realTime.isDefined) endRealTime(batch) else discard(batch, messages)
    }

  // The end of a real-time epoch: its rolls are in the log (or dropped); the endpoint
  // drains its committer and closes, then the epoch's staging directory goes.
  private def endRealTime(batch: Planned): Unit = {
    planned = None
    batch.realTime.foreach(RealTimeCommits.close)
    val args = Brain.newArgs()
    args.put("handle", batch.plan.get("handle").asText())
    try Brain.call("write.abort", args)
    catch { case e: Exception => logWarning(s"deltaflow could not clean up an epoch: $e") }
  }

  override def toString: String = s"DeltaStreamingWrite[${info.uri}]"

  private def current(epochId: Long): Planned = planned.filter(_.batchId == epochId).getOrElse(
    throw new IllegalStateException(s"deltaflow: batch $epochId of the stream into " +
      s"${info.uri} was not planned by this write"))

  private def discard(batch: Planned, messages: Array[WriterCommitMessage]): Unit = {
    planned = None
    // A direct write's reported files are under the table root: delete exactly those.
    if (isDirect(batch)) DirectWrite.delete(batch.plan.get("tableUri").asText(),
      DirectWrite.files(messages), session.sessionState.newHadoopConf())
    batch.write.foreach { write =>
      try write.abort(messages)
      catch { case e: Exception => logWarning(s"deltaflow could not abort a file write: $e") }
    }
    if (batch.write.isDefined) {
      val args = Brain.newArgs()
      args.put("handle", batch.plan.get("handle").asText())
      try Brain.call("write.abort", args)
      catch { case e: Exception => logWarning(s"deltaflow could not clean up a failed write: $e") }
    }
  }
}

object DeltaStreamingWrite {
  // Spark's local property naming the micro-batch being run (MicroBatchExecution.BATCH_ID_KEY).
  private val BatchIdKey = "streaming.sql.batchId"
  private val CheckpointConf = "spark.sql.streaming.checkpointLocation"

  private final case class Planned(batchId: Long, plan: JsonNode,
      parameters: Map[String, String], write: Option[BatchWrite],
      realTime: Option[RealTimeCommits.Opened] = None, rowLog: Option[String] = None)

  /** The rows of `epoch` a partition's app transaction `version` records (all of them
   *  when it records a later epoch; none when an earlier one or nothing). */
  private[spark] def committedRows(version: JsonNode, epoch: Long): Long =
    if (version == null || version.isNull || version.isMissingNode) 0L
    else {
      val v = version.asLong()
      val recorded = v >>> 32
      if (recorded == epoch) v & 0xffffffffL
      else if (recorded > epoch) Long.MaxValue
      else 0L
    }

  /** The brain's checked sink settings: the table's path, the write options each batch
   *  uses and the app id a pipeline flow names. */
  final case class Checked(path: String, writeOptions: Map[String, String], appId: Option[String],
      rowLog: Boolean)

  // One check per query and settings: Spark builds the write again for every micro-batch.
  private val checkedStreams = new ConcurrentHashMap[(String, Map[String, String], Boolean), Checked]()

  /** The brain's `sink.check` of a stream into `info` (typed errors for wrong settings). */
  def check(session: SparkSession, info: TableInfo, options: Map[String, String],
      queryId: String, overwrite: Boolean): Checked =
    checkedStreams.computeIfAbsent((queryId, options, overwrite), _ => {
      val args = Brain.newArgs()
      val opts = args.putObject("options")
      options.foreach { case (k, v) => if (!k.equalsIgnoreCase("path")) opts.put(k, v) }
      opts.put("path", info.uri)
      args.put("outputMode", if (overwrite) "complete" else "append")
      // Spark resolved the checkpoint (option, or the session's root) before the first
      // batch; the brain only needs to know there is one, and the table exists.
      val checkpoint = options.collectFirst {
        case (k, v) if k.equalsIgnoreCase("checkpointLocation") => v
      }.orElse(session.conf.getOption(CheckpointConf)).getOrElse(info.uri + "/_delta_log")
      args.put("checkpointLocation", checkpoint)
      args.putArray("partitionColumns")
      args.put("realTime", true)  // may run in real-time mode: a row log is allowed
      val answer = Brain.call("sink.check", args)
      Checked(answer.get("path").asText(),
        answer.get("writeOptions").properties().asScala
          .map(e => e.getKey -> e.getValue.asText()).toMap,
        Option(answer.get("appId")).filterNot(_.isNull).map(_.asText()),
        answer.path("rowLog").asBoolean(false))
    })
}

/** The writers of a batch already in the log: its rows are dropped. */
class DroppingWriterFactory extends StreamingDataWriterFactory {
  override def createWriter(partitionId: Int, taskId: Long, epochId: Long): DataWriter[InternalRow] =
    new DataWriter[InternalRow] {
      override def write(record: InternalRow): Unit = ()
      override def commit(): WriterCommitMessage = DroppedRows
      override def abort(): Unit = ()
      override def close(): Unit = ()
    }
}

case object DroppedRows extends WriterCommitMessage

/** Each task's writer: rows shaped, sorted by partition when the table is partitioned,
 *  and written by Spark's file writer; a row check's failure raised typed. */
class ShapedWriterFactory(
    files: DataWriterFactory,
    shape: StagedFileWrite.Shape,
    sort: Option[SortExec],
    checks: Option[String]) extends StreamingDataWriterFactory {
  override def createWriter(partitionId: Int, taskId: Long, epochId: Long): DataWriter[InternalRow] = {
    val rules = checks.map(c => Brain.json.readTree(c))
    new StagedFileWrite.ShapedWriter(files.createWriter(partitionId, taskId), shape, sort,
      partitionId, e => rules.flatMap(RowChecks.violation(e, _)).getOrElse(e))
  }
}

/** `TRUNCATE TABLE` of a Delta table: an overwrite with no rows, one commit that removes
 *  every file and keeps the schema, partitioning and properties (as delta-spark's
 *  truncate on Databricks does). */
object DeltaTruncate {
  def truncate(info: TableInfo): Boolean = {
    val session = SparkSession.active
    val empty = session.createDataFrame(session.sparkContext.emptyRDD[Row], info.schema)
    DeltaBatchWrite.save(empty, SaveMode.Overwrite, Map("path" -> info.uri))
    true
  }
}

/**
 * The checks of a stream into a Delta table Spark's `start()` / `toTable()` runs (its
 * analysis of the stream's write). Update output mode means append when the query
 * emits each row once (a stateless query; what Spark's real-time mode runs); with an
 * operator that re-emits a key's row on every change ([[StreamWriteCheck.perKey]]) it
 * is the brain's typed error here, rather than duplicates in the table or Spark's
 * untyped refusal in the first micro-batch.
 */
class StreamWriteCheck extends (LogicalPlan => Unit) {
  override def apply(plan: LogicalPlan): Unit = plan match {
    case w: WriteToStream if w.outputMode == OutputMode.Update() =>
      val uri = w.sink match {
        case t: DeltaTable => Some(t.info.uri)
        case t: LocatedPythonTable => Some(t.name())
        case s: DeltaSink => Some(s.path)
        case _ => None
      }
      uri.foreach { path =>
        val args = Brain.newArgs()
        args.putObject("options").put("path", path)
        args.put("outputMode", "update")
        args.put("modeOnly", true)
        // Real-time mode runs update mode only: the write finds its query through this.
        RealTimeQueries.remember(SparkSession.active)
        val operators = args.putArray("perKeyOperators")
        StreamWriteCheck.perKey(w.inputQuery).foreach(operators.add)
        Brain.call("sink.check", args)
      }
    case _ =>
  }
}

object StreamWriteCheck {
  // Logical operators whose update-mode output re-emits a key's row on every change (by
  // node name: the classes moved between Spark versions). Deduplication emits each row
  // once, so it stays an append.
  private val PerKeyNodes = Set("FlatMapGroupsWithState", "FlatMapGroupsInPandasWithState",
    "TransformWithState", "TransformWithStateInPySpark", "TransformWithStateInPandas")

  /** The operators of a streaming query that make its update mode more than an append. */
  def perKey(query: LogicalPlan): Seq[String] = query.collect {
    case a: Aggregate if a.isStreaming => "a streaming aggregation"
    case n if PerKeyNodes.contains(n.nodeName) => n.nodeName
  }.distinct
}
