package org.apache.spark.sql.deltaflow

import java.nio.file.{Files, FileSystems}
import java.nio.file.attribute.PosixFilePermissions

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.permission.FsPermission

/**
 * Hadoop's local file system without its two costs on a hot write path: Hadoop's
 * `RawLocalFileSystem` sets a new file's (and directory's) permission by forking `chmod`
 * when its native library is missing (the pyspark wheel has none), and the default
 * `LocalFileSystem` writes a `.crc` beside every file, forking again. Here the permission
 * is set with `java.nio` (one system call, same mode) and no `.crc` is written. Used for
 * a real-time sink's rolls ([[FileRolls.Roll]]): private files the driver moves into the
 * table (the brain skips `.crc` files, so the table's files are the same either way).
 */
class ForklessLocalFileSystem extends RawLocalFileSystem {
  private val posix = FileSystems.getDefault.supportedFileAttributeViews().contains("posix")

  override def setPermission(p: Path, permission: FsPermission): Unit = {
    if (!posix) super.setPermission(p, permission)
    else {
      val file = pathToFile(p).toPath
      val mode = permission.toShort & 0x1ff
      val symbolic = (0 until 9).map { i =>
        if ((mode & (1 << (8 - i))) != 0) "rwx".charAt(i % 3) else '-'
      }.mkString
      Files.setPosixFilePermissions(file, PosixFilePermissions.fromString(symbolic))
    }
  }
}

object ForklessLocalFileSystem {
  private val ImplKey = "fs.file.impl"

  /**
   * `conf`, changed in place so that `file:` paths (and paths without a scheme on a local
   * default file system) open through [[ForklessLocalFileSystem]], uncached (Hadoop's
   * cache is keyed by scheme, not by settings). A `file:` implementation the user chose
   * is kept. Returns whether the switch was made.
   */
  def use(conf: Configuration, directory: String): Boolean = {
    val scheme = Option(new Path(directory).toUri.getScheme)
      .getOrElse(Option(new Path(conf.get("fs.defaultFS", "file:///")).toUri.getScheme)
        .getOrElse("file"))
    val chosen = Option(conf.get(ImplKey))
    val default = chosen.forall(c => c == classOf[LocalFileSystem].getName ||
      c == classOf[ForklessLocalFileSystem].getName)
    if (scheme != "file" || !default) false
    else {
      conf.set(ImplKey, classOf[ForklessLocalFileSystem].getName)
      conf.setBoolean("fs.file.impl.disable.cache", true)
      true
    }
  }
}
