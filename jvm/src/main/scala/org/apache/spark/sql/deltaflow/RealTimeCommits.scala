package org.apache.spark.sql.deltaflow

import java.util.UUID
import java.util.concurrent.{ExecutionException, ExecutorService, Executors, Future,
  RejectedExecutionException, ThreadFactory, TimeUnit}

import scala.collection.mutable

import org.apache.spark.{SparkEnv, TaskContext}
import org.apache.spark.internal.Logging
import org.apache.spark.rpc.{RpcCallContext, RpcEnv, ThreadSafeRpcEndpoint}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection
import org.apache.spark.sql.connector.write.{DataWriter, WriterCommitMessage}
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory
import org.apache.spark.sql.execution.SortExec
import org.apache.spark.util.RpcUtils

/**
 * Commits inside a real-time mode epoch (Spark >= 4.1 `trigger(realTime=...)`), where a
 * task runs for the whole epoch and Spark's own commit comes only at its end.
 *
 * Each task's [[RealTimeWriter]] writes its rows into a short file write (a roll) and
 * hands the roll to the driver's [[RealTimeCommitEndpoint]] as soon as it has rows and
 * the previous one is committed (closing it just before the driver's next commit may
 * start), with the rows it covers, counted from the epoch's start in that task's
 * partition (`fromRow` until `toRow`). The driver commits the rolls waiting together,
 * across partitions, as one Delta commit carrying each partition's app transaction
 * (`<app id>/rtm-p<partition>`, `epoch << 32 | toRow`), at most one commit per interval.
 *
 * Exactly once rests on deterministic replay: a stateless query without a shuffle reads
 * each sink partition's rows from one source partition in the source's order, so when
 * Spark runs an epoch again from its start offsets (a task retry, a driver restart), the
 * n-th row of a partition is the same row. A new attempt asks the driver how many rows
 * of its partition are committed in this epoch and drops that many before writing. The
 * driver takes a roll only from the partition's newest attempt and only when it starts
 * where the committed rows end, so a stale attempt can neither duplicate nor skip rows.
 * [[RealTimeQueries.notReplayable]] names the operators that break the premise;
 * `dropDuplicates` keeps it when its shuffle has a single producer partition.
 */
object RealTimeCommits {
  final case class Start(epoch: Long, partition: Int, attempt: Long)
  /** `last`: the task's final roll (its commit), after which its partition writes no more. */
  final case class Roll(epoch: Long, partition: Int, attempt: Long, fromRow: Long, toRow: Long,
      directory: String, last: Boolean = false)

  /** What a task's commit reports: the rows its partition saw in the epoch. */
  final case class Rows(partition: Int, rows: Long) extends WriterCommitMessage

  /** An epoch's endpoint, registered on the driver under `name` (for the writers). */
  final case class Opened(name: String, endpoint: RealTimeCommitEndpoint)

  // How long the epoch's end waits for a group already in the brain (a commit takes
  // tens of ms; a slow store or a compaction after it, seconds).
  private val DrainMs = 60000L

  // How long a roll's first row waits for the rest of its burst before the roll may be
  // handed over (a source hands a commit's or a poll's rows on within a millisecond or
  // two; without this, a burst's first row would go alone and the rest wait an interval).
  // A source that says when its burst is whole (RealTimeIdle) ends the wait sooner.
  val GraceMs = 2L
  // Internal (tests): another grace, in ms.
  val GraceConf = "spark.deltaflow.realTime.graceMs"

  def graceMs(setting: Option[String]): Long =
    setting.flatMap(_.trim.toLongOption).filter(_ >= 0).getOrElse(GraceMs)

  /** How long before the driver's next group may start a writer closes its roll: the roll
   *  waits there a little, and the rolls of every partition closed for that start go in
   *  one commit however the writers' threads are scheduled. Rows arriving meanwhile wait
   *  one more interval: a tenth of the interval trades that against gathering. */
  def leadMs(intervalMs: Long): Long = math.max(1L, intervalMs / 10)

  /** Register the epoch's endpoint on the driver. */
  def open(endpoint: RpcEnv => RealTimeCommitEndpoint): Opened = {
    val env = SparkEnv.get
    val name = s"deltaflow-rtm-${UUID.randomUUID()}"
    val created = endpoint(env.rpcEnv)
    env.rpcEnv.setupEndpoint(name, created)
    Opened(name, created)
  }

  /** The epoch's end: the committer takes no more groups and finishes the one it is
   *  committing (so the staging directory is not deleted under it), then the endpoint
   *  stops, refusing what still waits. */
  def close(opened: Opened): Unit = {
    opened.endpoint.drain(DrainMs)
    val env = SparkEnv.get
    try env.rpcEnv.stop(RpcUtils.makeDriverRef(opened.name, env.conf, env.rpcEnv))
    catch { case _: Exception => () }
  }
}

/**
 * An epoch must not end short of rows it already made visible. Spark fixes a real-time
 * epoch's deadline once, for every attempt of its tasks, and takes each partition's end
 * offset from the attempt that succeeded. A task retried inside the epoch (a cluster's
 * `spark.task.maxFailures`, an executor lost) that starts near or past the deadline reads
 * fewer rows than the failed attempt did, or none; yet the failed attempt's rolls may be
 * committed (and, with a row log, its frames read). The next epoch would then read those
 * rows again and write them twice. So the epoch's commit fails instead, before Spark
 * records its offsets: the query stops with `RealTimeEpochError`, and its restart replays
 * the epoch, with a deadline of its own, from the same offsets.
 */
object RealTimeEpochEnd {
  /** `(partition, rows the epoch ended with, rows already visible)` for each partition
   *  whose successful attempt saw fewer rows than the table holds for the epoch
   *  (`committed`) or than its row log reaches (`logged`, asked only for partitions with
   *  more than one segment in the epoch: one attempt logs only rows it saw). */
  def shortfalls(messages: Array[WriterCommitMessage], committed: Map[Int, Long],
      logged: Int => Long): Seq[(Int, Long, Long)] =
    messages.toSeq.collect { case RealTimeCommits.Rows(partition, rows) =>
      val held = committed.getOrElse(partition, 0L)
      val visible = if (rows < held) held else math.max(held, logged(partition))
      (partition, rows, visible)
    }.filter { case (_, rows, visible) => rows < visible }

  def check(uri: String, epoch: Long, messages: Array[WriterCommitMessage],
      committed: Map[Int, Long], rowLog: Option[String]): Unit = {
    val logged: Int => Long = p => rowLog.map { dir =>
      val listed = io.deltaflow.spark.RowLog.segments(new java.io.File(s"$dir/p$p"))
        .filter(_.epoch == epoch)
      if (listed.size > 1) io.deltaflow.spark.RowLog.loggedThrough(listed) else 0L
    }.getOrElse(0L)
    shortfalls(messages, committed, logged).headOption.foreach { case (p, rows, visible) =>
      throw io.deltaflow.spark.DeltaflowException.of("RealTimeEpochError",
        s"Real-time epoch $epoch into $uri ended short in partition $p: its last task " +
          s"attempt read $rows rows, but $visible of the epoch are already in the table or " +
          "its row log (an earlier attempt wrote them; the retry started too near the " +
          "epoch's deadline to read them again). The epoch is not committed, so no row is " +
          "written twice: restart the query from its checkpoint, and it replays the epoch. " +
          "Leave a spare task slot per executor so a retried task starts well before the " +
          "deadline.",
        Map("table_uri" -> uri),
        numbers = Map("epoch" -> epoch, "partition" -> p.toLong, "rows" -> rows,
          "visible" -> visible))
    }
  }
}

/** How long one step of the real-time sink took, each time (kept for the epoch's timing
 *  line in the log: where a row's latency goes). A few thousand samples an epoch. */
final class StepTimes(name: String) {
  private val samples = mutable.ArrayBuffer[Long]()  // nanoseconds

  def add(nanos: Long): Unit = synchronized { if (samples.size < 200000) samples += nanos }

  def time[T](f: => T): T = {
    val started = System.nanoTime()
    try f finally add(System.nanoTime() - started)
  }

  def summary: String = synchronized {
    if (samples.isEmpty) s"$name -"
    else {
      val sorted = samples.sorted
      def ms(q: Double): Double = sorted(math.min(sorted.size - 1, (q * sorted.size).toInt)) / 1e6
      f"$name ${sorted.size}x p50 ${ms(0.5)}%.1f p99 ${ms(0.99)}%.1f max ${sorted.last / 1e6}%.1f ms"
    }
  }
}

/**
 * The driver's side of one epoch: `committed(partition)` is the rows of the epoch the
 * table already holds for a partition (its app transaction); `commit` commits a group of
 * rolls, at most one per partition, as one Delta commit.
 *
 * Group commit: a roll that passes the checks waits; a committer thread takes every
 * waiting roll as one group once each partition still writing has handed one over, or
 * `gatherMs` after the first arrived, and when [[CommitPacing]] lets a group start:
 * `intervalMs` caps the query's Delta commits at `1000 / intervalMs` a second on average,
 * with bursts of up to [[CommitPacing.Burst]] back to back; it is not a clock. Writers hand
 * over when their rolls are ready, not at shared instants; rolls that wait for the pacing
 * are committed together. Each task waits for its roll's group. The counts (`through`) move only when
 * a group is in the log; a new attempt of a partition drops its waiting roll and waits
 * for one being committed, so the count it is told is what the table holds. A failed
 * group forgets its partitions' counts: the next attempt reads them from the log.
 *
 * A failed group also fails the epoch at once: `failEpoch` (once, and not after the
 * epoch's end began) cancels the epoch's job ([[RealTimeQueries.failRun]]), so the query
 * stops with the commit's error even when no row follows, instead of at the epoch's end.
 */
class RealTimeCommitEndpoint(
    override val rpcEnv: RpcEnv,
    committed: Int => Long,
    commit: Seq[RealTimeCommits.Roll] => Unit,
    discard: String => Unit,
    intervalMs: Long,
    failEpoch: Throwable => Unit) extends ThreadSafeRpcEndpoint with Logging {
  import RealTimeCommits._

  // How long the first waiting roll waits for the other partitions' when the spacing does
  // not hold it anyway: writers hand over when ready, so rolls closed at about the same
  // moment share a commit, while a partition whose neighbours are idle pays only this.
  private val gatherMs = 2L
  private val lock = new Object
  private val attempts = mutable.Map[Int, Long]()
  private val through = mutable.Map[Int, Long]()
  private val writing = mutable.Set[Int]()  // partitions started and not finished
  private val waiting = mutable.ArrayBuffer[(Roll, RpcCallContext)]()
  private val inFlight = mutable.Set[Int]()
  private var firstWaiting = 0L
  private val pacing = new CommitPacing(intervalMs)
  private var stopped = false
  private var epochFailed = false
  // The epoch's timing line: how long a group waited to form, and its brain commit.
  private val gathered = new StepTimes("gather")
  private val commits = new StepTimes("commit")
  private val committer = new Thread(() => commitLoop(), "deltaflow-rtm-commits")
  committer.setDaemon(true)
  committer.start()

  override def receiveAndReply(context: RpcCallContext): PartialFunction[Any, Unit] = {
    case Start(_, partition, attempt) =>
      try {
        val count = lock.synchronized {
          attempts(partition) = attempt
          writing += partition
          val (stale, kept) = waiting.partition(_._1.partition == partition)
          waiting.clear()
          waiting ++= kept
          stale.foreach { case (r, c) => refuse(r, c) }
          while (inFlight.contains(partition)) lock.wait()
          through.getOrElseUpdate(partition, committed(partition))
        }
        context.reply(count)
      } catch { case e: Exception => context.sendFailure(e) }
    case roll: Roll =>
      lock.synchronized {
        val expected = through.getOrElse(roll.partition, -1L)
        val busy = inFlight.contains(roll.partition) || waiting.exists(_._1.partition == roll.partition)
        if (stopped || busy || !attempts.get(roll.partition).contains(roll.attempt) ||
            roll.fromRow != expected) {
          refuse(roll, context)
        } else {
          if (waiting.isEmpty) firstWaiting = System.currentTimeMillis()
          waiting += ((roll, context))
          if (roll.last) writing -= roll.partition
          lock.notifyAll()
        }
      }
  }

  /** The rows of the epoch the table holds, per partition started in it (final once the
   *  epoch's tasks committed: each waits for its last roll's group). */
  def committedRows: Map[Int, Long] = lock.synchronized(through.toMap)

  private def refuse(roll: Roll, context: RpcCallContext): Unit = {
    discard(roll.directory)
    context.sendFailure(new IllegalStateException(s"deltaflow: a stale roll of partition " +
      s"${roll.partition} (attempt ${roll.attempt}, rows ${roll.fromRow}-${roll.toRow}; " +
      s"committed through ${through.get(roll.partition)} by attempt " +
      s"${attempts.get(roll.partition)})"))
  }

  private def commitLoop(): Unit = {
    while (true) {
      val group = lock.synchronized {
        var ready = false
        while (!ready) {
          if (stopped) return
          if (waiting.isEmpty) lock.wait()
          else {
            val now = System.currentTimeMillis()
            val all = writing.forall(p => waiting.exists(_._1.partition == p))
            val due = math.max(if (all) now else firstWaiting + gatherMs, pacing.nextStart)
            if (now >= due) ready = true else lock.wait(due - now)
          }
        }
        val taken = waiting.toList
        waiting.clear()
        taken.foreach(t => inFlight += t._1.partition)
        val started = System.currentTimeMillis()
        pacing.start(started)
        gathered.add((started - firstWaiting) * 1000000L)
        taken
      }
      val failure = try { commits.time(commit(group.map(_._1))); None }
        catch { case e: Throwable => Some(e) }
      lock.synchronized {
        group.foreach { case (r, _) =>
          if (failure.isEmpty) through(r.partition) = r.toRow else through.remove(r.partition)
          inFlight -= r.partition
        }
        lock.notifyAll()
      }
      // The epoch fails now, before the writers hear why: a writer's task would only
      // throw at its next row or at the epoch's end.
      failure.foreach(failed)
      // Each writer hears how long until the next group may start (relative: executors'
      // clocks are not the driver's), and closes its next roll just before that.
      val nextIn =
        lock.synchronized(math.max(0L, pacing.nextStart - System.currentTimeMillis()))
      failure match {
        case None => group.foreach(_._2.reply(nextIn))
        case Some(e) => group.foreach(_._2.sendFailure(e))
      }
    }
  }

  // Once per epoch, and only while its job runs: a failure after the epoch's end began
  // (the draining group) reaches its tasks, which already wait for it.
  private def failed(e: Throwable): Unit = {
    val first = lock.synchronized {
      val f = !stopped && !epochFailed
      epochFailed = true
      f
    }
    if (first) {
      try failEpoch(e)
      catch { case t: Exception => logWarning(s"deltaflow could not fail the real-time epoch: $t") }
    }
  }

  /** Stop taking groups and wait (at most `timeoutMs`) for the one being committed: after
   *  this no call of this endpoint is in the brain, unless the wait ran out (logged; the
   *  brain then refuses a roll whose directory is gone, so nothing is lost). */
  def drain(timeoutMs: Long): Unit = {
    lock.synchronized {
      stopped = true
      lock.notifyAll()
    }
    if (Thread.currentThread() ne committer) committer.join(timeoutMs)
    if (committer.isAlive) {
      logWarning(s"deltaflow real-time commits: a group still in the brain after $timeoutMs ms " +
        "at the epoch's end")
    }
  }

  override def onStop(): Unit = {
    logInfo(s"deltaflow real-time commits: ${gathered.summary}; ${commits.summary}")
    val left = lock.synchronized {
      stopped = true
      lock.notifyAll()
      val l = waiting.toList
      waiting.clear()
      l
    }
    left.foreach { case (r, c) =>
      discard(r.directory)
      c.sendFailure(new IllegalStateException("deltaflow: the real-time epoch ended"))
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
    intervalMs: Long,
    graceMs: Long,
    rowLog: Option[RowLogWrite.Target]) extends StreamingDataWriterFactory {
  override def createWriter(partitionId: Int, taskId: Long, epochId: Long): DataWriter[InternalRow] =
    new RealTimeWriter(endpoint, staging, template, shape, sort, failed, intervalMs,
      partitionId, taskId, epochId, graceMs, rowLog)
}

/**
 * One task's writer in a real-time epoch: rows go into the current roll; a hand-over
 * thread hands it to the driver as soon as it has rows and the previous hand-over is
 * committed (one roll in flight per partition; rows keep going into the next roll), and
 * the task's commit hands over what is left. A roll goes no sooner than `graceMs` after
 * its first row (the rest of a burst that arrives together comes with it) and no sooner
 * than `leadMs` before the driver's next group may start (the driver would hold it until
 * then; open, it still takes rows). Writes and hand-overs take turns on one lock. The
 * next roll (its directory and open Parquet file) is opened ahead on a thread of its own,
 * as soon as a row starts the current one, so the row path never creates a file. When the
 * task's source says it is idle ([[RealTimeIdle]]), the roll goes without the grace.
 * With a row log ([[RowLog]], `realTimeRowLog`) each row also goes to the attempt's
 * [[RowLogAppender]] at its epoch position, and a roll is handed over only once its rows'
 * frames are synced.
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
    epochId: Long,
    graceMs: Long,
    rowLog: Option[RowLogWrite.Target] = None) extends DataWriter[InternalRow] with Logging {
  import RealTimeCommits._

  private val env = SparkEnv.get
  private val driver = RpcUtils.makeDriverRef(endpoint, env.conf, env.rpcEnv)
  private val task = TaskContext.get()
  // The attempt, unique in the SparkContext: an attempt number restarts at 0 when an epoch
  // reruns as a new job, and a zombie of the old job must not pass for the new attempt.
  private val attempt = Option(task).map(_.taskAttemptId()).getOrElse(taskId)
  // Rows of this partition the table holds for the epoch already: a replay drops them.
  private val skip: Long = driver.askSync[Long](Start(epochId, partitionId, attempt))
  private type Opened = (FileRolls.Roll, StagedFileWrite.ShapedWriter)
  private val lock = new Object
  private var seen = 0L
  private val rolls = new java.util.concurrent.atomic.AtomicInteger()
  private var current: Option[(FileRolls.Roll, StagedFileWrite.ShapedWriter, Long)] = None
  // Times on one monotonic clock (System.nanoTime).
  private var currentStarted = 0L  // when the current roll's first row came
  // No hand-over before: the driver's next group start, ahead.
  private var nextDue = System.nanoTime()
  private val lead = leadMs(intervalMs)
  private val grace = TimeUnit.MILLISECONDS.toNanos(graceMs)
  private var sourceIdle = false  // the task's source said it waits for the next commit
  private var idleHandOvers = 0  // rolls handed over without the grace
  @volatile private var ending = false
  private var next: Option[Future[Opened]] = None  // the roll being opened ahead
  @volatile private var failure: Throwable = _
  // The epoch's timing line (see StepTimes): opening a roll, opens the row path had to
  // wait for, closing a roll's file, the driver's commit of it (the round trip).
  private val opens = new StepTimes("open")
  private val rowWaits = new StepTimes("row path waits for open")
  private val held = new StepTimes("held")  // a roll's first row to its hand-over
  private val finishes = new StepTimes("close")
  private val asks = new StepTimes("commit round trip")

  private def taskThreads(name: String): ThreadFactory = new ThreadFactory {
    override def newThread(r: Runnable): Thread = {
      // Spark's file writer reads the task's context from its thread.
      val t = new Thread(() => { TaskContext.setTaskContext(task); r.run() }, name)
      t.setDaemon(true)
      t
    }
  }
  private val opener: ExecutorService = Executors.newSingleThreadExecutor(
    taskThreads(s"deltaflow-rtm-open-p$partitionId-e$epochId"))
  // The row log (RowLog): each row written is also appended there, at its epoch
  // position, in the table's logical columns (a shape of its own: the Parquet rows may
  // carry escaped partition values).
  private val logged: Option[(RowLogAppender, InternalRow => InternalRow)] = rowLog.map { t =>
    val projections = t.shape.steps.map { exprs =>
      val p = UnsafeProjection.create(exprs)
      p.initialize(partitionId)
      p
    }
    (new RowLogAppender(s"${t.directory}/p$partitionId", epochId, RowLogAppender.schema(t.shape),
      partitionId), (row: InternalRow) => projections.foldLeft(row)((r, p) => p(r)))
  }
  private val handOvers = taskThreads(s"deltaflow-rtm-commit-p$partitionId-e$epochId")
    .newThread(() => handOverLoop())
  handOvers.start()
  RealTimeIdle.listen(attempt, sourceSays)

  private def sourceSays(idle: Boolean): Unit = lock.synchronized {
    logged.foreach(_._1.sourceIdle(idle))  // a whole burst: its frame goes now
    sourceIdle = idle
    lock.notifyAll()  // the hand-over thread: its roll may go now
  }

  // One roll in flight: each ask returns when its group is in the log, and only then is
  // the next roll closed. A failed ask fails the task at its next row or its commit; the
  // driver has already cancelled the epoch's job by then (the task is interrupted at once).
  private def handOverLoop(): Unit =
    try while (true) {
      val roll = lock.synchronized {
        var ready = false
        while (!ready) {
          if (ending || failure != null) return
          if (current.isEmpty) lock.wait()
          else {
            val due = RealTimeIdle.handOverDue(currentStarted, grace, nextDue, sourceIdle)
            val now = System.nanoTime()
            if (now >= due) ready = true
            else lock.wait(TimeUnit.NANOSECONDS.toMillis(due - now + 999999L))
          }
        }
        val heldNanos = System.nanoTime() - currentStarted
        held.add(heldNanos)
        if (sourceIdle && heldNanos < grace) idleHandOvers += 1
        handOver(last = false)
      }
      roll.foreach { r =>
        // Its rows' frames first: a tagged add whose rows the log lacks would make a
        // reader skip them (it takes the log's segment for the file).
        logged.foreach(_._1.syncThrough(r.toRow))
        val nextIn = asks.time(driver.askSync[Long](r))
        val ahead = TimeUnit.MILLISECONDS.toNanos(nextIn - lead)
        lock.synchronized { nextDue = System.nanoTime() + ahead }
      }
    } catch {
      case _: InterruptedException => ()  // the task aborted
      case e: Throwable => if (failure == null) failure = e
    }

  // The hand-over thread stops (after the ask it is in, if any, when not interrupted).
  private def endHandOvers(interrupt: Boolean): Unit = {
    lock.synchronized {
      ending = true
      lock.notifyAll()
    }
    if (interrupt) handOvers.interrupt()
    else handOvers.join(TimeUnit.MINUTES.toMillis(1))
  }

  // A roll: its own directory, its Parquet writer open.
  private def open(): Opened = opens.time {
    val n = rolls.getAndIncrement()
    val roll = new FileRolls.Roll(template, s"$staging/p$partitionId-e$epochId-a$attempt-n$n",
      partitionId, taskId * 100000L + n)
    try (roll, new StagedFileWrite.ShapedWriter(roll.writer, shape, sort, partitionId, failed))
    catch {
      case e: Throwable =>
        try roll.abort() catch { case _: Throwable => () }
        throw e
    }
  }

  private def openAhead(): Unit =
    try next = Some(opener.submit(new java.util.concurrent.Callable[Opened] {
      override def call(): Opened = open()
    }))
    catch { case _: RejectedExecutionException => next = None }

  // Under `lock`: the roll opened ahead (waiting for it if it is still opening), or one
  // opened here when none was asked for.
  private def takeNext(): Opened = {
    val taken = next
    next = None
    taken match {
      case Some(f) =>
        val started = System.nanoTime()
        val opened = try f.get() catch { case e: ExecutionException => throw e.getCause }
        rowWaits.add(System.nanoTime() - started)
        opened
      case None => open()
    }
  }

  private def discard(opened: Opened): Unit = {
    try opened._2.abort() catch { case _: Throwable => () }
    try opened._1.abort() catch { case _: Throwable => () }
  }

  // The roll opened ahead and not used (the task is ending): its directory deleted.
  private def dropNext(): Unit = {
    val left = lock.synchronized { val n = next; next = None; n }
    opener.shutdown()
    left.foreach { f =>
      try discard(f.get(1, TimeUnit.MINUTES)) catch { case _: Throwable => () }
    }
  }

  override def write(row: InternalRow): Unit = lock.synchronized {
    if (failure != null) throw failure
    seen += 1
    if (seen > skip) {
      val (_, writer, _) = current.getOrElse {
        val (roll, shaped) = takeNext()
        openAhead()
        val opened = (roll, shaped, seen - 1)
        current = Some(opened)
        currentStarted = System.nanoTime()
        lock.notifyAll()  // the hand-over thread: a roll with rows (once per roll)
        opened
      }
      writer.write(row)
      logged.foreach { case (log, shaped) => log.append(shaped(row), seen - 1) }
    }
  }

  // Under `lock`: the current roll's files committed into its directory; the caller hands
  // the message to the driver (outside the lock, so rows keep flowing into the next roll;
  // one thread at a time asks, so rolls reach the driver in order). A failure fails the
  // task (Spark replays the epoch).
  private def handOver(last: Boolean): Option[Roll] = current.map { case (roll, writer, from) =>
    current = None
    try finishes.time {
      roll.finish(writer.commit())
      writer.close()
    } catch {
      case e: Throwable =>
        try roll.abort() catch { case _: Throwable => () }
        throw e
    }
    Roll(epochId, partitionId, attempt, from, seen, roll.directory, last)
  }

  override def commit(): WriterCommitMessage = {
    RealTimeIdle.forget(attempt)
    endHandOvers(interrupt = false)
    dropNext()
    val (rest, rows) = lock.synchronized {
      if (failure != null) throw failure
      (handOver(last = true), seen)
    }
    // Every frame synced before the task commits: Spark starts the next epoch only after
    // this one's tasks committed, and readers move to the next epoch then.
    logged.foreach(_._1.close(sync = true))
    rest.foreach(r => asks.time(driver.askSync[Long](r)))
    Rows(partitionId, rows)
  }

  override def abort(): Unit = {
    RealTimeIdle.forget(attempt)
    endHandOvers(interrupt = true)
    dropNext()
    logged.foreach(_._1.close(sync = false))
    lock.synchronized {
      current.foreach { case (roll, writer, _) => discard((roll, writer)) }
      current = None
    }
  }

  override def close(): Unit = {
    RealTimeIdle.forget(attempt)
    endHandOvers(interrupt = true)
    opener.shutdownNow()
    logged.foreach(_._1.close(sync = false))  // closed already unless the task failed
    val early = lock.synchronized(idleHandOvers)
    logInfo(s"deltaflow real-time writer p$partitionId e$epochId a$attempt: ${rolls.get()} " +
      s"rolls ($early at the source's idle, before the grace); ${opens.summary}; " +
      s"${rowWaits.summary}; ${held.summary}; ${finishes.summary}; ${asks.summary}" +
      logged.map(l => s"; ${l._1.summary}").getOrElse(""))
  }
}
