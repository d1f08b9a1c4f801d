package io.deltaflow.spark

import java.io.{ByteArrayInputStream, File, RandomAccessFile}
import java.nio.{ByteBuffer, ByteOrder}
import java.util.Locale
import java.util.zip.CRC32

import scala.collection.mutable

import org.apache.arrow.memory.RootAllocator
import org.apache.arrow.vector.ipc.ArrowStreamReader

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection
import org.apache.spark.sql.deltaflow.RowLogArrow
import org.apache.spark.sql.types.StructType
import org.apache.spark.sql.vectorized.{ArrowColumnVector, ColumnVector, ColumnarBatch}

/** Where a reader is in one `(writer, partition)` of a row log: the next row to emit
 *  (`docs/notes/rowlog.md`, "Positions and exactly once"). */
case class RowLogPosition(epoch: Long, row: Long) extends Ordered[RowLogPosition] {
  override def compare(o: RowLogPosition): Int =
    if (epoch != o.epoch) java.lang.Long.compare(epoch, o.epoch)
    else java.lang.Long.compare(row, o.row)
}

/** One task attempt's rows of one epoch, from `fromRow` (`_rowlog.Segment`). */
case class RowLogSegment(file: File, epoch: Long, fromRow: Long, created: Long, nonce: String)

/** The row log's format, as `deltaflow.table._rowlog` defines it: both sides (the
 *  source's tails below, the sink's `RowLogAppender`) use these. */
object RowLog {
  val Directory = "_deltaflow_rowlog"
  val HeaderSize = 24
  private[spark] val Magic = 0x4c524644 // "DFRL", read little-endian
  private val SegmentName = """^(\d{20})-(\d{20})-(\d{13})-([0-9a-f]{8})\.arrows$""".r
  private val PartitionName = """^p(\d+)$""".r

  def segmentName(epoch: Long, fromRow: Long, created: Long, nonce: Int): String =
    f"$epoch%020d-$fromRow%020d-$created%013d-$nonce%08x.arrows"

  /** A frame: the 24-byte header (magic, payload length, fromRow, rows, CRC-32 of
   *  bytes 8-20 and the payload), then the payload. */
  def frame(payload: Array[Byte], fromRow: Long, rows: Int): Array[Byte] = {
    val out = ByteBuffer.allocate(HeaderSize + payload.length).order(ByteOrder.LITTLE_ENDIAN)
    out.putInt(Magic).putInt(payload.length).putLong(fromRow).putInt(rows)
    val crc = new CRC32()
    crc.update(out.array(), 8, 12)
    crc.update(payload)
    out.putInt(crc.getValue.toInt).put(payload)
    out.array()
  }

  def syncDirectory(dir: java.nio.file.Path): Unit = {
    val channel = java.nio.channels.FileChannel.open(dir, java.nio.file.StandardOpenOption.READ)
    try channel.force(true) finally channel.close()
  }

  /** A tailed `(writer, partition)`'s key: `<writer>/p<n>`, as tags and offsets spell it. */
  def key(writer: String, partition: Int): String = s"$writer/p$partition"

  /** `(key, epoch, fromRow, toRow)` of a `deltaflow.rowLog` tag `<writer>/p<n>/<e>/<from>-<to>`. */
  def parseTag(tag: String): (String, Long, Long, Long) = {
    val Array(writer, part, epoch, rows) = tag.split("/")
    val Array(from, to) = rows.split("-")
    (s"$writer/$part", epoch.toLong, from.toLong, to.toLong)
  }

  /** The `(writer, partition)` directories under `root`, as keys. */
  def partitionKeys(root: File): Seq[String] =
    Option(root.listFiles()).toSeq.flatten.filter(_.isDirectory).flatMap { w =>
      Option(w.list()).toSeq.flatten.collect { case n @ PartitionName(_) => s"${w.getName}/$n" }
    }

  def segments(dir: File): Seq[RowLogSegment] =
    Option(dir.list()).toSeq.flatten.collect { case n @ SegmentName(e, f, c, nonce) =>
      RowLogSegment(new File(dir, n), e.toLong, f.toLong, c.toLong, nonce)
    }

  /** `_rowlog._best`: of `position`'s epoch, the segment starting at or before its row with
   *  the latest start, then the latest created (a successor supersedes its predecessor). */
  def best(listed: Seq[RowLogSegment], position: RowLogPosition): Option[RowLogSegment] = {
    val here = listed.filter(s => s.epoch == position.epoch && s.fromRow <= position.row)
    if (here.isEmpty) None else Some(here.maxBy(s => (s.fromRow, s.created, s.nonce)))
  }

  /** The row after the last whole frame among `listed` (one epoch's segments; 0 when
   *  none): how far any attempt logged the epoch, readers may have emitted up to there. A
   *  header walk (24 bytes a frame, then a seek past its payload); a frame counts once its
   *  bytes are all there, its CRC unchecked, so this is an upper bound. */
  def loggedThrough(listed: Seq[RowLogSegment]): Long =
    listed.map { s =>
      val file = new java.io.RandomAccessFile(s.file, "r")
      try {
        val header = ByteBuffer.allocate(HeaderSize).order(ByteOrder.LITTLE_ENDIAN)
        val size = file.length()
        var at = 0L
        var through = s.fromRow
        var whole = true
        while (whole && at + HeaderSize <= size) {
          file.seek(at)
          file.readFully(header.array())
          val end = at + HeaderSize + (header.getInt(4) & 0xffffffffL)
          whole = header.getInt(0) == Magic && end <= size
          if (whole) {
            through = math.max(through, header.getLong(8) + (header.getInt(16) & 0xffffffffL))
            at = end
          }
        }
        through
      } finally file.close()
    }.foldLeft(0L)(math.max)

  /** A frame's header and payload, and the byte after it in its segment. */
  case class Frame(fromRow: Long, rows: Long, payload: Array[Byte], end: Long)

  /** The whole frames of `data` (the segment's bytes from `base` on); stops before a torn
   *  tail. A bad frame with bytes after it is corruption (typed, terminal). */
  def frames(data: Array[Byte], base: Long, segment: File, tableUri: String): Seq[Frame] = {
    val buf = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN)
    val out = mutable.ArrayBuffer[Frame]()
    var at = 0
    while (at + HeaderSize <= data.length) {
      val magic = buf.getInt(at)
      val length = buf.getInt(at + 4) & 0xffffffffL
      val fromRow = buf.getLong(at + 8)
      val rows = buf.getInt(at + 16) & 0xffffffffL
      val crc = buf.getInt(at + 20) & 0xffffffffL
      val end = at + HeaderSize + length
      if (end > data.length) return out.toSeq // incomplete: its writer is still writing it
      val check = new CRC32()
      check.update(data, at + 8, 12)
      check.update(data, at + HeaderSize, length.toInt)
      if (magic != Magic || check.getValue != crc) {
        if (end < data.length) throw DeltaflowException.of("CorruptTableError",
          s"The row log segment $segment of $tableUri has a damaged frame at byte ${base + at} " +
            "with more frames after it: the file was changed by something other than its " +
            "writer. Restart the reading stream from a Delta version (startingVersion) after " +
            "the damage; the table itself is unaffected.",
          Map("table_uri" -> tableUri, "path" -> segment.toString))
        return out.toSeq // a torn last frame: read on when it is whole
      }
      out += Frame(fromRow, rows, java.util.Arrays.copyOfRange(data, at + HeaderSize, end.toInt),
        base + end)
      at = end.toInt
    }
    out.toSeq
  }
}

/** Rows of one frame to emit: `count` rows from `first` of `batch`, the first at `position`
 *  of the `(writer, partition)` `tail`. */
final class RowLogChunk(val tail: PartitionTail, val position: RowLogPosition,
    reader: ArrowStreamReader, val batch: ColumnarBatch, val first: Int, val count: Int) {
  var emitted = 0
  def close(): Unit = reader.close()
}

/** Decodes frames into rows of the stream's columns (`required`, by name), refusing a
 *  frame whose schema is not the stream's (`schema`). */
final class RowLogDecoder(schema: StructType, required: StructType, tableUri: String) {
  private val allocator = new RootAllocator(Long.MaxValue)
  private def lower(s: String) = s.toLowerCase(Locale.ROOT)
  private def types(s: StructType) =
    s.fields.map(f => lower(f.name) -> RowLogArrow.nullable(f.dataType)).toMap
  private val expected = types(schema)

  def decode(frame: RowLog.Frame, segment: File): (ArrowStreamReader, ColumnarBatch) = {
    val reader = new ArrowStreamReader(new ByteArrayInputStream(frame.payload), allocator)
    try {
      reader.loadNextBatch()
      val root = reader.getVectorSchemaRoot
      val found = RowLogArrow.sparkSchema(root.getSchema)
      if (types(found) != expected) throw DeltaflowException.of("SourceSchemaChangedError",
        s"A frame of the row log segment $segment of $tableUri has the schema " +
          s"${found.simpleString}, not the stream's ${schema.simpleString}: its writer " +
          "writes another schema than the table's when this stream started. Restart the " +
          "query once the table has that schema (the writer's next commit changes it), to " +
          "read on with it.",
        Map("table_uri" -> tableUri), Map("version" -> -1L), Map("additive" -> false))
      val byName = found.fieldNames.map(lower).zipWithIndex.toMap
      val columns: Array[ColumnVector] = required.fields.map { f =>
        new ArrowColumnVector(root.getVector(byName(lower(f.name))))
      }
      (reader, new ColumnarBatch(columns, root.getRowCount))
    } catch { case e: Throwable => reader.close(); throw e }
  }

  def close(): Unit = allocator.close()
}

/** One `(writer, partition)` of a row log read from a position on, each position once:
 *  `_rowlog.PartitionTail`, frames decoded into [[RowLogChunk]]s. `position` is how far
 *  it has read; the rows of its chunks are the reader's to emit. */
final class PartitionTail(val key: String, dir: File, var position: RowLogPosition) {
  private var segment: Option[RowLogSegment] = None
  private var offset = 0L // bytes of the current segment already decoded
  private var size = -1L // the current segment's size when last read
  // When no segment could continue this tail while some lay beyond it (nanoTime); 0: not.
  private var stalled = 0L
  private var listing: Seq[RowLogSegment] = Nil
  private var listingStamp = Long.MinValue // the directory's mtime (ns) when listed
  private var listedAt = 0L // nanoTime

  /** The directory's segments: listed again when its mtime moved (a segment created or
   *  deleted), else at most every [[PartitionTail.RelistNanos]] (a store whose mtimes are
   *  coarse), so that an idle poll costs two stats, not a listing. */
  private def segments(): Seq[RowLogSegment] = {
    val stamp = try java.nio.file.Files.getLastModifiedTime(dir.toPath)
        .to(java.util.concurrent.TimeUnit.NANOSECONDS)
      catch { case _: java.io.IOException => Long.MinValue + 1 }
    val now = System.nanoTime()
    if (stamp != listingStamp || now - listedAt > PartitionTail.RelistNanos) {
      listing = RowLog.segments(dir); listingStamp = stamp; listedAt = now
    }
    listing
  }

  /** Moves to `at`, past rows a tagged file stood in for (their segments are gone). */
  def moveTo(at: RowLogPosition): Unit = if (position < at) {
    if (at.epoch != position.epoch) reset()
    position = at
  }

  /** Whether the log holds the rows of `epoch` from `row` on: a segment of that epoch
   *  starts at or before it. */
  def holds(epoch: Long, row: Long): Boolean =
    RowLog.segments(dir).exists(s => s.epoch == epoch && s.fromRow <= row)

  /** Reads what the log holds after `position` (up to `limit`) into `out`.
   *
   *  `mayCross(since)`: whether the reader's Delta part has read every commit made before
   *  `since` (nanoTime). A tail that no segment can continue (its epoch's segments were
   *  deleted by retention, or all start after its row: a writer that began logging
   *  mid-epoch, or a new writer's first epoch) while segments exist beyond it moves to the
   *  first of them only then: the rows in between are in Delta commits made before those
   *  segments, whose tagged files (or untagged ones) the reader has read by then. */
  def poll(decoder: RowLogDecoder, out: mutable.Queue[RowLogChunk], limit: Option[RowLogPosition],
      mayCross: Long => Boolean, tableUri: String): Unit = {
    def done = limit.exists(position >= _)
    var moved = true
    while (moved && !done) {
      moved = false
      readCurrent(decoder, out, limit, tableUri)
      if (!done) {
        val listed = segments()
        val winner = RowLog.best(listed, position)
        if (winner.isDefined && winner != segment) {
          reset(); segment = winner; moved = true
        } else if (winner.isDefined) {
          val later = listed.filter(_.epoch > position.epoch)
          if (later.nonEmpty) {
            // A later epoch began after every task of this one synced its frames and
            // committed: read this one to its end once more, then move on.
            readCurrent(decoder, out, limit, tableUri)
            if (!done) {
              position = RowLogPosition(later.map(_.epoch).min, 0L); reset(); moved = true
            }
          }
        } else {
          val ahead = listed.map(s => RowLogPosition(s.epoch, s.fromRow)).filter(_ > position)
          if (ahead.nonEmpty) {
            if (stalled == 0L) stalled = System.nanoTime()
            if (mayCross(stalled)) { position = ahead.min; reset(); moved = true }
          }
        }
      }
    }
  }

  private def reset(): Unit = { segment = None; offset = 0L; size = -1L; stalled = 0L }

  private def readCurrent(decoder: RowLogDecoder, out: mutable.Queue[RowLogChunk],
      limit: Option[RowLogPosition], tableUri: String): Unit = for (s <- segment) {
    val length = s.file.length() // one stat per poll; nothing new when it did not grow
    if (length != size) read(s, length, decoder, out, limit, tableUri)
  }

  private def read(s: RowLogSegment, length: Long, decoder: RowLogDecoder,
      out: mutable.Queue[RowLogChunk], limit: Option[RowLogPosition], tableUri: String): Unit = {
    size = length
    val data = {
      val f = new RandomAccessFile(s.file, "r")
      try {
        val bytes = new Array[Byte]((f.length() - offset).toInt)
        f.seek(offset); f.readFully(bytes); bytes
      } finally f.close()
    }
    for (frame <- RowLog.frames(data, offset, s.file, tableUri)) {
      offset = frame.end
      val skip = position.row - frame.fromRow
      val stop = limit.filter(_.epoch == position.epoch).map(_.row - frame.fromRow)
        .getOrElse(frame.rows)
      val upTo = math.min(frame.rows, stop)
      if (skip < upTo && !limit.exists(position >= _)) {
        val first = math.max(0L, skip)
        val (reader, batch) = decoder.decode(frame, s.file)
        out += new RowLogChunk(this, position, reader, batch, first.toInt, (upTo - first).toInt)
        position = RowLogPosition(position.epoch, frame.fromRow + upTo)
      }
    }
  }
}

object PartitionTail {
  val RelistNanos: Long = 100L * 1000 * 1000
}

/** Every `(writer, partition)` of a table's row log, for one real-time reader: which it
 *  tails, their positions (what the reader's offset records), and the rows waiting. */
final class RowLogTails(root: File, start: Map[String, RowLogPosition],
    replayEnd: Option[Map[String, RowLogPosition]], schema: StructType, required: StructType,
    tableUri: String) {
  private val decoder = new RowLogDecoder(schema, required, tableUri)
  private val tails = mutable.LinkedHashMap[String, PartitionTail]()
  // Positions of writers whose log this reader does not tail, from their tagged files.
  private val untailed = mutable.Map[String, RowLogPosition]()
  private val pending = mutable.Queue[RowLogChunk]()
  private val project = UnsafeProjection.create(required)
  private var chunk: RowLogChunk = _
  private var listed = 0L // when the top directory was last listed (ms)

  /** How often the top directory is listed for new writers and partitions, and on each
   *  Delta commit the reader notices: a listing of a few names, a cost that a 2 ms stat
   *  loop need not pay each time. */
  private val DiscoverMs = 50L

  def discover(force: Boolean): Unit = {
    val now = System.currentTimeMillis()
    if (!force && now - listed < DiscoverMs) return
    listed = now
    for (k <- RowLog.partitionKeys(root) if !tails.contains(k)) {
      val from = start.get(k).orElse(untailed.remove(k)).getOrElse(RowLogPosition(0L, 0L))
      val Array(w, p) = k.split("/")
      tails(k) = new PartitionTail(k, new File(new File(root, w), p), from)
    }
  }

  /** Reads every tail when no rows wait; true when rows now wait. */
  def poll(mayCross: Long => Boolean): Boolean = {
    if (!waiting) {
      discover(force = false)
      for (t <- tails.values)
        // A replay reads a tail up to its recorded end, and one it did not record not at all.
        t.poll(decoder, pending, replayEnd.map(_.getOrElse(t.key, t.position)), mayCross,
          tableUri)
    }
    waiting
  }

  def waiting: Boolean = {
    if (chunk != null && chunk.emitted == chunk.count) { chunk.close(); chunk = null }
    chunk != null || pending.nonEmpty
  }

  /** The next waiting row, or None. */
  def next(): Option[InternalRow] = {
    while (chunk == null || chunk.emitted == chunk.count) {
      if (chunk != null) { chunk.close(); chunk = null }
      if (pending.isEmpty) return None
      chunk = pending.dequeue()
    }
    val row = project(chunk.batch.getRow(chunk.first + chunk.emitted))
    chunk.emitted += 1
    Some(row)
  }

  /** What the reader's offset records: each tail at its next row to emit. */
  def positions: Map[String, RowLogPosition] = {
    // A tail's chunks not yet emitted start where it is, as far as the offset goes.
    val unemitted = (Option(chunk).toSeq ++ pending).groupBy(_.tail.key).map { case (k, cs) =>
      val c = cs.head
      k -> RowLogPosition(c.position.epoch, c.position.row + c.emitted)
    }
    untailed.toMap ++ tails.map { case (k, t) => k -> unemitted.getOrElse(k, t.position) }
  }

  /** The decision for a committed file tagged `tag` (no rows waiting in the log): the rows
   *  to drop from its start, or None to skip it because this log holds them. */
  def tagged(tag: String): Option[Long] = {
    val (k, epoch, from, to) = RowLog.parseTag(tag)
    discover(force = true)
    tails.get(k) match {
      case Some(t) =>
        val drop = if (t.position.epoch == epoch) math.max(0L, t.position.row - from) else 0L
        if (RowLogPosition(epoch, to) <= t.position || t.holds(epoch, from + drop)) None
        else Some(drop)
      case None => Some(0L)
    }
  }

  /** A tagged file's row at `row` of the file was emitted (or dropped): its writer's next
   *  position moves past it (the segments are gone; the file stands in for them). */
  def readTagged(tag: String, row: Long): Unit = {
    val (k, epoch, from, _) = RowLog.parseTag(tag)
    val at = RowLogPosition(epoch, from + row + 1)
    tails.get(k) match {
      case Some(t) => t.moveTo(at)
      case None => if (untailed.get(k).forall(_ < at)) untailed(k) = at
    }
  }

  /** A replay's tails have all reached their end. */
  def reached: Boolean = replayEnd.forall(_.forall { case (k, end) =>
    tails.get(k).forall(_.position >= end) })

  def close(): Unit = {
    (Option(chunk).toSeq ++ pending).foreach(_.close())
    decoder.close()
  }
}
