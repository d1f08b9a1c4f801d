package io.deltaflow.spark

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode

import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.read._
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream
import org.apache.spark.sql.deltaflow.MissingFiles
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types._
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/** Column pruning and filter pushdown for one scan of a [[DeltaTable]]; `options` are the
 *  scan's own (the brain checks them). */
class DeltaScanBuilder(info: TableInfo, options: CaseInsensitiveStringMap)
  extends ScanBuilder with SupportsPushDownFilters with SupportsPushDownRequiredColumns {

  private var pushed: Array[Filter] = Array.empty
  private var required: StructType = info.schema

  // Skipping is per file: Spark still evaluates every filter on the rows read.
  override def pushFilters(filters: Array[Filter]): Array[Filter] = {
    pushed = filters.filter(FilterJson.convertible)
    filters
  }

  override def pushedFilters(): Array[Filter] = pushed

  override def pruneColumns(requiredSchema: StructType): Unit = required = requiredSchema

  override def build(): Scan = new DeltaScan(info, required, pushed, options)
}

/**
 * A batch scan of one snapshot: the brain lists the files left after partition pruning
 * and min/max skipping (with each file's deleted rows), and Spark's own Parquet reader
 * reads them, vectorized. Column-mapped tables are read by physical names; the output
 * is positional, so the logical names of [[readSchema]] apply.
 */
class DeltaScan(
    info: TableInfo,
    required: StructType,
    pushed: Array[Filter],
    options: CaseInsensitiveStringMap) extends Scan with Batch {

  private val layout = ReadLayout(info, required)

  override def readSchema(): StructType = layout.readSchema

  override def description(): String = {
    val filters = if (pushed.isEmpty) "" else pushed.mkString(", skipping by [", ", ", "]")
    s"DeltaScan delta.`${info.uri}` v${info.version}$filters"
  }

  override def toBatch: Batch = this

  override def toMicroBatchStream(checkpointLocation: String): MicroBatchStream =
    new DeltaMicroBatchStream(info, options, metadataPath = Some(checkpointLocation))

  private lazy val plan: ScanPlan = ScanPlan.request(info, pushed, options)

  override def planInputPartitions(): Array[InputPartition] =
    FileReads.partitions(SparkSession.active, plan.files, layout)

  // A planned file missing at read time may mean the brain's cached snapshot is of a table
  // since made again at this path: the signal has the brain drop it before the next read.
  override def createReaderFactory(): PartitionReaderFactory = {
    val spark = SparkSession.active
    FileReads.readerFactory(spark, layout, withDeletes = plan.files.exists(_.deleted.nonEmpty),
      pushed, missing = Some(MissingFiles.signal(spark.sparkContext, info.uri)))
  }
}

case class ScanPlan(version: Long, files: Seq[ScanFile])

object ScanPlan {
  def request(info: TableInfo, pushed: Array[Filter],
      options: CaseInsensitiveStringMap): ScanPlan = {
    val args = Brain.newArgs()
    args.put("uri", info.uri)
    // A read without time travel sees the table as it is when each query runs, as
    // delta-spark's does; the schema stays the one the DataFrame was made with.
    if (info.timeTravel) args.put("version", info.version)
    val expected = args.putArray("columns")
    info.schema.fieldNames.foreach(expected.add)
    val filters = args.putArray("filters")
    pushed.flatMap(FilterJson.toJson).foreach(filters.add)
    val opts = args.putObject("options")
    options.asCaseSensitiveMap().asScala.foreach { case (k, v) => opts.put(k, v) }
    val result = Brain.call("scan.plan", args)
    result.get("report") match {
      case report: com.fasterxml.jackson.databind.node.ObjectNode =>
        report.put("ts", System.currentTimeMillis())
        ScanReports.add(report)
      case _ =>
    }
    ScanPlan(result.get("version").asLong(),
      result.get("files").elements().asScala.map(ScanFile.fromJson).toSeq)
  }
}

/**
 * The last reports of one kind (newest last, at most `keep`), for the Python side:
 * `deltaflow.scan_reports(spark)` and the tests read them through py4j.
 */
class ReportLog(keep: Int) {
  private val reports = new java.util.concurrent.ConcurrentLinkedDeque[String]()

  def add(report: JsonNode): Unit = if (report != null) {
    reports.addLast(report.toString)
    while (reports.size() > keep) reports.pollFirst()
  }

  /** Every kept report, oldest first, as one JSON array. */
  def json(): String = reports.asScala.mkString("[", ",", "]")

  def clear(): Unit = reports.clear()
}

/** Per scan: files in the snapshot, scanned, skipped by partition and by stats. */
object ScanReports extends ReportLog(1000)

/** Per batch write: table, route (`jvm`, `python`, `skip`), version and files committed. */
object WriteReports extends ReportLog(1000)
