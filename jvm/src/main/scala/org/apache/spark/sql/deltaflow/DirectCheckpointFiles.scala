package org.apache.spark.sql.deltaflow

import java.io.{IOException, OutputStream}
import java.security.{DigestOutputStream, MessageDigest}
import java.util.concurrent.atomic.AtomicBoolean

import scala.util.control.NonFatal

import org.apache.hadoop.fs.{FileAlreadyExistsException, FileSystem, FSDataOutputStream, Path}

import org.apache.spark.internal.Logging

/**
 * Checkpoint files written straight to their final key on S3A, without Spark's temp file
 * and rename (on S3A a rename is a HEAD, COPY and DELETE that a second writer can
 * interleave). `DeltaflowCheckpointFileManager` (one per Spark minor, for the trait's
 * package) hands `createAtomic` calls on S3A here.
 *
 *  - `overwrite = false` (offset and commit logs, stream metadata, state schema files) is a
 *    put-if-absent: S3A's conditional create (`If-None-Match: *`, Hadoop 3.4.2+), checked by
 *    the store when `close()` uploads. A lost race (412, which S3A raises from `close()` as
 *    `RemoteFileChangedException`) becomes Hadoop's `FileAlreadyExistsException`, the
 *    exception Spark's `HDFSMetadataLog` turns into `CONCURRENT_STREAM_LOG_UPDATE` - unless
 *    the object holds exactly our bytes (S3A retried a PUT whose answer was lost: the 412
 *    is then our own first attempt), checked by digest.
 *  - `overwrite = true` (state store files) uploads to the final key, last writer wins.
 *  - `cancel()` aborts the upload: nothing is published. `close()` propagates every error.
 *
 * `hadoop-aws` is not on the compile class path (the pyspark wheel lacks it): S3A is
 * recognised by class names and option names are strings.
 */
object DirectCheckpointFiles extends Logging {
  /** The switch (default true); `deltaflow.session()` also leaves the manager unset. */
  val SwitchConf = "spark.deltaflow.checkpoint.directWrites"
  val S3AFileSystemClass = "org.apache.hadoop.fs.s3a.S3AFileSystem"
  /** `Options.CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE` (Hadoop 3.4.2+). */
  val ConditionalOverwrite = "fs.option.create.conditional.overwrite"
  private val RemoteFileChanged = "org.apache.hadoop.fs.s3a.RemoteFileChangedException"
  private val PreconditionFailed = 412
  private val warnedUnavailable = new AtomicBoolean(false)

  def isS3A(fs: FileSystem): Boolean = fs.getClass.getName == S3AFileSystemClass

  /**
   * A direct write of `path`, or None when the store cannot create conditionally (S3A's
   * `fs.s3a.create.conditional.enabled=false`, also per bucket, or a Hadoop without the
   * option): the caller then takes Spark's rename path. Logged once per JVM.
   */
  def create(fs: FileSystem, path: Path, overwrite: Boolean): Option[DirectCheckpointFile] = {
    val builder = fs.createFile(path)
    builder.overwrite(overwrite)
    if (!overwrite) {
      try builder.must(ConditionalOverwrite, true)
      catch { case e: IllegalArgumentException => return unavailable(path, e) }
    }
    val raw =
      try builder.build().asInstanceOf[FSDataOutputStream]
      catch {
        case e: IllegalArgumentException if !overwrite => return unavailable(path, e)
        case e: IOException if !overwrite && conditionalUnavailable(e) =>
          return unavailable(path, e)
      }
    Some(new DirectCheckpointFile(fs, path, raw, !overwrite))
  }

  private def unavailable(path: Path, e: Throwable): Option[DirectCheckpointFile] = {
    if (warnedUnavailable.compareAndSet(false, true)) {
      logWarning(
        s"deltaflow: the store of $path has no conditional create (S3A's " +
          "fs.s3a.create.conditional.enabled, Hadoop 3.4.2+): stream checkpoint files are " +
          "written with Spark's temp file and rename, and two queries on one checkpoint " +
          "are not fenced", e)
    }
    None
  }

  // S3A's `build()` with the switch off: PathIOException(path, "Conditional Writes Unavailable").
  private def conditionalUnavailable(e: IOException): Boolean =
    Option(e.getMessage).exists(_.contains("Conditional Writes Unavailable"))

  /** Whether `e`, or a cause of it, is the store's 412 for a conditional create. */
  def lostRace(e: Throwable): Boolean =
    Iterator.iterate(e)(_.getCause).takeWhile(_ != null).take(16).exists { t =>
      t.getClass.getName == RemoteFileChanged || statusCode(t).contains(PreconditionFailed)
    }

  // The AWS SDK's SdkServiceException.statusCode(), found by name.
  private def statusCode(t: Throwable): Option[Int] =
    try {
      t.getClass.getMethods.find(m => m.getName == "statusCode" && m.getParameterCount == 0)
        .map(_.invoke(t)).collect { case code: Integer => code.intValue }
    } catch { case NonFatal(_) => None }
}

/** One checkpoint file being written to its final key (see [[DirectCheckpointFiles]]). */
class DirectCheckpointFile(
    fs: FileSystem, path: Path, raw: FSDataOutputStream, conditional: Boolean)
  extends Logging {
  private val digest = MessageDigest.getInstance("SHA-256")
  private var done = false

  /** Where the caller writes: the upload, with a running digest of the bytes. */
  val stream: OutputStream = new DigestOutputStream(raw, digest)

  /** Upload (S3A sends the object here); a lost put-if-absent raises
   * `FileAlreadyExistsException`, every other failure propagates. */
  def close(): Unit = synchronized {
    if (done) return
    done = true
    try stream.close()
    catch {
      case e: IOException if conditional && DirectCheckpointFiles.lostRace(e) =>
        if (!holdsOurBytes()) {
          val lost = new FileAlreadyExistsException(
            s"$path was written by another writer first (a second query on this checkpoint?)")
          lost.initCause(e)
          throw lost
        }
        logInfo(s"deltaflow: $path already holds this write's bytes (a retried upload)")
    }
  }

  /** Discard the upload: nothing is published, an existing object stays as it was. */
  def cancel(): Unit = synchronized {
    if (done) return
    done = true
    try raw.abort()
    catch { case NonFatal(e) => logWarning(s"deltaflow: aborting the upload of $path", e) }
    try raw.close()
    catch { case NonFatal(e) => logDebug(s"deltaflow: closing the aborted upload of $path", e) }
  }

  private def holdsOurBytes(): Boolean = {
    val ours = digest.digest()
    try {
      val in = fs.open(path)
      try {
        val theirs = MessageDigest.getInstance("SHA-256")
        val buffer = new Array[Byte](64 * 1024)
        var n = in.read(buffer)
        while (n >= 0) {
          theirs.update(buffer, 0, n)
          n = in.read(buffer)
        }
        MessageDigest.isEqual(ours, theirs.digest())
      } finally in.close()
    } catch { case NonFatal(_) => false }
  }
}
