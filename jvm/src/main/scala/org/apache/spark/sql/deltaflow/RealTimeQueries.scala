package org.apache.spark.sql.deltaflow

import java.util.UUID

import org.apache.hadoop.fs.Path

import org.apache.spark.SparkContext
import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2ScanExecBase

/** Finding the streaming query behind a sink's write, checking its plan, and failing its
 *  running epoch. */
object RealTimeQueries extends Logging {
  // The sessions that started streams into Delta tables (weakly: they come and go).
  private val sessions = java.util.Collections.synchronizedMap(
    new java.util.WeakHashMap[SparkSession, java.lang.Boolean]())

  def remember(session: SparkSession): Unit = sessions.put(session, java.lang.Boolean.TRUE)

  /** Set `key` on the session unless it was set there (explicitly: a default does not count). */
  def setUnlessSet(session: SparkSession, key: String, value: String): Unit = {
    val conf = session.asInstanceOf[org.apache.spark.sql.classic.SparkSession].sessionState.conf
    if (!conf.contains(key)) conf.setConfString(key, value)
  }

  // Spark's query classes moved between 4.x versions: reached by method name.
  private def invoke(target: AnyRef, method: String): AnyRef =
    target.getClass.getMethod(method).invoke(target)

  /** The running query (Spark's StreamExecution) with id `queryId`, when one is known. */
  def find(queryId: String): Option[AnyRef] = {
    val id = UUID.fromString(queryId)
    val known = sessions.synchronized(sessions.keySet().toArray.toSeq.map(_.asInstanceOf[SparkSession]))
    val candidates = known ++ SparkSession.getDefaultSession.toSeq
    candidates.iterator.map(s => Option(s.streams.get(id))).collectFirst {
      case Some(wrapper) => invoke(wrapper, "streamingQuery")
    }
  }

  /** The query's run id: Spark's streaming runs every job of a run in the job group named
   *  by it (`StreamExecution.runStream`: `setJobGroup(runId, ..., interruptOnCancel = true)`). */
  def runId(query: AnyRef): String = invoke(query, "runId").toString

  /**
   * Fail the running real-time epoch of the run `runId` now: its job group's running jobs
   * are cancelled with `reason` (their error reads `Job <id> cancelled <reason>`, and the
   * query ends with it; Spark logs a warning when none runs).
   *
   * Why the driver cancels the epoch's job when a real-time commit fails, rather than the
   * task failing itself (issue 28): between rows a real-time task thread is inside its
   * source's reader (`nextWithTimeout`: deltaflow's poll sleeps, Kafka's consumer polls,
   * Spark's memory stream waits), not in the sink, for up to the epoch's length. Only an
   * interrupt reaches it there, and each source answers one with its own error (an
   * `InterruptedException`, Kafka's `InterruptException`) or swallows it; that error, not
   * the typed one, would then fail the task. The driver's endpoint is the one that saw
   * the commit fail, and cancelling a job is Spark's own way to end an epoch at once, on
   * every master, whatever the source: the tasks are interrupted and aborted (their rolls
   * deleted) and the write's `abort` ends the epoch as after any failed job. The reason
   * carries the typed error's text and wire marker, so `typed_error(query.exception())`
   * gives the error a later row or the epoch's end gave before. The group, not job ids
   * from the status tracker: the scheduler knows its active jobs at once, the tracker
   * only once the listener bus delivered their start (`cancelJobGroup(id, reason)`:
   * Spark 4.0+).
   */
  def failRun(sc: SparkContext, runId: String, reason: String): Unit =
    sc.cancelJobGroup(runId, reason)

  /** Whether the query runs in real-time mode (`trigger(realTime=...)`, Spark >= 4.1). */
  def isRealTime(query: AnyRef): Boolean =
    invoke(query, "trigger").getClass.getSimpleName.startsWith("RealTimeTrigger")

  /** The physical plan of the epoch being run. */
  def executedPlan(query: AnyRef): Option[SparkPlan] =
    Option(invoke(query, "lastExecution")).map(e => invoke(e, "executedPlan").asInstanceOf[SparkPlan])

  // Physical operators that keep each row in its source partition, in order, and compute
  // it from the row alone: an epoch replayed from its start offsets gives the same rows
  // in the same order per partition. A shuffle or a stateful operator does not.
  private val Replayable = Set("WholeStageCodegenExec", "InputAdapter", "ProjectExec",
    "FilterExec", "RealTimeStreamScanExec", "WriteToDataSourceV2Exec", "SerializeFromObjectExec",
    "DeserializeToObjectExec", "MapElementsExec", "MapPartitionsExec", "AppendColumnsExec",
    "GenerateExec", "ExpandExec", "ColumnarToRowExec", "CollectMetricsExec",
    "BroadcastHashJoinExec", "BroadcastExchangeExec", "ReusedExchangeExec",
    "EventTimeWatermarkExec", "LocalTableScanExec", "FileSourceScanExec", "BatchScanExec",
    "RangeExec", "BroadcastQueryStageExec", "AdaptiveSparkPlanExec")

  /** The state checkpoint format the query's epoch runs with (Spark's
   *  `checkpointFormatVersion`; real-time mode's own default is 2). */
  def checkpointFormat(query: AnyRef): Int =
    Option(invoke(query, "lastExecution")).flatMap { e =>
      explicitConf(invoke(e, "sparkSession").asInstanceOf[SparkSession], CheckpointFormat)
    }.flatMap(_.trim.toIntOption).getOrElse(2)

  /** `key`'s value when set on the session (a registered default does not count). */
  def explicitConf(session: SparkSession, key: String): Option[String] =
    session.asInstanceOf[org.apache.spark.sql.classic.SparkSession].sessionState.conf
      .getAllConfs.get(key)

  val CheckpointFormat = "spark.sql.streaming.stateStore.checkpointFormatVersion"

  /**
   * The operators of `plan`'s streaming side that a replay would not repeat row for row.
   *
   * `dropDuplicates` (Spark >= 4.3: a shuffle, then `StreamingDeduplicateExec`) is
   * replayable when every shuffle reads from one producer partition: Spark's streaming
   * shuffle keeps one writer's rows in order at each reader, and the dedup operator is a
   * per-row filter over the state a rerun loads at the previous epoch's checkpoint id
   * (checkpoint format 2), so each reader's n-th row is the same row in every run. Several
   * producers (a union, a multi-partition source) interleave in arrival order, which differs
   * between runs; a range partitioning samples. Both are named here.
   */
  def notReplayable(plan: SparkPlan, checkpointFormat: Int = 2): Seq[String] = {
    def streaming(p: SparkPlan): Boolean =
      p.getClass.getSimpleName == "RealTimeStreamScanExec" || p.children.exists(streaming)
    def check(p: SparkPlan): Option[String] = p.getClass.getSimpleName match {
      case name if Replayable.contains(name) => None
      case "ShuffleExchangeExec" =>
        val producers = sourcePartitions(p.children.head)
        val partitioning = p.outputPartitioning.getClass.getSimpleName
        if (partitioning == "RangePartitioning") Some(s"${p.nodeName} (range partitioning)")
        else if (producers != 1) Some(s"${p.nodeName} from $producers source partitions")
        else None
      case "StreamingDeduplicateExec" =>
        if (checkpointFormat < 2) Some(s"${p.nodeName} (checkpoint format v$checkpointFormat)")
        else None
      case _ => Some(p.nodeName)
    }
    // The partitions a stage's streaming side reads (a scan reports none in its
    // outputPartitioning): its scans' input partitions, or an exchange's reducers.
    def sourcePartitions(p: SparkPlan): Int = p match {
      case s: DataSourceV2ScanExecBase => s.partitions.size
      case e if e.getClass.getSimpleName == "ShuffleExchangeExec" => e.outputPartitioning.numPartitions
      case _ => p.children.filter(streaming).map(sourcePartitions).sum
    }
    def walk(p: SparkPlan): Seq[String] =
      (if (streaming(p)) check(p).toSeq else Nil) ++ p.children.flatMap(walk)
    walk(plan).distinct
  }

  /** A roll's directory, for the driver to delete. */
  def delete(directory: String, conf: org.apache.hadoop.conf.Configuration): Unit = {
    val path = new Path(directory)
    try path.getFileSystem(conf).delete(path, true)
    catch { case e: Exception => logWarning(s"deltaflow could not delete $directory: $e") }
  }
}
