package io.deltaflow.spark

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import org.apache.hadoop.fs.{FileSystem, Path}

import org.apache.spark.TaskContext
import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.streaming.WriteToStreamStatement
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.read.{InputPartition, PartitionReader, PartitionReaderFactory}
import org.apache.spark.sql.connector.read.streaming.{Offset, PartitionOffset, SupportsRealTimeMode, SupportsRealTimeRead}
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeRead.RecordStatus
import org.apache.spark.sql.deltaflow.{RealTimeFilesEndpoint, RealTimeIdle, RowLogArrow, StepTimes}
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.SerializableConfiguration

/**
 * Spark's real-time mode (`trigger(realTime="...")`, Spark 4.1+) for the Delta source.
 *
 * Each epoch runs one long-lived task ([[RealTimeReader]]) that tails the table's log:
 * it stats the next commit file (`_delta_log/<version>.json`) every
 * `realTimePollIntervalMs` (default [[RealTimePoll.defaultMs]]), and when it
 * exists asks the driver ([[RealTimeFilesEndpoint]]) for the files after its position,
 * which the brain's stream rules plan (`stream.rtNext`: `startingVersion`,
 * `skipChangeCommits`, `ignoreDeletes` as in micro-batch), then reads them with Spark's
 * Parquet reader, deleted rows left out. When the epoch's time is up Spark takes the
 * reader's position ([[DeltaPartitionOffset]]: the offset of the last file read whole
 * and the rows of the next one already emitted) as the epoch's end offset.
 *
 * One partition: a Delta log is one sequence of commits; a commit's rows arrive in one
 * task, in log order.
 *
 * On a local table with a row log beside it (a real-time sink's `realTimeRowLog`,
 * `docs/notes/rowlog.md`) the same task also tails the log ([[RowLogTails]]): its rows go
 * out as soon as their frames are synced, the commits' files tagged with positions it holds
 * are skipped, and the offset records its position in each `<writer>/p<n>`.
 */
trait RealTimeSupport extends SupportsRealTimeMode with Logging { self: DeltaMicroBatchStream =>
  @volatile private var realTime = false
  @volatile private var endpoint: (RealTimeFilesEndpoint.Address, () => Unit) = _

  private[spark] def realTimeMode: Boolean = realTime

  override def prepareForRealTimeMode(): Unit = realTime = true

  private def pollMs: Long = {
    val raw = Option(options.get("realTimePollIntervalMs")).map(_.trim)
    val parsed = raw.map(r => r.toLongOption.filter(_ > 0).getOrElse(throw DeltaflowException.of(
      "InvalidOptionError", s"Option 'realTimePollIntervalMs' must be a positive number of " +
        s"milliseconds, not '$r'.", Map("option" -> "realTimePollIntervalMs"))))
    parsed.getOrElse(RealTimePoll.defaultMs(info.uri))
  }

  private def address: RealTimeFilesEndpoint.Address = synchronized {
    if (endpoint == null) endpoint = RealTimeFilesEndpoint.start(nextFiles)
    endpoint._1
  }

  private[spark] def stopRealTime(): Unit = synchronized {
    if (endpoint != null) { endpoint._2(); endpoint = null }
  }

  /** The brain's answer to a reader at `after`, as the reader takes it. */
  private def nextFiles(after: String): RealTimeFiles = filesAfter(after, None)

  private def filesAfter(after: String, until: Option[String]): RealTimeFiles = {
    val result = call("stream.rtNext", { args =>
      args.set[JsonNode]("after", Brain.json.readTree(after))
      until.foreach(u => args.set[JsonNode]("until", Brain.json.readTree(u)))
    })
    val files = result.get("files").elements().asScala.map { node =>
      val file = ScanFile.fromJson(node)
      val fileLayout = if (changeFeed) changeLayouts.of(file) else layout
      RealTimeFile(node.get("offset").toString, FileReads.wholeFile(file, fileLayout),
        file.change.map(c => (c.isCdc, c.version, file.location)),
        Option(node.get("rowLog")).map(_.asText()))
    }.toArray
    RealTimeFiles(files, result.get("end").toString, result.get("latest").asLong(),
      result.path("more").asBoolean(false))
  }

  /** The epoch's start, and where its reader begins each `<writer>/p<n>` of the row log:
   *  the brain's answer for the start version (from the app transactions), overridden by
   *  the positions the offset recorded. */
  private def resolve(position: String,
      recorded: Map[String, (Long, Long)]): (String, Map[String, RowLogPosition]) = {
    val answer = call("stream.rtStart", { args =>
      args.set[JsonNode]("start", Brain.json.readTree(position))
      // Those the offset records need no app transaction looked up.
      val known = args.putArray("rowLogKnown")
      recorded.keys.foreach(k => known.add(k))
    })
    val found = Option(answer.get("rowLog")).toSeq.flatMap(_.properties().asScala)
      .map(p => p.getKey -> RowLogPosition(p.getValue.get(0).asLong(), p.getValue.get(1).asLong()))
    (answer.get("start").toString,
      found.toMap ++ recorded.map { case (k, (e, r)) => k -> RowLogPosition(e, r) })
  }

  /** [[resolve]], with the query's first start kept in its checkpoint
   *  (`<checkpoint>/sources/<n>/realtime-start`) and taken from there when the same start
   *  comes again. Spark records an epoch's offsets only at its end, so a driver lost in the
   *  first epoch starts it again from the initial offset, which would resolve to a later
   *  snapshot: files compacted since, or the commits between read from a row log, give the
   *  epoch's rows in another order, and the sink's replay premise (the n-th row of an
   *  epoch is the same row in every attempt) would not hold. Later epochs start at the
   *  recorded end of the one before, which resolves to itself. */
  private def resolveKept(start: Offset, position: String, recorded: Map[String, (Long, Long)])
      : (String, Map[String, RowLogPosition]) = metadataPath match {
    case None => resolve(position, recorded)
    case Some(dir) =>
      val file = new Path(dir, RealTimeStartFile)
      val fs = file.getFileSystem(SparkSession.active.sessionState.newHadoopConf())
      val asked = Brain.json.readTree(start.json())
      val kept = if (!fs.exists(file)) None else {
        val in = fs.open(file)
        try Some(Brain.json.readTree(in)) finally in.close()
      }
      kept.filter(_.get("offset") == asked) match {
        case Some(k) =>
          val log = k.get("rowLog").properties().asScala.map(p =>
            p.getKey -> RowLogPosition(p.getValue.get(0).asLong(), p.getValue.get(1).asLong()))
          (k.get("begin").toString, log.toMap)
        case None =>
          val resolved = resolve(position, recorded)
          if (kept.isEmpty) keep(fs, file, asked, resolved)
          resolved
      }
  }

  private val RealTimeStartFile = "realtime-start"

  /** Writes the first start where [[resolveKept]] finds it: a whole file or none (written
   *  aside, then renamed into place). */
  private def keep(fs: FileSystem, file: Path, offset: JsonNode,
      resolved: (String, Map[String, RowLogPosition])): Unit = {
    val node = Brain.json.createObjectNode()
    node.set[JsonNode]("offset", offset)
    node.set[JsonNode]("begin", Brain.json.readTree(resolved._1))
    val log = node.putObject("rowLog")
    resolved._2.foreach { case (k, p) => log.putArray(k).add(p.epoch).add(p.row) }
    val aside = new Path(file.getParent, s".${file.getName}.${java.util.UUID.randomUUID()}.tmp")
    val out = fs.create(aside, false)
    try out.write(Brain.json.writeValueAsBytes(node)) finally out.close()
    if (!fs.rename(aside, file)) {
      fs.delete(aside, false)
      throw new java.io.IOException(s"could not keep the real-time start at $file")
    }
  }

  /** The row log this stream reads beside the table (`docs/notes/rowlog.md`): on a local
   *  table only (other stores have no row log in this slice), not for the change feed (it
   *  comes from Delta commits), and not when the output asks for `_metadata` or constant
   *  columns, which only files have, or prunes a nested column (a frame's vectors are whole
   *  columns). Then every read comes from Delta. */
  private def rowLogPlan(start: Map[String, RowLogPosition],
      end: Option[Map[String, RowLogPosition]]): Option[RowLogPlan] =
    if (!RealTimePoll.isLocal(info.uri) || changeFeed || layout.metadataFields.nonEmpty ||
        layout.constants.nonEmpty || !wholeColumns) None
    else {
      val root = new java.io.File(new Path(info.uri).toUri.getPath, RowLog.Directory)
      Some(RowLogPlan(root.getPath, start, end, info.schema, layout.required))
    }

  private def wholeColumns: Boolean = layout.required.fields.forall(f =>
    info.schema.fields.exists(t => t.name.equalsIgnoreCase(f.name) &&
      RowLogArrow.nullable(t.dataType) == RowLogArrow.nullable(f.dataType)))

  override def planInputPartitions(start: Offset): Array[InputPartition] = {
    val (position, rows, recorded) = DeltaSourceOffset.split(start)
    val (begin, logStart) = resolveKept(start, position, recorded)
    Array(RealTimeInputPartition(address, begin, rows, None, info.uri, pollMs,
      rowLogPlan(logStart, None)))
  }

  /** An epoch the offset log recorded, read again exactly: its files, then as many rows
   *  of the next file as the epoch had emitted; and the row log from the start's
   *  positions up to the end's. */
  private[spark] def realTimeReplay(start: Offset, end: Offset): Array[InputPartition] = {
    val (from, fromRows, fromLog) = DeltaSourceOffset.split(start)
    val (to, toRows, toLog) = DeltaSourceOffset.split(end)
    val (begin, logStart) = resolve(from, fromLog)
    val between = filesAfter(begin, Some(to)).files
    val partial = if (toRows == 0) Array.empty[RealTimeFile] else nextFiles(to).files.take(1)
    val replay = RealTimeReplay(between, partial.headOption, to, toRows)
    val logEnd = toLog.map { case (k, (e, r)) => k -> RowLogPosition(e, r) }
    Array(RealTimeInputPartition(address, begin, fromRows, Some(replay), info.uri, pollMs,
      rowLogPlan(logStart, Some(logEnd))))
  }

  override def mergeOffsets(offsets: Array[PartitionOffset]): Offset = {
    val Array(only: DeltaPartitionOffset) = offsets
    DeltaSourceOffset.of(only.position, only.rows,
      only.rowLog.map { case (k, p) => k -> (p.epoch, p.row) })
  }

  private[spark] def realTimeReaderFactory(): PartitionReaderFactory = {
    val spark = SparkSession.active
    val conf = spark.sessionState.newHadoopConfWithOptions(Map.empty[String, String])
    val options = RealTimePoll.readerConf(info.uri, conf)
    def factory(l: ReadLayout) = FileReads.readerFactory(spark, l, withDeletes = true,
      Array.empty[Filter], inRequiredOrder = true, hadoopOptions = options)
    if (!changeFeed) new RealTimeReaderFactory(factory(layout), new SerializableConfiguration(conf))
    else new RealTimeReaderFactory(factory(changeLayouts.data), new SerializableConfiguration(conf),
      Some(RealTimeChangeReads(factory(changeLayouts.cdc), changeLayouts.changeTypeAt)))
  }
}

/** What [[StreamTriggerCheck]] needs to know of a statement's trigger. */
object StreamTrigger {
  /** The trigger, when it is the continuous one. */
  def continuous(w: WriteToStreamStatement): Option[String] =
    Some(w.trigger).filter(_.getClass.getSimpleName == "ContinuousTrigger").map(_.toString)

  /** Whether the query runs in real-time mode. */
  def realTime(w: WriteToStreamStatement): Boolean =
    w.trigger.getClass.getSimpleName == "RealTimeTrigger"
}

/** A file for a real-time reader, and the offset the stream is at once it is read whole;
 *  a change file: whether it is a cdc file, its version and location; a real-time sink's
 *  file: its `deltaflow.rowLog` tag (the row log positions it holds). */
case class RealTimeFile(offset: String, partition: DeltaInputPartition,
    change: Option[(Boolean, Long, String)] = None, rowLogTag: Option[String] = None)

/** How a change-feed reader reads cdc files, and where their `_change_type` is. */
case class RealTimeChangeReads(cdc: PartitionReaderFactory, changeTypeAt: Int)

/** The brain's answer to one reader's question: files, the position after them, the newest
 *  version it looked at, and whether more files wait beyond the read limit. */
case class RealTimeFiles(files: Array[RealTimeFile], end: String, latest: Long, more: Boolean)

/** A recorded epoch read again: `files` whole, then `rows` rows of `partial`; it ends at
 *  `end` with `rows`. */
case class RealTimeReplay(files: Array[RealTimeFile], partial: Option[RealTimeFile], end: String,
    rows: Long)

case class RealTimeInputPartition(
    endpoint: RealTimeFilesEndpoint.Address,
    start: String,
    startRows: Long,
    replay: Option[RealTimeReplay],
    tableUri: String,
    pollMs: Long,
    rowLog: Option[RowLogPlan] = None) extends InputPartition

/** A reader's row log: its directory, where each `<writer>/p<n>` starts, a replay's ends,
 *  the stream's schema (what each frame must have) and its output columns. */
case class RowLogPlan(root: String, start: Map[String, RowLogPosition],
    replayEnd: Option[Map[String, RowLogPosition]], schema: StructType, required: StructType)

/** A real-time reader's position: the offset of the last file read whole (the brain's JSON)
 *  and how many rows of the next file it emitted; and in the row log, the next row of each
 *  `<writer>/p<n>`. */
case class DeltaPartitionOffset(position: String, rows: Long,
    rowLog: Map[String, RowLogPosition] = Map.empty) extends PartitionOffset

class RealTimeReaderFactory(files: PartitionReaderFactory, conf: SerializableConfiguration,
    changes: Option[RealTimeChangeReads] = None) extends PartitionReaderFactory {
  override def supportColumnarReads(partition: InputPartition): Boolean = false

  override def createReader(partition: InputPartition): PartitionReader[InternalRow] =
    new RealTimeReader(partition.asInstanceOf[RealTimeInputPartition], files, conf, changes)
}

/** One epoch's long-lived task over the table's log (see [[RealTimeSupport]]).
 *
 *  At the epoch's end (its `close`) it logs one timing line (INFO), where a commit's
 *  milliseconds go on the source's side: `notice` (the stat that saw the commit and the
 *  driver's `rtNext` round trip), `open` (Spark's Parquet reader created and its first
 *  row read), `rest of file` (the reader's own time in the file's other rows and its
 *  close; not the sink's work between rows) and `file` (open to close, wall time, the
 *  sink's work between rows included). */
class RealTimeReader(p: RealTimeInputPartition, files: PartitionReaderFactory,
    conf: SerializableConfiguration, changes: Option[RealTimeChangeReads] = None)
  extends SupportsRealTimeRead[InternalRow] with Logging {
  // Under the sink's timing lines' logger, so one logger level shows every real-time step.
  override protected def logName: String = "org.apache.spark.sql.deltaflow.RealTimeReader"

  private lazy val driver = RealTimeFilesEndpoint.connect(p.endpoint)
  private val logDir = new Path(new Path(p.tableUri), "_delta_log")
  private lazy val fs: FileSystem = logDir.getFileSystem(conf.value)

  private var position = p.start
  private var rows = p.startRows
  private var skip = p.startRows
  private val queue = mutable.Queue[RealTimeFile]()
  private var queueEnd: String = _
  private var current: PartitionReader[InternalRow] = _
  private var currentFile: RealTimeFile = _
  private var currentLimit = -1L // rows to emit of the current file; -1: all
  private var checkChangeType = false // a cdc file: its rows must carry _change_type
  private var nextVersion = -1L // the commit whose file the reader waits for; -1: ask now
  private var replayed = false
  private var lastFetch = 0L
  // The epoch's timing line (see the class doc): nanoTime pairs and counters only, nothing
  // allocated per row.
  private val notices = new StepTimes("notice")
  private val opens = new StepTimes("open")
  private val rests = new StepTimes("rest of file")
  private val wholeFiles = new StepTimes("file")
  private var fileOpened = 0L  // nanoTime the current file's open began
  private var firstRowDue = false  // the current file's first next() is still to come
  private var restNanos = 0L  // the reader's own time in the current file after its first row
  private var filesRead = 0L  // files read to their end (one the epoch ended in is not)
  // The sink writer of this task hears when this reader waits for the next commit with
  // every row handed on, and when it reads again (RealTimeIdle).
  private val taskAttempt = Option(TaskContext.get()).map(_.taskAttemptId())
  private var idleSaid = false
  private var rowsEmitted = 0L  // rows handed on (not those a replay skipped)
  // The table's row log, read beside its commits (docs/notes/rowlog.md): its rows go out
  // as soon as their frames are whole; the commits' files that hold them are skipped.
  private val rowLog = p.rowLog.map(l => new RowLogTails(new java.io.File(l.root), l.start,
    l.replayEnd, l.schema, l.required, p.tableUri))
  private var logRow: InternalRow = _  // the row log's row get() returns; null: a file's
  private var logRows = 0L
  private var currentTag: Option[String] = None  // the current file's row log tag, if read
  // When the Delta part last had every commit made before then read (nanoTime): a stat
  // found no next commit with nothing queued. A row log tail crosses a stretch no segment
  // holds only after it (RowLog's PartitionTail.poll).
  private var deltaReadAt = 0L

  p.replay.foreach { r =>
    queue ++= r.files
    r.partial.foreach(queue += _)
  }

  override def getOffset: PartitionOffset =
    DeltaPartitionOffset(position, rows, rowLog.map(_.positions).getOrElse(Map.empty))

  override def get(): InternalRow = if (logRow != null) logRow else current.get()

  /** Hands on the row log's next waiting row, if one waits. */
  private def emitFromLog(): Boolean = rowLog.exists(_.waiting) && {
    logRow = rowLog.get.next().orNull
    if (logRow != null) { sayIdle(false); rowsEmitted += 1; logRows += 1 }
    logRow != null
  }

  private def pollLog(): Boolean = rowLog.exists(_.poll(since => deltaReadAt > since))

  override def next(): Boolean = nextWithTimeout(0L).hasRecord

  override def nextWithTimeout(timeoutMs: java.lang.Long): RecordStatus = {
    val deadline = System.currentTimeMillis() + timeoutMs
    logRow = null
    while (true) {
      if (current != null) {
        if ((currentLimit < 0 || rows < currentLimit) && readNext()) {
          rows += 1
          rowsEmitted += 1
          currentTag.foreach(t => rowLog.get.readTagged(t, rows - 1))
          return RecordStatus.newStatusWithoutArrivalTime(true)
        }
        closeCurrent()
      } else if (emitFromLog()) {
        return RecordStatus.newStatusWithoutArrivalTime(true)
      } else if (queue.nonEmpty) {
        // The log's rows first (a stat per tail), so that a tagged file is judged against
        // positions with nothing waiting.
        if (!pollLog()) open(queue.dequeue())
      } else if (p.replay.isDefined) {
        // A recorded epoch's log rows: all there already (synced before the epoch ended),
        // unless retention deleted them, when the tagged files stood in. Its Delta part is
        // read: the log's tails may cross what no segment holds.
        deltaReadAt = System.nanoTime()
        if (!rowLog.exists(l => !l.reached && pollLog())) {
          if (!replayed) { position = p.replay.get.end; rows = p.replay.get.rows; replayed = true }
          return RecordStatus.newStatusWithoutArrivalTime(false)
        }
      } else {
        if (queueEnd != null) { position = queueEnd; rows = 0; queueEnd = null }
        val polled = System.nanoTime()
        if (!pollLog()) {
          sayIdle(true)
          if (nextVersion < 0 || committed(nextVersion)) {
            rowLog.foreach(_.discover(force = true))  // a commit may come with a new writer
            fetch(polled)
          } else {
            deltaReadAt = polled
            val left = deadline - System.currentTimeMillis()
            if (left <= 0) return RecordStatus.newStatusWithoutArrivalTime(false)
            Thread.sleep(math.min(p.pollMs, left))
          }
        }
      }
    }
    RecordStatus.newStatusWithoutArrivalTime(false)
  }

  private def committed(version: Long): Boolean =
    try fs.exists(new Path(logDir, f"$version%020d.json"))
    catch {
      // A store Hadoop cannot stat (no connector for its scheme): ask the driver instead,
      // once per poll interval.
      case _: java.io.IOException => System.currentTimeMillis() >= lastFetch + p.pollMs
    }

  /** Asks the driver for the files after the position; `polled`: when the stat that saw
   *  the commit began (the notice's start). */
  private def fetch(polled: Long): Unit = {
    lastFetch = System.currentTimeMillis()
    val answer = RealTimeFilesEndpoint.ask[RealTimeFiles](driver, position)
    if (answer.files.nonEmpty) notices.add(System.nanoTime() - polled)
    queue ++= answer.files
    queueEnd = answer.end
    nextVersion = if (answer.more) -1L else answer.latest + 1
  }

  private def sayIdle(idle: Boolean): Unit = if (idle != idleSaid) {
    idleSaid = idle
    taskAttempt.foreach(RealTimeIdle.say(_, idle))
  }

  private def open(file: RealTimeFile): Unit = {
    // A real-time sink's file whose rows this reader's row log holds: read whole already.
    val judged: Option[Option[Long]] = file.rowLogTag.flatMap(t => rowLog.map(_.tagged(t)))
    if (judged.contains(None)) { position = file.offset; rows = 0; skip = 0; return }
    val drop = judged.flatten.getOrElse(0L)
    currentTag = file.rowLogTag.filter(_ => rowLog.isDefined)
    sayIdle(false)
    fileOpened = System.nanoTime()
    firstRowDue = true
    currentFile = file
    val cdc = file.change.exists(_._1)
    checkChangeType = cdc
    current = missingAsTyped(
      (if (cdc) changes.get.cdc else files).createReader(file.partition))
    val isPartial = p.replay.exists(_.partial.contains(file))
    currentLimit = if (isPartial) p.replay.get.rows else -1L
    rows = 0
    // Rows emitted before a restart (`skip`), or already from the log (`drop`).
    skip = math.max(skip, drop)
    while (skip > 0 && readNext()) { skip -= 1; rows += 1 }
    skip = 0
    if (rows > 0) currentTag.foreach(t => rowLog.get.readTagged(t, rows - 1))
  }

  private def readNext(): Boolean = {
    val asked = System.nanoTime()
    val more = missingAsTyped(current.next())
    val answered = System.nanoTime()
    if (firstRowDue) { opens.add(answered - fileOpened); firstRowDue = false }
    else restNanos += answered - asked
    if (!more) return false
    if (checkChangeType && current.get().isNullAt(changes.get.changeTypeAt)) {
      val (_, version, location) = currentFile.change.get
      throw DeltaflowException.of("CorruptTableError",
        s"The change data file $location of ${p.tableUri} (version $version) has no " +
          "_change_type column, which the Delta protocol requires of cdc files.",
        Map("table_uri" -> p.tableUri, "path" -> location))
    }
    true
  }

  /** A change file VACUUM removed: the feed of its version is gone (typed, terminal). */
  private def missingAsTyped[T](body: => T): T =
    try body
    catch {
      case e: Exception if currentFile.change.isDefined && Iterator.iterate[Throwable](e)(_.getCause)
          .takeWhile(_ != null).exists(_.isInstanceOf[java.io.FileNotFoundException]) =>
        val (_, version, location) = currentFile.change.get
        throw DeltaflowException.of("ChangeDataFilesMissingError",
          s"The change data of version $version of ${p.tableUri} is gone: its file " +
            s"$location no longer exists (VACUUM removed it). Restart the stream with a new " +
            "checkpointLocation and a startingVersion whose files are still kept, or keep " +
            "files longer (delta.deletedFileRetentionDuration).",
          Map("table_uri" -> p.tableUri, "path" -> location), Map("version" -> version))
    }

  private def closeCurrent(): Unit = {
    val closing = System.nanoTime()
    current.close()
    val closed = System.nanoTime()
    rests.add(restNanos + closed - closing)
    wholeFiles.add(closed - fileOpened)
    restNanos = 0L
    filesRead += 1
    current = null
    if (currentLimit < 0) { position = currentFile.offset; rows = 0 }
    currentLimit = -1L
    currentTag = None
  }

  override def close(): Unit = {
    if (current != null) current.close()
    rowLog.foreach(_.close())
    val epoch = Option(TaskContext.get()).flatMap(t => Option(t.getLocalProperty(
      RealTimeReader.EpochProperty))).getOrElse("?")
    logInfo(s"deltaflow real-time reader e$epoch of ${p.tableUri}: $filesRead files, " +
      s"$rowsEmitted rows ($logRows from the row log); ${notices.summary}; ${opens.summary}; " +
      s"${rests.summary}; ${wholeFiles.summary}")
  }
}

object RealTimeReader {
  // The epoch a task runs in, as Spark's stream execution sets it on its jobs
  // (`MicroBatchExecution.BATCH_ID_KEY`).
  private val EpochProperty = "streaming.sql.batchId"
}
