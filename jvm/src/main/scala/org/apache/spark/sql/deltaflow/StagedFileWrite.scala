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
import org.apache.spark.sql.execution.datasources.WriteJobDescription
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat
import org.apache.spark.sql.execution.datasources.v2.FileBatchWrite
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
  private val TimestampConf = "spark.sql.parquet.outputTimestampType"

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
   * caller commits or aborts it.
   */
  def batchWrite(
      session: SparkSession,
      directory: String,
      output: Seq[Attribute],
      partitionColumns: Seq[String],
      codec: String,
      maxRecordsPerFile: Long,
      microTimestamps: Boolean): BatchWrite = {
    val classic = session.asInstanceOf[ClassicSession]
    val conf = classic.sessionState.conf
    val hadoopConf = classic.sessionState.newHadoopConf()
    val path = new Path(directory)
    val fs = path.getFileSystem(hadoopConf)
    fs.mkdirs(path)
    val job = Job.getInstance(hadoopConf)
    job.setOutputKeyClass(classOf[Void])
    job.setOutputValueClass(classOf[InternalRow])
    FileOutputFormat.setOutputPath(job, path)
    val lowered = partitionColumns.map(_.toLowerCase).toSet
    val partitions = output.filter(a => lowered.contains(a.name.toLowerCase))
    val data = output.filterNot(partitions.contains)
    val factory = new ParquetFileFormat().prepareWrite(classic, job,
      Map("compression" -> codec), StructType(data.map(a => StructField(a.name, a.dataType, a.nullable, a.metadata))))
    if (microTimestamps) job.getConfiguration.set(TimestampConf, "TIMESTAMP_MICROS")
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
    val committer = FileCommitProtocol.instantiate(conf.fileCommitProtocolClass, jobId,
      directory, false)
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
