package org.apache.spark.sql.deltaflow

import java.io.ByteArrayOutputStream
import java.nio.{ByteBuffer, ByteOrder}
import java.nio.channels.{Channels, FileChannel}
import java.nio.file.{Files, Paths, StandardOpenOption}
import java.util.concurrent.TimeUnit
import java.util.concurrent.locks.ReentrantLock

import scala.collection.mutable

import org.apache.arrow.vector.VectorSchemaRoot
import org.apache.arrow.vector.ipc.ArrowStreamWriter

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.arrow.ArrowWriter
import org.apache.spark.sql.types.{StructField, StructType}
import org.apache.spark.sql.util.ArrowUtils

/**
 * The row log's writer side (`docs/notes/rowlog.md`; the format's reference is
 * `deltaflow/table/_rowlog.py`, which reads what this writes). One task attempt of a
 * real-time epoch appends its rows, as Arrow IPC frames, to a segment of its own under
 * `<table>/_deltaflow_rowlog/<writer>/p<partition>/`, each frame synced before the rows
 * it holds count as durable.
 */
object RowLogWrite {
  // A frame is written once its batch holds this many rows, or `LingerNanos` after its
  // first row, or when the task's source says it is idle: whichever comes first. The
  // linger lets a burst's rows share a frame and an fdatasync; it bounds a row's wait.
  val MaxRows = 4096
  val LingerNanos: Long = TimeUnit.MILLISECONDS.toNanos(1)

  /** What the writer factory gives each task: the writer's directory and the frames' shape
   *  (the table's logical columns, partition columns included, in table order). */
  final case class Target(directory: String, shape: StagedFileWrite.Shape)
}

/**
 * A task attempt's appender: `append` (the task's row path) puts a row into the open
 * Arrow batch and returns; a flusher thread of its own seals the batch into a frame when
 * it is due (see [[RowLogWrite.MaxRows]]), writes every sealed frame and syncs them with one
 * `force(false)` (fdatasync). One sync in flight: rows arriving meanwhile go into the next
 * frame, so a burst pays one sync, not one per row. The segment is created (`CREATE_NEW`,
 * its directory synced) by the flusher before its first frame, off the row path.
 *
 * `syncThrough(row)` waits until every row before `row` is synced: a roll is handed to
 * the driver only after it (a tagged add whose rows the log lacks would make a reader
 * skip rows it never gets), and the task's commit only after all of them (Spark starts
 * the next epoch after every task of this one committed; readers move on then).
 */
final class RowLogAppender(directory: String, epoch: Long, schema: StructType, partition: Int) {
  import RowLogWrite._
  import io.deltaflow.spark.RowLog.{frame, segmentName, syncDirectory}

  private val lock = new ReentrantLock()
  private val changed = lock.newCondition()
  private val allocator = ArrowUtils.rootAllocator.newChildAllocator(
    s"deltaflow-rowlog-p$partition-e$epoch", 0, Long.MaxValue)
  // Spark's Arrow mapping with time zone UTC: TimestampType is timestamp[us, UTC].
  private val root = VectorSchemaRoot.create(
    ArrowUtils.toArrowSchema(schema, "UTC", true, false), allocator)
  private val arrow = ArrowWriter.create(root)
  // All under `lock`.
  private var batchFrom = 0L
  private var batchRows = 0
  private var batchStarted = 0L  // System.nanoTime of the batch's first row
  private val sealedFrames = mutable.ArrayBuffer[Array[Byte]]()
  private var sealedThrough = 0L  // the row after the last sealed one
  private var synced = 0L  // the row after the last synced one
  private var appended = 0L  // the row after the last appended one
  private var firstSealed = 0L  // when the oldest sealed frame's first row came
  private var started = false  // a row was appended
  private var idle = false
  private var stopping = false
  @volatile private var failure: Throwable = _
  private var closed = false  // the task's thread's only
  private var channel: FileChannel = _  // the flusher's only
  // A frame's first row's wait from its append to the frame's sync (the epoch's timing
  // line), and the frames sealed at the source's idle, before the linger ran out.
  val waits = new StepTimes("row log sync")
  @volatile private var idleFrames = 0
  def summary: String = s"${waits.summary} ($idleFrames frames at the source's idle)"
  private val flusher = new Thread(() => flushLoop(), s"deltaflow-rowlog-p$partition-e$epoch")
  flusher.setDaemon(true)
  flusher.start()

  private def locked[T](f: => T): T = { lock.lock(); try f finally lock.unlock() }

  /** The row at epoch position `position` (positions rise by one per call). */
  def append(row: InternalRow, position: Long): Unit = locked {
    if (failure != null) throw failure
    if (!started) { started = true; synced = position; sealedThrough = position }
    if (batchRows == 0) {
      batchFrom = position
      batchStarted = System.nanoTime()
      changed.signalAll()
    }
    arrow.write(row)
    batchRows += 1
    appended = position + 1
    if (batchRows >= MaxRows) {
      seal()
      changed.signalAll()
    }
  }

  /** The task's source handed on every row it had (`true`), or has rows again. */
  def sourceIdle(value: Boolean): Unit = locked {
    idle = value
    changed.signalAll()
  }

  /** Wait until every row before `row` is synced; a failed sync raises here. */
  def syncThrough(row: Long): Unit = locked {
    if (started && synced < row) {
      if (batchRows > 0 && batchFrom < row) seal()
      changed.signalAll()
      while (synced < row && failure == null) changed.await()
    }
    if (failure != null) throw failure
  }

  /** Every appended row synced (`sync`: the task's commit), then the flusher stops and
   *  the segment closes; without `sync` (an abort), what is not yet written is dropped. */
  def close(sync: Boolean): Unit = if (!closed) {
    closed = true
    try if (sync) syncThrough(locked(appended))
    finally {
      locked { stopping = true; changed.signalAll() }
      if (!sync) flusher.interrupt()
      flusher.join(TimeUnit.MINUTES.toMillis(1))
      locked {
        try arrow.reset() finally { root.close(); allocator.close() }
      }
      if (channel != null) channel.close()
    }
  }

  // Under `lock`: the open batch becomes a frame (an Arrow IPC stream of its own).
  private def seal(): Unit = {
    arrow.finish()
    val bytes = new ByteArrayOutputStream()
    val stream = new ArrowStreamWriter(root, null, Channels.newChannel(bytes))
    stream.start()
    stream.writeBatch()
    stream.end()
    if (sealedFrames.isEmpty) firstSealed = batchStarted
    sealedFrames += frame(bytes.toByteArray, batchFrom, batchRows)
    sealedThrough = batchFrom + batchRows
    arrow.reset()
    batchRows = 0
  }

  private def flushLoop(): Unit =
    try while (true) {
      val (frames, through, oldest) = locked {
        var ready = false
        while (!ready) {
          if (sealedFrames.nonEmpty) ready = true
          else if (batchRows > 0) {
            val left = batchStarted + LingerNanos - System.nanoTime()
            if (idle || stopping || left <= 0) {
              if (idle && left > 0) idleFrames += 1
              seal()
              ready = true
            }
            else changed.awaitNanos(left)
          } else if (stopping) return
          else changed.await()
        }
        val taken = sealedFrames.toList
        sealedFrames.clear()
        (taken, sealedThrough, firstSealed)
      }
      write(frames)
      val done = System.nanoTime()
      locked {
        synced = through
        changed.signalAll()
      }
      waits.add(done - oldest)
    } catch {
      case _: InterruptedException => ()  // an abort
      case e: Throwable => locked { failure = e; changed.signalAll() }
    }

  private def write(frames: Seq[Array[Byte]]): Unit = {
    if (channel == null) channel = create(frames.head)
    frames.foreach { f =>
      val buffer = ByteBuffer.wrap(f)
      while (buffer.hasRemaining) channel.write(buffer)
    }
    channel.force(false)
  }

  // The segment, named by its first frame's fromRow; its directory synced so the name
  // survives a crash (a reader lists segments by name).
  private def create(first: Array[Byte]): FileChannel = {
    val fromRow = ByteBuffer.wrap(first, 8, 8).order(ByteOrder.LITTLE_ENDIAN).getLong
    val dir = Paths.get(directory)
    Files.createDirectories(dir)
    val name = segmentName(epoch, fromRow, System.currentTimeMillis(),
      java.util.concurrent.ThreadLocalRandom.current().nextInt())
    val opened = FileChannel.open(dir.resolve(name), StandardOpenOption.CREATE_NEW,
      StandardOpenOption.WRITE)
    syncDirectory(dir)
    syncDirectory(dir.getParent)  // a writer's first partition directory
    opened
  }
}

object RowLogAppender {
  /** The frames' schema: the shape's columns, by name and type. */
  def schema(shape: StagedFileWrite.Shape): StructType =
    StructType(shape.output.map(a => StructField(a.name, a.dataType, a.nullable)))
}
