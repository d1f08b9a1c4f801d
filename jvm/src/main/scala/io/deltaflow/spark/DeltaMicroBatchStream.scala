package io.deltaflow.spark

import java.util

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.internal.Logging
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.read.{InputPartition, PartitionReaderFactory}
import org.apache.spark.sql.connector.read.streaming.{MicroBatchStream, Offset, ReadAllAvailable, ReadLimit, ReadMaxFiles, ReportsSourceMetrics, SupportsAdmissionControl, SupportsTriggerAvailableNow}
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/**
 * A Delta table as a micro-batch stream source, on the JVM.
 *
 * The offsets and what each batch reads are the brain's (`stream.*` bridge operations,
 * the same `DeltaStreamReader` the Python source uses: delta-spark's offsets
 * `{reservoirId, reservoirVersion, index, isStartingVersion}`, the initial snapshot then
 * each commit's data-changing adds, `maxFilesPerTrigger` / `maxBytesPerTrigger`,
 * `startingVersion` / `startingTimestamp`, `skipChangeCommits`, `ignoreDeletes`). The
 * files are read here, by Spark's vectorized Parquet reader, as a batch scan reads them.
 *
 * Delivery: Spark writes the end offset of a batch to the checkpoint before running it
 * and replays the same range after a crash; the brain's plan for a range is a pure
 * function of the two offsets and the immutable log, so a replay reads the same files.
 */
class DeltaMicroBatchStream(
    private[spark] val info: TableInfo,
    private[spark] val options: CaseInsensitiveStringMap,
    // The change feed ([[ChangeFeedTable]]): read by the real-time reader only.
    private[spark] val changeFeed: Boolean = false,
    // The source's directory in the query's checkpoint (`<checkpoint>/sources/<n>`), where
    // real-time mode keeps its first epoch's resolved start.
    private[spark] val metadataPath: Option[String] = None)
  extends MicroBatchStream with SupportsAdmissionControl with SupportsTriggerAvailableNow
  with ReportsSourceMetrics with RealTimeSupport with Logging {

  private[spark] val layout = ReadLayout(info, info.schema)
  private[spark] lazy val changeLayouts = ChangeLayouts(info)
  // Uniform per stream (Spark wants every task of a scan columnar, or none): a table
  // that may have deletion vectors is read in row mode.
  private val withDeletes = info.deletionVectors
  @volatile private var handle: String = _
  // The brain's parsed maxFilesPerTrigger (its default applied): Spark hands it back to
  // latestOffset, which asks the brain anyway; only "everything" (availableNow) matters.
  @volatile private var maxFiles: Int = _
  handle = open()

  private def open(): String = {
    val args = Brain.newArgs()
    args.put("uri", info.uri)
    args.put("schema", info.schema.json)
    val opts = args.putObject("options")
    options.asCaseSensitiveMap().asScala.foreach { case (k, v) => opts.put(k, v) }
    val opened = Brain.call("stream.open", args)
    maxFiles = opened.get("maxFilesPerTrigger").asInt()
    opened.get("handle").asText()
  }

  /** Call a stream operation; a brain that restarted since gets the stream opened again. */
  private[spark] def call(op: String, fill: ObjectNode => Unit): JsonNode = {
    def attempt(): JsonNode = {
      val args = Brain.newArgs()
      args.put("handle", handle)
      fill(args)
      Brain.call(op, args)
    }
    try attempt()
    catch {
      case e: DeltaflowException if e.fields.get("operation").contains("stream.handle") =>
        handle = open()
        attempt()
    }
  }

  private def offsetArg(args: ObjectNode, key: String, offset: Offset): Unit =
    args.set[JsonNode](key, Brain.json.readTree(offset.json()))

  override def initialOffset(): Offset =
    DeltaSourceOffset.of(call("stream.initialOffset", _ => ()))

  override def getDefaultReadLimit: ReadLimit = ReadLimit.maxFiles(maxFiles)

  override def latestOffset(): Offset = throw new UnsupportedOperationException(
    "deltaflow's stream source takes a read limit: latestOffset(start, limit)")

  override def latestOffset(start: Offset, limit: ReadLimit): Offset = {
    val result = call("stream.latestOffset", { args =>
      offsetArg(args, "start", start)
      args.put("all", limit.isInstanceOf[ReadAllAvailable])
    })
    DeltaSourceOffset.of(result)
  }

  override def prepareForTriggerAvailableNow(): Unit = call("stream.availableNow", _ => ())

  override def planInputPartitions(start: Offset, end: Offset): Array[InputPartition] = {
    // Real-time mode replays an epoch its offset log recorded through this call too.
    if (realTimeMode) return realTimeReplay(start, end)
    if (changeFeed) throw new IllegalStateException(
      "deltaflow: the JVM's change feed source runs in real-time mode only")
    val result = call("stream.files", { args =>
      offsetArg(args, "start", start)
      offsetArg(args, "end", end)
    })
    val files = result.get("files").elements().asScala.map(ScanFile.fromJson).toSeq
    if (files.exists(_.deleted.nonEmpty) && !withDeletes) {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"Table ${info.uri} gained deletion vectors after this stream started; restart the " +
          "query to read them.", Map("table_uri" -> info.uri, "feature" -> "deletionVectors"))
    }
    FileReads.partitions(SparkSession.active, files, layout)
  }

  override def createReaderFactory(): PartitionReaderFactory =
    if (realTimeMode) realTimeReaderFactory()
    else FileReads.readerFactory(SparkSession.active, layout, withDeletes, Array.empty[Filter],
      inRequiredOrder = true)

  override def deserializeOffset(json: String): Offset =
    DeltaSourceOffset.of(Brain.json.readTree(json))

  override def commit(end: Offset): Unit = call("stream.commit", offsetArg(_, "end", end))

  override def stop(): Unit =
    try { stopRealTime(); call("stream.close", _ => ()) }
    catch { case e: Exception => logWarning(s"deltaflow stream over ${info.uri}: close: $e") }

  /** delta-spark's backlog metrics: files and bytes committed but not read yet. */
  override def metrics(latest: java.util.Optional[Offset]): util.Map[String, String] = {
    if (!latest.isPresent) return util.Collections.emptyMap()
    val result = call("stream.backlog", offsetArg(_, "offset", latest.get()))
    Map(
      "numFilesOutstanding" -> result.get("files").asText(),
      "numBytesOutstanding" -> result.get("bytes").asText()).asJava
  }

  override def toString: String = s"DeltaSource[${info.uri}]"
}

/** delta-spark's source offset, as the brain made it (its key order is stable), in
 *  compact JSON whatever wrote it, so that equal offsets compare equal. */
case class DeltaSourceOffset(override val json: String) extends Offset

object DeltaSourceOffset {
  /** Real-time mode's one addition to delta-spark's offset: how many rows of the file
   *  after the position a real-time epoch that ended inside that file already emitted.
   *  Absent (0) whenever an epoch ended between files. */
  val RowsOfNextFile = "rowsOfNextFile"

  /** And where a real-time reader is in each `<writer>/p<n>` of the table's row log
   *  (`docs/notes/rowlog.md`): `{"<writer>/p<n>": [epoch, row]}`, the next row to emit.
   *  Absent: no row log read (an older checkpoint, micro-batch, another store). The brain
   *  never sees either key; micro-batch ignores them. */
  val RowLog = "rowLog"

  def of(node: JsonNode): DeltaSourceOffset = DeltaSourceOffset(node.toString)

  /** `position` (the brain's offset JSON) with `rows` of the next file emitted, and the
   *  row log's positions (`[epoch, row]` each, by `<writer>/p<n>`). */
  def of(position: String, rows: Long,
      rowLog: Map[String, (Long, Long)] = Map.empty): DeltaSourceOffset = {
    val node = Brain.json.readTree(position).asInstanceOf[ObjectNode]
    node.remove(RowsOfNextFile)
    node.remove(RowLog)
    if (rows > 0) node.put(RowsOfNextFile, rows)
    if (rowLog.nonEmpty) {
      val log = node.putObject(RowLog)
      // Sorted, so that equal positions make equal JSON.
      rowLog.toSeq.sortBy(_._1).foreach { case (k, (e, r)) => log.putArray(k).add(e).add(r) }
    }
    of(node)
  }

  /** The brain's part of `offset` (compact JSON), its rows of the next file and its row
   *  log's positions. */
  def split(offset: Offset): (String, Long, Map[String, (Long, Long)]) = {
    val node = Brain.json.readTree(offset.json()).asInstanceOf[ObjectNode]
    val rows = Option(node.remove(RowsOfNextFile)).map(_.asLong()).getOrElse(0L)
    val log = Option(node.remove(RowLog)).toSeq.flatMap(_.properties().asScala)
      .map(p => p.getKey -> (p.getValue.get(0).asLong(), p.getValue.get(1).asLong())).toMap
    (node.toString, rows, log)
  }
}
