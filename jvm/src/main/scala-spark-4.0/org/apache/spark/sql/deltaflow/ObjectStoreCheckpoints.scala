package org.apache.spark.sql.deltaflow

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FSDataInputStream, FileStatus, Path, PathFilter, UnsupportedFileSystemException}

import org.apache.spark.sql.execution.streaming.{CheckpointFileManager, FileContextBasedCheckpointFileManager, FileSystemBasedCheckpointFileManager}
import org.apache.spark.sql.execution.streaming.CheckpointFileManager.CancellableFSDataOutputStream

/**
 * deltaflow's stream checkpoint manager (`spark.sql.streaming.checkpointFileManagerClass`,
 * not set by default on Spark 4.0): Spark's own manager for every path and
 * call, except `createAtomic` on S3A, which writes the final key directly - put-if-absent
 * for the offset and commit logs, so a second query on one checkpoint fails with Spark's
 * concurrent-update error instead of racing (see [[DirectCheckpointFiles]]). Local, HDFS and other
 * stores keep Spark's temp-file-and-rename writes unchanged. On Spark 4.0 (Hadoop 3.4.1: no
 * conditional create) the put-if-absent writes fall back to Spark's rename path; the trait lives in
 * `execution.streaming` there, which this variant binds to.
 */
class DeltaflowCheckpointFileManager(path: Path, hadoopConf: Configuration)
  extends CheckpointFileManager {

  // What CheckpointFileManager.create picks without the setting (never `create` itself: it
  // would read this class's name from the same setting again).
  private val spark: CheckpointFileManager =
    try new FileContextBasedCheckpointFileManager(path, hadoopConf)
    catch {
      case _: UnsupportedFileSystemException =>
        new FileSystemBasedCheckpointFileManager(path, hadoopConf)
    }
  // `spark.deltaflow.checkpoint.directWrites=false`: Spark's writes everywhere.
  private val direct = hadoopConf.getBoolean(DirectCheckpointFiles.SwitchConf, true)
  @volatile private var conditionalUnavailable = false

  override def createAtomic(
      file: Path, overwriteIfPossible: Boolean): CancellableFSDataOutputStream = {
    lazy val fs = file.getFileSystem(hadoopConf)
    val unavailable = conditionalUnavailable && !overwriteIfPossible
    if (!direct || unavailable || !DirectCheckpointFiles.isS3A(fs)) {
      return spark.createAtomic(file, overwriteIfPossible)
    }
    DirectCheckpointFiles.create(fs, file, overwriteIfPossible) match {
      case Some(upload) =>
        new CancellableFSDataOutputStream(upload.stream) {
          override def close(): Unit = upload.close()
          override def cancel(): Unit = upload.cancel()
        }
      case None =>
        conditionalUnavailable = true
        spark.createAtomic(file, overwriteIfPossible)
    }
  }

  override def open(file: Path): FSDataInputStream = spark.open(file)
  override def list(dir: Path, filter: PathFilter): Array[FileStatus] = spark.list(dir, filter)
  override def mkdirs(dir: Path): Unit = spark.mkdirs(dir)
  override def exists(file: Path): Boolean = spark.exists(file)
  override def delete(file: Path): Unit = spark.delete(file)
  override def isLocal: Boolean = spark.isLocal
  override def createCheckpointDirectory(): Path = spark.createCheckpointDirectory()
}
