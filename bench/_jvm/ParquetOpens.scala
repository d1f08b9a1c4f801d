package deltaflow.bench

import scala.collection.mutable

import org.apache.hadoop.fs.Path
import org.apache.hadoop.mapreduce.{JobID, TaskAttemptID, TaskID, TaskType}
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl
import org.apache.parquet.HadoopReadOptions
import org.apache.parquet.hadoop.ParquetFileReader
import org.apache.parquet.hadoop.util.HadoopInputFile

import org.apache.spark.paths.SparkPath
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.codegen.GenerateUnsafeProjection
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.read.{InputPartition, PartitionReader, PartitionReaderFactory}
import org.apache.spark.sql.execution.datasources.{FileFormat, PartitionedFile}
import org.apache.spark.sql.execution.datasources.parquet.{ParquetFileFormat, ParquetOptions}
import org.apache.spark.sql.execution.datasources.v2.parquet.ParquetPartitionReaderFactory
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types.{DataType, StructType}
import org.apache.spark.util.SerializableConfiguration

import io.deltaflow.spark.{DeletedRowsReader, DeltaInputPartition, FileReads, ParquetConf, ReadLayout, ScanFile, TableInfo}

/**
 * Issue 28 (rtmopen): what opening one small Parquet file costs on the real-time source's
 * path, on a warm JVM, inside a Spark task (as the real-time reader runs).
 *
 * Each variant is a reader factory built the way the real-time source builds its own
 * (`FileReads.readerFactory(withDeletes = true, inRequiredOrder = true)`, one file read
 * whole: `FileReads.wholeFile`), under session settings given per variant; `v1` is Spark's
 * own batch path (`ParquetFileFormat.buildReaderWithPartitionValues`, batches returned).
 * The variants take turns file by file in one task, so they share the machine's load.
 * `open` = the reader created and its first row read (the real-time source's `open`
 * step); `rest` = the other rows and the close.
 */
object ParquetOpens {
  /** `variants`: name -> session settings (key=value, `;`-separated) while its factory is
   *  built. Returns one line per variant: open and rest p50 / p90 / p99 / mean in µs. */
  def run(spark: SparkSession, location: String, schemaJson: String, n: Int,
      variants: java.util.Map[String, String]): String = {
    val schema = DataType.fromJson(schemaJson).asInstanceOf[StructType]
    val info = TableInfo(new Path(location).getParent.toUri.toString, 0L, exists = true,
      timeTravel = false, schema, schema, Nil, deletionVectors = false, "jvm", "", Map.empty,
      None, Map.empty)
    val layout = ReadLayout(info, schema)
    val fs = new Path(location).getFileSystem(spark.sessionState.newHadoopConf())
    val status = fs.getFileStatus(new Path(location))
    val file = ScanFile(location, status.getLen, Map.empty, Array.empty, status.getModificationTime)
    val names = mutable.ArrayBuffer[String]()
    val readers = mutable.ArrayBuffer[Either[PartitionReaderFactory, PartitionedFile => Iterator[InternalRow]]]()
    import scala.jdk.CollectionConverters._
    for ((name, settings) <- variants.asScala.toSeq.sortBy(_._1)) {
      val pairs = settings.split(";").map(_.trim).filter(_.nonEmpty).map { kv =>
        val Array(k, v) = kv.split("=", 2); k.trim -> v.trim
      }
      val before = pairs.map { case (k, _) => k -> spark.conf.getOption(k) }
      pairs.foreach { case (k, v) => spark.conf.set(k, v) }
      try {
        names += name
        readers += (if (name.startsWith("v1")) Right(v1Reader(spark, schema))
          else if (name.startsWith("old")) Left(oldFactory(spark, layout))
          else Left(FileReads.readerFactory(spark, layout, withDeletes = true,
            Array.empty[Filter], inRequiredOrder = true)))
      } finally before.foreach {
        case (k, Some(v)) => spark.conf.set(k, v)
        case (k, None) => spark.conf.unset(k)
      }
    }
    val partition: InputPartition = FileReads.wholeFile(file, layout)
    val v1File = PartitionedFile(InternalRow.empty, SparkPath.fromPath(new Path(location)), 0L,
      status.getLen, Array.empty[String], status.getModificationTime, status.getLen, Map.empty)
    val all = names.toArray
    val built = readers.toArray
    val results = spark.sparkContext.parallelize(Seq(0), 1).mapPartitions { _ =>
      val opens = Array.fill(all.length)(new Array[Long](n))
      val rests = Array.fill(all.length)(new Array[Long](n))
      var i = 0
      while (i < n) {
        var v = 0
        while (v < all.length) {
          // The order turns each round, so no variant always follows the same one.
          val k = (v + i) % all.length
          val start = System.nanoTime()
          built(k) match {
            case Left(factory) =>
              val reader = factory.createReader(partition)
              reader.next()
              val opened = System.nanoTime()
              while (reader.next()) {}
              reader.close()
              opens(k)(i) = opened - start
              rests(k)(i) = System.nanoTime() - opened
            case Right(read) =>
              val rows = read(v1File)
              rows.hasNext
              val opened = System.nanoTime()
              while (rows.hasNext) rows.next()
              opens(k)(i) = opened - start
              rests(k)(i) = System.nanoTime() - opened
          }
          v += 1
        }
        i += 1
      }
      Iterator((opens, rests))
    }.collect().head
    all.indices.map { k =>
      s"${all(k)}: open ${summary(results._1(k))}; rest ${summary(results._2(k))}"
    }.mkString("\n")
  }

  /** Steps of one open, each timed alone `n` times in a task: the file system and status
   *  (`HadoopInputFile.fromPath`), opening its stream, reading the footer, and the task
   *  attempt context Spark makes per file (a copy of the Hadoop configuration), and the
   *  UnsafeRow projection Spark's `PartitionReaderWithPartitionValues` generates per file. */
  def steps(spark: SparkSession, location: String, schemaJson: String, n: Int): String = {
    val conf = new SerializableConfiguration(spark.sessionState.newHadoopConf())
    val out = spark.sparkContext.parallelize(Seq(0), 1).mapPartitions { _ =>
      val hadoop = conf.value
      val path = new Path(location)
      val attributes = DataTypeUtils.toAttributes(DataType.fromJson(schemaJson).asInstanceOf[StructType])
      val t = Array.fill(5)(new Array[Long](n))
      var i = 0
      while (i < n) {
        val a = System.nanoTime()
        val input = HadoopInputFile.fromPath(path, hadoop)
        val b = System.nanoTime()
        val stream = input.newStream()
        val c = System.nanoTime()
        val options = HadoopReadOptions.builder(hadoop, path).build()
        val reader = ParquetFileReader.open(input, options, stream)
        reader.getFooter
        reader.close()
        val d = System.nanoTime()
        new TaskAttemptContextImpl(hadoop, new TaskAttemptID(new TaskID(new JobID(), TaskType.MAP, 0), 0))
        val e = System.nanoTime()
        GenerateUnsafeProjection.generate(attributes, attributes)
        val f = System.nanoTime()
        t(0)(i) = b - a; t(1)(i) = c - b; t(2)(i) = d - c; t(3)(i) = e - d; t(4)(i) = f - e
        i += 1
      }
      Iterator(t)
    }.collect().head
    Seq("HadoopInputFile.fromPath", "newStream", "footer (open, read, parse, close)",
      "TaskAttemptContextImpl", "GenerateUnsafeProjection.generate").zip(out).map { case (name, xs) => s"$name: ${summary(xs)}" }
      .mkString("\n")
  }

  /** The real-time source's reader before rtmopen: Spark's row reader for each file, under a
   *  plain (copied per file) Hadoop configuration. */
  private def oldFactory(spark: SparkSession, layout: ReadLayout): PartitionReaderFactory = {
    val sqlConf = spark.sessionState.conf
    val hadoopConf = spark.sessionState.newHadoopConfWithOptions(Map.empty[String, String])
    ParquetConf.prepare(hadoopConf, sqlConf, layout.physicalData)
    val broadcast = spark.sparkContext.broadcast(new SerializableConfiguration(hadoopConf))
    val parquet = ParquetPartitionReaderFactory(sqlConf, broadcast, layout.physicalTable,
      layout.physicalData, layout.partitionSchema, Array.empty[Filter], None,
      new ParquetOptions(Map.empty[String, String], sqlConf))
    new PartitionReaderFactory {
      override def createReader(p: InputPartition): PartitionReader[InternalRow] =
        new DeletedRowsReader(p.asInstanceOf[DeltaInputPartition], parquet.buildReader)
    }
  }

  private def v1Reader(spark: SparkSession, schema: StructType): PartitionedFile => Iterator[InternalRow] =
    new ParquetFileFormat().buildReaderWithPartitionValues(spark, schema, new StructType(), schema,
      Nil, Map(FileFormat.OPTION_RETURNING_BATCH -> "true"), spark.sessionState.newHadoopConf())

  private def summary(nanos: Array[Long]): String = {
    val us = nanos.map(_ / 1000.0).sorted
    def q(p: Double) = us(math.min(us.length - 1, math.round(p * (us.length - 1)).toInt))
    f"p50 ${q(0.5)}%.0f p90 ${q(0.9)}%.0f p99 ${q(0.99)}%.0f mean ${us.sum / us.length}%.0f µs"
  }
}
