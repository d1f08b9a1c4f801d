package org.apache.spark.sql.deltaflow

import java.util.UUID

import scala.collection.mutable.ArrayBuffer
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.hadoop.mapreduce.{Job, JobContext, TaskAttemptContext}

import org.apache.spark.internal.Logging
import org.apache.spark.internal.io.{FileCommitProtocol, FileNameSpec}
import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.connector.write.WriterCommitMessage
import org.apache.spark.sql.execution.SQLExecution
import org.apache.spark.sql.execution.datasources.{FileFormatWriter, OutputWriterFactory, WriteTaskResult}
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat
import org.apache.spark.sql.types.StructType

/**
 * Writes whose tasks put each Parquet file at its final name under the table root (object
 * stores: no `_delta_staging`, no Hadoop task/job commit renames, no brain-side moves —
 * each of which is a COPY + DELETE per file on S3A).
 *
 * Nothing is visible to a Delta reader until the brain commits the files the tasks
 * reported (`write.commit` with `files`): a file no commit names is an orphan that VACUUM
 * removes, as in delta-spark's `DelayedCommitProtocol`. Every name carries a fresh UUID, so
 * retried and speculative attempts never collide, and Spark keeps one successful result
 * per partition, so the driver sees one file list per partition: no commit coordinator is
 * needed (nothing is moved into a shared place at task commit).
 */
object DirectWrite extends Logging {
  private val TimestampConf = "spark.sql.parquet.outputTimestampType"

  /** A written file: its path relative to the table root (Spark's partition directories
   *  and the file name, as written) and its size in bytes. */
  final case class Written(relative: String, size: Long)

  /**
   * Write `data` (shaped as the table's columns) as Parquet under `root`, partitioned by
   * `partitionColumns`, with Spark's file writer and [[Protocol]]; the files written. On
   * failure, every file a task reported is deleted before the error propagates.
   */
  def write(
      data: DataFrame,
      root: String,
      jobId: String,
      partitionColumns: Seq[String],
      codec: String,
      maxRecordsPerFile: Long,
      microTimestamps: Boolean): Seq[Written] = {
    val qe = data.queryExecution
    val session = data.sparkSession.asInstanceOf[ClassicSession]
    val output = qe.analyzed.output
    val lowered = partitionColumns.map(_.toLowerCase).toSet
    val partitions = output.filter(a => lowered.contains(a.name.toLowerCase))
    val protocol = new Protocol(jobId, root)
    val options = Map("compression" -> codec, "maxRecordsPerFile" -> maxRecordsPerFile.toString)
    val format = new TableParquetFormat(microTimestamps,
      BackgroundCloses.enabled(session.sessionState.conf))
    SQLExecution.withNewExecutionId(qe, Some(s"deltaflow direct write to $root")) {
      FileFormatWriter.write(session, qe.executedPlan, format, protocol,
        FileFormatWriter.OutputSpec(root, Map.empty, output),
        session.sessionState.newHadoopConfWithOptions(options), partitions, None, Nil,
        options, 0, () => ())
    }
    protocol.reported
  }

  /** [[write]] for the brain's Python (DML rewrites, through py4j): the partition columns
   *  as a JSON array, the files as a JSON array of `{"path", "size"}`. */
  def writeForPython(data: DataFrame, root: String, jobId: String, partitionColumns: String,
      codec: String, maxRecordsPerFile: String, microTimestamps: Boolean): String = {
    val json = new com.fasterxml.jackson.databind.ObjectMapper()
    val columns = Seq.newBuilder[String]
    json.readTree(partitionColumns).elements().forEachRemaining(c => columns += c.asText())
    val files = write(data, root, jobId, columns.result(), codec, maxRecordsPerFile.toLong,
      microTimestamps)
    val list = json.createArrayNode()
    files.foreach { f =>
      val o = list.addObject()
      o.put("path", f.relative)
      o.put("size", f.size)
    }
    json.writeValueAsString(list)
  }

  /** The files the tasks of a DSv2 write (a stream's micro-batch) reported. */
  def files(messages: Array[WriterCommitMessage]): Seq[Written] =
    messages.toSeq.flatMap {
      case r: WriteTaskResult => written(r.commitMsg)
      case _ => Nil
    }

  /** Delete `files` under `root` (an aborted write's reported files), best effort. */
  def delete(root: String, files: Seq[Written], conf: Configuration): Unit = files.foreach { f =>
    val path = new Path(root.stripSuffix("/") + "/" + f.relative)
    try path.getFileSystem(conf).delete(path, false)
    catch { case NonFatal(e) => logWarning(s"deltaflow could not delete $path: $e") }
  }

  private def written(message: FileCommitProtocol.TaskCommitMessage): Seq[Written] =
    Option(message).map(_.obj).collect { case s: Seq[_] => s.collect { case w: Written => w } }
      .getOrElse(Nil)

  /** Spark's Parquet format for a table's data files (direct and staged writes), with
   *  timestamps as INT64 micros when `micros` (without touching the session: Spark's
   *  default INT96 carries no footer statistics), and rolled files closed in the
   *  background when `background` ([[BackgroundCloses]]). */
  final class TableParquetFormat(micros: Boolean, background: Boolean)
      extends ParquetFileFormat {
    override def prepareWrite(session: org.apache.spark.sql.SparkSession, job: Job,
        options: Map[String, String], dataSchema: StructType): OutputWriterFactory = {
      val factory = super.prepareWrite(session, job, options, dataSchema)
      if (micros) job.getConfiguration.set(TimestampConf, "TIMESTAMP_MICROS")
      if (background) new BackgroundCloses.Factory(factory) else factory
    }
  }

  /**
   * The commit protocol: `newTaskTempFile` answers the final name,
   * `<root>/<partition dirs>/part-<split>-<jobId>-s<split>-<uuid>-c<n>.<codec>.parquet`
   * (the brain's naming: the job id marks every file of the job). Setup touches no storage;
   * a task's commit reports its files with their sizes; a task's abort deletes its own
   * files; the driver collects what committed tasks reported and, on a job abort, deletes
   * exactly those.
   */
  final class Protocol(jobId: String, root: String) extends FileCommitProtocol with Serializable {
    // The task attempt's files (in the task's deserialized copy).
    @transient private var attempt: ArrayBuffer[Path] = _
    @transient private var relatives: ArrayBuffer[String] = _
    // What committed tasks reported (on the driver).
    private val committed = ArrayBuffer[Written]()

    def reported: Seq[Written] = committed.synchronized(committed.toList)

    override def setupJob(job: JobContext): Unit = ()
    override def setupTask(task: TaskAttemptContext): Unit = {
      attempt = ArrayBuffer()
      relatives = ArrayBuffer()
    }

    override def newTaskTempFile(task: TaskAttemptContext, dir: Option[String],
        ext: String): String = newTaskTempFile(task, dir, FileNameSpec("", ext))

    override def newTaskTempFile(task: TaskAttemptContext, dir: Option[String],
        spec: FileNameSpec): String = {
      if (attempt == null) setupTask(task)
      val split = task.getTaskAttemptID.getTaskID.getId
      // Spark's suffix is `-c<n><ext>` for one directory, `.c<n><ext>` for partitions.
      val suffix = if (spec.suffix.startsWith(".c")) "-" + spec.suffix.drop(1) else spec.suffix
      val name = f"${spec.prefix}part-$split%05d-$jobId-s$split%05d-${UUID.randomUUID()}$suffix"
      val relative = dir.filter(_.nonEmpty).map(_ + "/" + name).getOrElse(name)
      val path = new Path(root.stripSuffix("/") + "/" + relative)
      attempt += path
      relatives += relative
      path.toString
    }

    override def newTaskTempFileAbsPath(task: TaskAttemptContext, absoluteDir: String,
        ext: String): String =
      throw new UnsupportedOperationException("deltaflow: a direct write has no absolute paths")

    override def commitTask(task: TaskAttemptContext): FileCommitProtocol.TaskCommitMessage = {
      BackgroundCloses.currentKey.foreach(BackgroundCloses.await)  // its last upload
      val files = if (attempt == null) Nil else attempt.zip(relatives).map { case (p, r) =>
        Written(r, p.getFileSystem(task.getConfiguration).getFileStatus(p).getLen)
      }.toList
      new FileCommitProtocol.TaskCommitMessage(files)
    }

    override def abortTask(task: TaskAttemptContext): Unit = if (attempt != null) {
      BackgroundCloses.currentKey.foreach(BackgroundCloses.awaitQuietly)
      attempt.foreach { p =>
        try p.getFileSystem(task.getConfiguration).delete(p, false)
        catch { case NonFatal(e) => logWarning(s"deltaflow could not delete $p: $e") }
      }
    }

    override def onTaskCommit(message: FileCommitProtocol.TaskCommitMessage): Unit =
      committed.synchronized(committed ++= written(message))

    override def commitJob(job: JobContext,
        messages: Seq[FileCommitProtocol.TaskCommitMessage]): Unit = ()

    override def abortJob(job: JobContext): Unit =
      delete(root, reported, job.getConfiguration)
  }
}
