package org.apache.spark.sql.deltaflow

import java.util.concurrent.{ConcurrentHashMap, ExecutionException, ExecutorService, Executors,
  Future, ThreadFactory}

import org.apache.hadoop.mapreduce.TaskAttemptContext

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.datasources.{OutputWriter, OutputWriterFactory}
import org.apache.spark.sql.types.StructType

/**
 * Closing a Parquet file on an object store is its upload: Parquet holds a row group in
 * memory until the file closes, and S3A sends what it has not sent yet then, so a task
 * that rolls to its next file (`maxRecordsPerFile`, or a new partition directory) would
 * wait for the store before encoding another row. Here a rolled file closes on a thread
 * of its own while the task writes the next one; each task has at most one close in
 * flight (a closing file still holds its last row group, so memory stays at two files'
 * buffers), the next close waits for it, and the task's commit or abort waits for the
 * last one (the commit raising its error, so the task fails and its files are deleted).
 *
 * Used only where tasks write final names on an object store ([[DirectWrite]]), where the
 * close is an upload and no write-stats tracker looks at a file at close; switched off by
 * `spark.deltaflow.write.backgroundClose=false`.
 */
object BackgroundCloses {
  val SwitchConf = "spark.deltaflow.write.backgroundClose"

  private val threads: ExecutorService = Executors.newCachedThreadPool(new ThreadFactory {
    override def newThread(r: Runnable): Thread = {
      val t = new Thread(r, "deltaflow-file-close")
      t.setDaemon(true)
      t
    }
  })
  // A task attempt's close in flight, by its id.
  private val inFlight = new ConcurrentHashMap[Long, Future[_]]()

  /** Is the switch on in `conf` (a session's, on the driver)? */
  def enabled(conf: org.apache.spark.sql.internal.SQLConf): Boolean =
    conf.getConfString(SwitchConf, "true").trim.toLowerCase != "false"

  /** Run `close` for the task attempt `key` in the background, after its previous close.
   *  When that one failed, `close` still runs (its file is the task's, so the abort finds
   *  it uploaded and deletes it, and no multipart upload is left open) and the earlier
   *  failure is raised here. */
  def submit(key: Long, close: () => Unit): Unit = {
    val earlier = try { await(key); None } catch { case e: Throwable => Some(e) }
    inFlight.put(key, threads.submit(new Runnable { override def run(): Unit = close() }))
    earlier.foreach(e => throw e)
  }

  /** Wait for `key`'s close in flight, if any; its failure is raised here. */
  def await(key: Long): Unit = Option(inFlight.remove(key)).foreach { f =>
    try f.get() catch { case e: ExecutionException => throw e.getCause }
  }

  /** [[await]], its failure ignored (an abort deletes the files anyway). */
  def awaitQuietly(key: Long): Unit =
    try await(key) catch { case _: Throwable => () }

  /** The current task attempt's id, where there is a task. */
  def currentKey: Option[Long] = Option(TaskContext.get()).map(_.taskAttemptId())

  /** A factory whose writers close in the background (outside a task: at once). */
  final class Factory(inner: OutputWriterFactory) extends OutputWriterFactory {
    override def getFileExtension(context: TaskAttemptContext): String =
      inner.getFileExtension(context)

    override def newInstance(path: String, dataSchema: StructType,
        context: TaskAttemptContext): OutputWriter = {
      val writer = inner.newInstance(path, dataSchema, context)
      Option(TaskContext.get()) match {
        case Some(task) =>
          // A task that ends without its commit or abort (killed) still waits for its
          // upload, so nothing is written after the task is gone. Once a task: its first
          // file finds nothing in flight; from its first close on, one always is.
          if (!inFlight.containsKey(task.taskAttemptId())) {
            task.addTaskCompletionListener[Unit](t => awaitQuietly(t.taskAttemptId()))
          }
          new Writer(writer, task.taskAttemptId())
        case None => writer
      }
    }
  }

  private final class Writer(inner: OutputWriter, key: Long) extends OutputWriter {
    override def write(row: InternalRow): Unit = inner.write(row)
    override def close(): Unit = submit(key, () => inner.close())
    override def path(): String = inner.path()
  }
}
