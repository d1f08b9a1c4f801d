package org.apache.spark.sql.deltaflow

import java.util.UUID
import java.util.concurrent.{Executors, ScheduledExecutorService, ThreadFactory, TimeUnit}

import scala.collection.mutable

import org.apache.hadoop.fs.Path

import org.apache.spark.{SparkEnv, TaskContext}
import org.apache.spark.internal.Logging
import org.apache.spark.rpc.{RpcCallContext, RpcEnv, ThreadSafeRpcEndpoint}
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.connector.write.{DataWriter, WriterCommitMessage}
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory
import org.apache.spark.sql.execution.{SortExec, SparkPlan}
import org.apache.spark.util.RpcUtils

/**
 * Commits inside a real-time mode epoch (Spark >= 4.1 `trigger(realTime=...)`), where a
 * task runs for the whole epoch and Spark's own commit comes only at its end.
 *
 * Each task's [[RealTimeWriter]] writes its rows into a short file write (a roll) and,
 * every commit interval, hands the roll to the driver's [[RealTimeCommitEndpoint]] with
 * the rows it covers, counted from the epoch's start in that task's partition
 * (`fromRow` until `toRow`). The driver commits each roll as one Delta commit carrying
 * the app transaction (`<app id>/rtm-p<partition>`, `epoch << 32 | toRow`).
 *
 * Exactly once rests on deterministic replay: a stateless query without a shuffle reads
 * each sink partition's rows from one source partition in the source's order, so when
 * Spark runs an epoch again from its start offsets (a task retry, a driver restart), the
 * n-th row of a partition is the same row. A new attempt asks the driver how many rows
 * of its partition are committed in this epoch and drops that many before writing. The
 * driver takes a roll only from the partition's newest attempt and only when it starts
 * where the committed rows end, so a stale attempt can neither duplicate nor skip rows.
 * [[RealTimeQueries.refuseNondeterministic]] refuses plans that break the premise.
 */
object RealTimeCommits {
  final case class Start(epoch: Long, partition: Int, attempt: Int)
  final case class Roll(epoch: Long, partition: Int, attempt: Int, fromRow: Long, toRow: Long,
      directory: String)

  /** What a task's commit reports: the rows its partition saw in the epoch. */
  final case class Rows(partition: Int, rows: Long) extends WriterCommitMessage

  /** Register the epoch's endpoint on the driver; its name, for the writers. */
  def open(endpoint: RpcEnv => RealTimeCommitEndpoint): String = {
    val env = SparkEnv.get
    val name = s"deltaflow-rtm-${UUID.randomUUID()}"
    env.rpcEnv.setupEndpoint(name, endpoint(env.rpcEnv))
    name
  }

  def close(name: String): Unit = {
    val env = SparkEnv.get
    try env.rpcEnv.stop(RpcUtils.makeDriverRef(name, env.conf, env.rpcEnv))
    catch { case _: Exception => () }
  }
}

/**
 * The driver's side of one epoch: `committed(partition)` is the rows of the epoch the
 * table already holds for a partition (its app transaction), `commit` commits a roll
 * (or, returning false, found it committed already and dropped it). One message at a
 * time (a `ThreadSafeRpcEndpoint`): the counts below are the truth between commits.
 */
class RealTimeCommitEndpoint(
    override val rpcEnv: RpcEnv,
    committed: Int => Long,
    commit: RealTimeCommits.Roll => Unit,
    discard: String => Unit) extends ThreadSafeRpcEndpoint with Logging {
  import RealTimeCommits._

  private val attempts = mutable.Map[Int, Int]()
  private val through = mutable.Map[Int, Long]()

  override def receiveAndReply(context: RpcCallContext): PartialFunction[Any, Unit] = {
    case Start(_, partition, attempt) =>
      try {
        attempts(partition) = attempt
        context.reply(through.getOrElseUpdate(partition, committed(partition)))
      } catch { case e: Exception => context.sendFailure(e) }
    case roll: Roll =>
      val expected = through.getOrElse(roll.partition, -1L)
      if (!attempts.get(roll.partition).contains(roll.attempt) || roll.fromRow != expected) {
        discard(roll.directory)
        context.sendFailure(new IllegalStateException(s"deltaflow: a stale roll of partition " +
          s"${roll.partition} (attempt ${roll.attempt}, rows ${roll.fromRow}-${roll.toRow}; " +
          s"committed through $expected by attempt ${attempts.get(roll.partition)})"))
      } else {
        try {
          commit(roll)
          through(roll.partition) = roll.toRow
          context.reply(true)
        } catch { case e: Exception => context.sendFailure(e) }
      }
  }
}

/** The writers of a real-time epoch (see [[RealTimeCommits]]). */
class RealTimeWriterFactory(
    endpoint: String,
    staging: String,
    template: FileRolls.RollTemplate,
    shape: StagedFileWrite.Shape,
    sort: Option[SortExec],
    failed: Throwable => Throwable,
    intervalMs: Long) extends StreamingDataWriterFactory {
  override def createWriter(partitionId: Int, taskId: Long, epochId: Long): DataWriter[InternalRow] =
    new RealTimeWriter(endpoint, staging, template, shape, sort, failed, intervalMs,
      partitionId, taskId, epochId)
}

/**
 * One task's writer in a real-time epoch: rows go into the current roll; a timer thread
 * hands a roll to the driver once it is `intervalMs` old (rows arrive one at a time, and
 * a quiet source must not hold the last ones back), and the task's commit hands over
 * what is left. Writes and hand-overs take turns on one lock.
 */
class RealTimeWriter(
    endpoint: String,
    staging: String,
    template: FileRolls.RollTemplate,
    shape: StagedFileWrite.Shape,
    sort: Option[SortExec],
    failed: Throwable => Throwable,
    intervalMs: Long,
    partitionId: Int,
    taskId: Long,
    epochId: Long) extends DataWriter[InternalRow] with Logging {
  import RealTimeCommits._

  private val env = SparkEnv.get
  private val driver = RpcUtils.makeDriverRef(endpoint, env.conf, env.rpcEnv)
  private val task = TaskContext.get()
  private val attempt = Option(task).map(_.attemptNumber()).getOrElse(0)
  // Rows of this partition the table holds for the epoch already: a replay drops them.
  private val skip: Long = driver.askSync[Long](Start(epochId, partitionId, attempt))
  private val lock = new Object
  private var seen = 0L
  private var rolls = 0
  private var current: Option[(FileRolls.Roll, StagedFileWrite.ShapedWriter, Long, Long)] = None
  @volatile private var failure: Throwable = _

  private val timer: ScheduledExecutorService = Executors.newSingleThreadScheduledExecutor(
    new ThreadFactory {
      override def newThread(r: Runnable): Thread = {
        // Spark's file writer reads the task's context from its thread.
        val t = new Thread(() => { TaskContext.setTaskContext(task); r.run() },
          s"deltaflow-rtm-commit-p$partitionId-e$epochId")
        t.setDaemon(true)
        t
      }
    })
  private val tick = math.max(1L, intervalMs / 4)
  timer.scheduleWithFixedDelay(() => {
    try lock.synchronized {
      current.foreach { case (_, _, _, started) =>
        if (System.currentTimeMillis() - started >= intervalMs) handOver()
      }
    } catch { case e: Throwable => if (failure == null) failure = e }
  }, tick, tick, TimeUnit.MILLISECONDS)

  override def write(row: InternalRow): Unit = lock.synchronized {
    if (failure != null) throw failure
    seen += 1
    if (seen > skip) {
      val (_, writer, _, _) = current.getOrElse {
        val directory = s"$staging/p$partitionId-e$epochId-a$attempt-r${seen - 1}"
        val roll = new FileRolls.Roll(template, directory, partitionId,
          taskId * 100000L + rolls)
        rolls += 1
        val shaped = new StagedFileWrite.ShapedWriter(roll.writer, shape, sort, partitionId, failed)
        val opened = (roll, shaped, seen - 1, System.currentTimeMillis())
        current = Some(opened)
        opened
      }
      writer.write(row)
    }
  }

  // Under `lock`: the current roll's files committed into its directory, then the driver
  // commits them to the table. A failure fails the task (Spark replays the epoch).
  private def handOver(): Unit = current.foreach { case (roll, writer, from, _) =>
    current = None
    try {
      roll.finish(writer.commit())
      writer.close()
    } catch {
      case e: Throwable =>
        try roll.abort() catch { case _: Throwable => () }
        throw e
    }
    driver.askSync[Boolean](Roll(epochId, partitionId, attempt, from, seen, roll.directory))
  }

  override def commit(): WriterCommitMessage = {
    timer.shutdown()
    timer.awaitTermination(1, TimeUnit.MINUTES)
    lock.synchronized {
      if (failure != null) throw failure
      handOver()
      Rows(partitionId, seen)
    }
  }

  override def abort(): Unit = {
    timer.shutdownNow()
    lock.synchronized {
      current.foreach { case (roll, writer, _, _) =>
        try writer.abort() catch { case _: Throwable => () }
        try roll.abort() catch { case _: Throwable => () }
      }
      current = None
    }
  }

  override def close(): Unit = timer.shutdownNow()
}

/** Finding the streaming query behind a sink's write, and checking its plan. */
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

  /** The operators of `plan`'s streaming side that a replay would not repeat row for row. */
  def notReplayable(plan: SparkPlan): Seq[String] = {
    def streaming(p: SparkPlan): Boolean =
      p.getClass.getSimpleName == "RealTimeStreamScanExec" || p.children.exists(streaming)
    def walk(p: SparkPlan): Seq[String] =
      (if (streaming(p) && !Replayable.contains(p.getClass.getSimpleName)) Seq(p.nodeName)
       else Nil) ++ p.children.flatMap(walk)
    walk(plan).distinct
  }

  /** A roll's directory, for the driver to delete. */
  def delete(directory: String, conf: org.apache.hadoop.conf.Configuration): Unit = {
    val path = new Path(directory)
    try path.getFileSystem(conf).delete(path, true)
    catch { case e: Exception => logWarning(s"deltaflow could not delete $directory: $e") }
  }
}
