package org.apache.spark.sql.deltaflow

import java.io.FileNotFoundException
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import org.apache.spark.SparkContext
import org.apache.spark.sql.connector.metric.CustomTaskMetric
import org.apache.spark.sql.connector.read.PartitionReader
import org.apache.spark.util.AccumulatorV2

/**
 * Tables whose batch scan found a planned data file missing. The brain's cached snapshot of
 * such a table may be of a table since dropped and made again at its path, which on an object
 * store its revalidation by name cannot tell for up to its TTL (docs/architecture.md, "The
 * brain's snapshot cache"). Every brain request then carries the tables marked since the
 * last one ([[drain]], `Brain.call`), and the brain drops their entries before it answers
 * anything read after it: the retry of a failed read plans a fresh snapshot.
 *
 * The mark is made before the user's action returns, not by a listener: a task that fails
 * on a missing file adds to its scan's [[MissingFileSignal]], an accumulator registered to
 * carry failed tasks' values (private to Spark, hence this package), and the driver's
 * DAGScheduler merges a failed task's accumulator updates on its event loop (the task's
 * `CompletionEvent`) before the stage abort the same failure posts after it, which is what
 * fails the job.
 */
object MissingFiles {
  private val marked = ConcurrentHashMap.newKeySet[String]()

  def mark(tableUri: String): Unit = marked.add(tableUri)

  /** The tables marked since the last call, unmarked. */
  def drain(): Seq[String] =
    if (marked.isEmpty) Nil
    else marked.asScala.toList.filter(marked.remove)

  /** A signal for one scan of `tableUri`, registered with `sc` to count failed tasks. */
  def signal(sc: SparkContext, tableUri: String): MissingFileSignal = {
    val signal = new MissingFileSignal(tableUri)
    signal.register(sc, None, countFailedValues = true)
    signal
  }

  def isMissingFile(error: Throwable): Boolean =
    Iterator.iterate(error)(_.getCause).takeWhile(_ != null).take(32)
      .exists(_.isInstanceOf[FileNotFoundException])
}

/** Whether a task of one scan of `tableUri` found a planned file missing; merged into the
 *  driver's copy, it marks the table ([[MissingFiles]]). */
class MissingFileSignal(val tableUri: String)
  extends AccumulatorV2[java.lang.Boolean, java.lang.Boolean] {
  @volatile private var seen = false

  override def isZero: Boolean = !seen
  override def copy(): MissingFileSignal = {
    val copied = new MissingFileSignal(tableUri)
    copied.seen = seen
    copied
  }
  override def reset(): Unit = seen = false
  override def add(v: java.lang.Boolean): Unit = if (v) seen = true
  // Only the driver merges (DAGScheduler.updateAccumulators).
  override def merge(other: AccumulatorV2[java.lang.Boolean, java.lang.Boolean]): Unit =
    if (other.value) {
      seen = true
      MissingFiles.mark(tableUri)
    }
  override def value: java.lang.Boolean = seen
}

/** `reader`, raising `signal` when it fails on a missing file (then rethrowing). */
class MissingFileWatch[T](reader: PartitionReader[T], signal: MissingFileSignal)
  extends PartitionReader[T] {
  override def next(): Boolean =
    try reader.next()
    catch {
      case e: Throwable if MissingFiles.isMissingFile(e) =>
        signal.add(true)
        throw e
    }
  override def get(): T = reader.get()
  override def close(): Unit = reader.close()
  override def currentMetricsValues(): Array[CustomTaskMetric] = reader.currentMetricsValues()
}
