package org.apache.spark.sql.deltaflow

import java.util.UUID

import org.apache.hadoop.fs.Path
import org.apache.hadoop.mapreduce.Job
import org.apache.hadoop.mapreduce.lib.output.FileOutputFormat

import org.apache.spark.internal.io.FileCommitProtocol
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Ascending, Attribute, BindReferences, Expression, SortOrder, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, Project}
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.connector.write.{BatchWrite, DataWriter}
import org.apache.spark.sql.execution.{LocalTableScanExec, SortExec, UnsafeExternalRowSorter}
import org.apache.spark.sql.execution.datasources.{WriteJobDescription, WriteTaskResult}
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat
import org.apache.spark.sql.execution.datasources.v2.{FileBatchWrite, FileWriterFactory}
import org.apache.spark.sql.types.{StructField, StructType}
import org.apache.spark.util.SerializableConfiguration

/**
 * Spark's own Parquet file write for rows that arrive one at a time in a DSv2 streaming
 * write's tasks (Spark-internal APIs, hence this package): Spark's V2 `FileBatchWrite`
 * (Hadoop's commit protocol: only committed task attempts' files reach the directory;
 * Hive-style partition directories; `maxRecordsPerFile`), with the rows shaped first by
 * the Catalyst projections a DataFrame transformation compiles to ([[Shape]]) — the same
 * transformation a batch write applies to its DataFrame, so both write the same files.
 */
object StagedFileWrite {
  /**
   * What `transform` does to rows of `schema`, as projections to run one after the other
   * on each input row (bound to their input), and the columns they produce. The
   * transformation must be projections only (`select`, `withColumn`, ...).
   */
  final case class Shape(steps: Seq[Seq[Expression]], output: Seq[Attribute])

  def shape(session: SparkSession, schema: StructType, transform: DataFrame => DataFrame): Shape = {
    val classic = session.asInstanceOf[ClassicSession]
    // A leaf Spark cannot prove empty, so the optimizer keeps the projections above it.
    val leaf = classic.createDataFrame(classic.sparkContext.emptyRDD[Row], schema)
    val plan = transform(leaf).queryExecution.optimizedPlan
    def steps(p: LogicalPlan): List[Seq[Expression]] = p match {
      case Project(list, child) =>
        steps(child) :+ BindReferences.bindReferences[Expression](list, child.output)
      case l if l.children.isEmpty => Nil
      case other => throw new IllegalStateException(
        s"deltaflow: a write's row shaping compiled to ${other.nodeName}, not projections")
    }
    val chain = steps(plan)
    // Always at least one projection: the writer then always holds UnsafeRows.
    val all = if (chain.nonEmpty) chain
      else List(BindReferences.bindReferences[Expression](plan.output, plan.output))
    Shape(all, plan.output)
  }

  /** A local sort of shaped rows by `columns` (a partitioned write's rows grouped by
   *  partition, as Spark's file writers need them), made where the rows are. The scan
   *  is a placeholder child: three arguments, which every Spark 4.x takes (4.3 added a
   *  fourth, with a default). */
  def sorter(output: Seq[Attribute], columns: Seq[Attribute]): SortExec =
    SortExec(columns.map(c => SortOrder(c, Ascending)), global = false,
      LocalTableScanExec(output, Nil, None))

  /**
   * A Spark file write of rows of `output` into `directory` (created if missing):
   * Parquet, partitioned by `partitionColumns`, `codec` compression, at most
   * `maxRecordsPerFile` rows a file, timestamps as INT64 micros when `microTimestamps`
   * (Spark's default INT96 carries no footer statistics). The job is set up; the
   * caller commits or aborts it. With `directJobId`, `directory` is the table root and
   * the tasks write final names there ([[DirectWrite.Protocol]]); nothing is created first.
   */
  def batchWrite(
      session: SparkSession,
      directory: String,
      output: Seq[Attribute],
      partitionColumns: Seq[String],
      codec: String,
      maxRecordsPerFile: Long,
      microTimestamps: Boolean,
      directJobId: Option[String] = None): BatchWrite = {
    val classic = session.asInstanceOf[ClassicSession]
    val conf = classic.sessionState.conf
    val hadoopConf = classic.sessionState.newHadoopConf()
    val path = new Path(directory)
    if (directJobId.isEmpty) path.getFileSystem(hadoopConf).mkdirs(path)
    val job = Job.getInstance(hadoopConf)
    job.setOutputKeyClass(classOf[Void])
    job.setOutputValueClass(classOf[InternalRow])
    FileOutputFormat.setOutputPath(job, path)
    val lowered = partitionColumns.map(_.toLowerCase).toSet
    val partitions = output.filter(a => lowered.contains(a.name.toLowerCase))
    val data = output.filterNot(partitions.contains)
    // Final names on an object store: a rolled file's upload overlaps the next file.
    val format = new DirectWrite.TableParquetFormat(microTimestamps,
      directJobId.isDefined && BackgroundCloses.enabled(conf))
    val factory = format.prepareWrite(classic, job, Map("compression" -> codec),
      StructType(data.map(a => StructField(a.name, a.dataType, a.nullable, a.metadata))))
    val jobId = UUID.randomUUID().toString
    val description = new WriteJobDescription(
      jobId,
      new SerializableConfiguration(job.getConfiguration),
      factory,
      output,
      data,
      partitions,
      None,
      directory,
      Map.empty,
      maxRecordsPerFile,
      conf.sessionLocalTimeZone,
      Seq.empty)
    val committer = directJobId.map(new DirectWrite.Protocol(_, directory))
      .getOrElse(FileCommitProtocol.instantiate(conf.fileCommitProtocolClass, jobId,
        directory, false))
    committer.setupJob(job)
    new FileBatchWrite(job, description, committer)
  }

  /**
   * A task's writer: each input row through the [[Shape]]'s projections, then (when
   * `sort` is given) into a local sort that feeds `inner` at commit, else straight into
   * `inner`. `failed` turns a projection's failure into the error to raise (a row
   * check's typed error).
   */
  final class ShapedWriter(
      inner: DataWriter[InternalRow],
      shape: Shape,
      sort: Option[SortExec],
      partitionId: Int,
      failed: Throwable => Throwable) extends DataWriter[InternalRow] {
    private val projections = shape.steps.map { exprs =>
      val p = UnsafeProjection.create(exprs)
      p.initialize(partitionId)
      p
    }
    private val sorter: Option[UnsafeExternalRowSorter] = sort.map(_.createSorter())

    override def write(row: InternalRow): Unit = {
      val shaped = try projections.foldLeft(row)((r, p) => p(r)) catch {
        case e: Throwable if scala.util.control.NonFatal(e) => throw failed(e)
      }
      sorter match {
        case Some(s) => s.insertRow(shaped.asInstanceOf[UnsafeRow])
        case None => inner.write(shaped)
      }
    }

    override def commit(): org.apache.spark.sql.connector.write.WriterCommitMessage = {
      sorter.foreach { s =>
        val sorted = s.sort()
        while (sorted.hasNext) inner.write(sorted.next())
      }
      inner.commit()
    }

    override def abort(): Unit = {
      sorter.foreach(_.cleanupResources())
      inner.abort()
    }

    override def close(): Unit = inner.close()
  }
}

/**
 * Spark's Parquet file write in small pieces inside one long-running task (a real-time
 * mode epoch, [[RealTimeCommits]]): each [[Roll]] is a file write of its own, set up,
 * written and committed by the task itself into its own directory, with what a driver
 * prepared once per epoch ([[RollTemplate]]: the Hadoop job settings and Parquet writer
 * factory a batch write would use).
 */
object FileRolls {
  final case class RollTemplate(
      hadoopConf: SerializableConfiguration,
      factory: org.apache.spark.sql.execution.datasources.OutputWriterFactory,
      output: Seq[Attribute],
      data: Seq[Attribute],
      partitions: Seq[Attribute],
      maxRecordsPerFile: Long,
      timeZone: String)

  /** The epoch's template (on the driver): as [[StagedFileWrite.batchWrite]] sets a job up. */
  def template(
      session: SparkSession,
      output: Seq[Attribute],
      partitionColumns: Seq[String],
      codec: String,
      maxRecordsPerFile: Long,
      microTimestamps: Boolean): RollTemplate = {
    val classic = session.asInstanceOf[ClassicSession]
    val conf = classic.sessionState.conf
    val job = Job.getInstance(classic.sessionState.newHadoopConf())
    job.setOutputKeyClass(classOf[Void])
    job.setOutputValueClass(classOf[InternalRow])
    val lowered = partitionColumns.map(_.toLowerCase).toSet
    val partitions = output.filter(a => lowered.contains(a.name.toLowerCase))
    val data = output.filterNot(partitions.contains)
    val factory = new ParquetFileFormat().prepareWrite(classic, job,
      Map("compression" -> codec),
      StructType(data.map(a => StructField(a.name, a.dataType, a.nullable, a.metadata))))
    if (microTimestamps) job.getConfiguration.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    RollTemplate(new SerializableConfiguration(job.getConfiguration), factory, output, data,
      partitions, maxRecordsPerFile, conf.sessionLocalTimeZone)
  }

  /** One file write into `directory`, in a task: `writer` takes the rows; [[finish]]
   *  commits them there (Hadoop's commit protocol, task and job), [[abort]] drops them. */
  final class Roll(template: RollTemplate, val directory: String, partitionId: Int, taskId: Long) {
    private val path = new Path(directory)
    private val job = Job.getInstance(template.hadoopConf.value)
    // A roll on local disk: no forked chmod, no .crc (two forks per file otherwise).
    ForklessLocalFileSystem.use(job.getConfiguration, directory)
    FileOutputFormat.setOutputPath(job, path)
    private val jobId = UUID.randomUUID().toString
    private val committer = new DirectCommitter(jobId, directory)
    committer.setupJob(job)
    private val description = new WriteJobDescription(jobId,
      new SerializableConfiguration(job.getConfiguration), template.factory, template.output,
      template.data, template.partitions, None, directory, Map.empty,
      template.maxRecordsPerFile, template.timeZone, Seq.empty)
    val writer: DataWriter[InternalRow] =
      new FileWriterFactory(description, committer).createWriter(partitionId, taskId)

    /** Commit what `committed` (the writer's commit message) names into the directory. */
    def finish(committed: org.apache.spark.sql.connector.write.WriterCommitMessage): Unit = {
      val result = committed.asInstanceOf[WriteTaskResult]
      committer.commitJob(job, Seq(result.commitMsg))
    }

    def abort(): Unit = {
      try writer.abort() finally committer.abortJob(job)
    }
  }

  /**
   * A roll's files go straight to their names in the roll's own directory: nobody reads
   * it until the driver commits the roll, so Hadoop's task and job commits (and Spark's
   * commit coordinator, which allows one commit per task, not one per roll) have nothing
   * to protect. Aborting deletes the directory.
   */
  final class DirectCommitter(jobId: String, directory: String) extends FileCommitProtocol
    with Serializable {
    override def setupJob(job: org.apache.hadoop.mapreduce.JobContext): Unit = {
      val path = new Path(directory)
      path.getFileSystem(job.getConfiguration).mkdirs(path)
    }
    override def commitJob(job: org.apache.hadoop.mapreduce.JobContext,
        messages: Seq[FileCommitProtocol.TaskCommitMessage]): Unit = ()
    override def abortJob(job: org.apache.hadoop.mapreduce.JobContext): Unit = {
      val path = new Path(directory)
      path.getFileSystem(job.getConfiguration).delete(path, true)
    }
    override def setupTask(task: org.apache.hadoop.mapreduce.TaskAttemptContext): Unit = ()
    override def newTaskTempFile(task: org.apache.hadoop.mapreduce.TaskAttemptContext,
        dir: Option[String], ext: String): String =
      newTaskTempFile(task, dir, org.apache.spark.internal.io.FileNameSpec("", ext))
    override def newTaskTempFile(task: org.apache.hadoop.mapreduce.TaskAttemptContext,
        dir: Option[String], spec: org.apache.spark.internal.io.FileNameSpec): String = {
      // Spark's own names (part-<split>-<job>...): the brain reads the split from them.
      val split = task.getTaskAttemptID.getTaskID.getId
      val name = f"${spec.prefix}part-$split%05d-$jobId${spec.suffix}"
      dir.map(d => new Path(new Path(directory, d), name)).getOrElse(new Path(directory, name))
        .toString
    }
    override def newTaskTempFileAbsPath(task: org.apache.hadoop.mapreduce.TaskAttemptContext,
        absoluteDir: String, ext: String): String =
      throw new UnsupportedOperationException("deltaflow: a roll writes no absolute paths")
    override def commitTask(task: org.apache.hadoop.mapreduce.TaskAttemptContext)
        : FileCommitProtocol.TaskCommitMessage = new FileCommitProtocol.TaskCommitMessage(Nil)
    override def abortTask(task: org.apache.hadoop.mapreduce.TaskAttemptContext): Unit = ()
  }
}
