package io.deltaflow.spark

import java.util

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode

import org.apache.spark.sql.connector.catalog.{SupportsRead, Table, TableCapability}
import org.apache.spark.sql.connector.read.{Scan, ScanBuilder}
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream
import org.apache.spark.sql.types._
import org.apache.spark.sql.util.CaseInsensitiveStringMap
import org.apache.spark.unsafe.types.UTF8String

/**
 * The change data feed (`readChangeFeed`) read on the JVM: today only by the real-time
 * source (Spark's real-time mode takes JVM sources only; batch and micro-batch feeds are
 * the Python data source's).
 *
 * The brain plans the change files of each commit (`table/_cdf.py`: a commit's cdc files,
 * or its data-changing adds as `insert` and removes as `delete`, a deletion vector pair as
 * the rows its two vectors differ in) and sends each with its [[ChangeInfo]]. The three
 * columns delta-spark adds — `_change_type`, `_commit_version`, `_commit_timestamp` — are
 * constant per file (a cdc file holds its own `_change_type`), so they ride in Spark's
 * partition row, as delta-spark's change file indexes pass them: two [[ReadLayout]]s, one
 * per kind of file, both emitting the feed's one output order.
 */
object ChangeFeed {
  val ChangeType = "_change_type"
  val CommitVersion = "_commit_version"
  val CommitTimestamp = "_commit_timestamp"
  private val Names = Set(ChangeType, CommitVersion, CommitTimestamp)

  /** What a feed read outputs: the table's columns (less any of the three names), then
   *  the three columns; as the Python data source's (`read/_cdf.py::with_cdf_columns`). */
  def schema(table: StructType): StructType = StructType(
    table.fields.filterNot(f => Names.contains(f.name)) ++ Seq(
      StructField(ChangeType, StringType), StructField(CommitVersion, LongType),
      StructField(CommitTimestamp, TimestampType)))

  /** Whether the options ask for the change feed. */
  def requested(options: util.Map[String, String]): Boolean =
    Seq("readChangeFeed", "readChangeData").exists(key =>
      options.asScala.exists { case (k, v) => k.equalsIgnoreCase(key) && v.trim.equalsIgnoreCase("true") })

  /** The values of `constants` (some of the three columns) for the rows of `file`. */
  def values(constants: Seq[StructField], file: ScanFile): Seq[Any] = {
    if (constants.isEmpty) return Nil
    val change = file.change.getOrElse(throw new IllegalStateException(
      s"deltaflow: ${file.location} was planned without its change"))
    constants.map(_.name match {
      case ChangeType => UTF8String.fromString(change.changeType)
      case CommitVersion => change.version
      case CommitTimestamp => change.timestampMs * 1000L
      case other => throw new IllegalArgumentException(s"no change feed column $other")
    })
  }
}

/** What one change file holds: `kind` (`cdc`, `add`: inserted rows, `remove`: deleted
 *  rows), the commit's version and timestamp (ms). */
case class ChangeInfo(kind: String, version: Long, timestampMs: Long) {
  def isCdc: Boolean = kind == "cdc"
  def changeType: String = kind match {
    case "add" => "insert"
    case "remove" => "delete"
    case other => throw new IllegalStateException(s"a $other file has no constant change type")
  }
}

object ChangeInfo {
  def fromJson(node: JsonNode): Option[ChangeInfo] = Option(node).filterNot(_.isNull).map(n =>
    ChangeInfo(n.get("kind").asText(), n.get("version").asLong(), n.get("timestamp").asLong()))
}

/** The two ways a feed's files are read into [[ChangeFeed.schema]]: cdc files with
 *  `_change_type` from the data, the others (adds, removes, the initial snapshot) with it
 *  constant. */
case class ChangeLayouts(info: TableInfo) {
  val output: StructType = ChangeFeed.schema(info.schema)
  private def field(name: String) = output.fields.find(_.name == name).get
  val cdc: ReadLayout = ReadLayout(info, output,
    Seq(field(ChangeFeed.CommitVersion), field(ChangeFeed.CommitTimestamp)))
  val data: ReadLayout = ReadLayout(info, output,
    Seq(field(ChangeFeed.ChangeType), field(ChangeFeed.CommitVersion),
      field(ChangeFeed.CommitTimestamp)))
  /** Where `_change_type` is in the output (a cdc file's must not be null). */
  val changeTypeAt: Int = output.fieldIndex(ChangeFeed.ChangeType)

  def of(file: ScanFile): ReadLayout = if (file.change.exists(_.isCdc)) cdc else data
}

/**
 * A Delta table's change feed as a stream source on the JVM, which [[StreamTriggerCheck]]
 * puts in place of the Python data source's table for a real-time query
 * (`readChangeFeed` + `trigger(realTime=...)`). Its stream is a [[DeltaMicroBatchStream]]
 * in change-feed mode: offsets, `startingVersion` / `startingTimestamp` and admission
 * (a commit's changes whole) are the brain's, as for the Python source.
 */
class ChangeFeedTable(val info: TableInfo) extends Table with SupportsRead {
  override def name(): String = s"delta.`${info.uri}`"
  override def schema(): StructType = ChangeFeed.schema(info.schema)
  override def capabilities(): util.Set[TableCapability] =
    Set(TableCapability.MICRO_BATCH_READ).asJava
  override def toString: String = s"DeltaChangeFeed[${info.uri}]"

  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder = () => new Scan {
    override def readSchema(): StructType = ChangeFeedTable.this.schema()
    override def description(): String = s"DeltaChangeFeed delta.`${info.uri}`"
    override def toMicroBatchStream(checkpointLocation: String): MicroBatchStream =
      new DeltaMicroBatchStream(info, options, changeFeed = true,
        metadataPath = Some(checkpointLocation))
  }
}
