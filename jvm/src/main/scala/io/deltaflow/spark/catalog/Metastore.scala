package io.deltaflow.spark.catalog

import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Path, Paths}

import scala.jdk.CollectionConverters._
import scala.util.Try

import org.apache.hadoop.conf.Configuration

import io.deltaflow.spark.DeltaflowException

/**
 * The catalog's metastore when it is embedded Derby (`deltaflow.spark_conf()`'s default:
 * `<warehouse>/_metastore/metastore_db`). Derby admits one process per database; a second
 * one that opens it gets a deep Hive stack trace (after Hive's retries), or, where Spark
 * catches that, a catalog that silently is not there. So before this process uses the
 * catalog, [[checkAvailable]] looks whether another process holds the database and, if
 * so, refuses with `MetastoreInUseError` naming that process and what to do instead.
 *
 * The probe reads `/proc/locks` (Linux) for the lock Derby holds on `dbex.lck`; it never
 * opens the lock file itself: closing a file drops every POSIX lock the process holds
 * on it, Derby's included when Derby runs in this JVM. Elsewhere (no `/proc/locks`) it
 * does nothing and Derby's own error stands.
 */
object Metastore {
  /** Hive's default when no `javax.jdo.option.ConnectionURL` is set. */
  private val DefaultUrl = "jdbc:derby:;databaseName=metastore_db;create=true"

  /** Refuse with `MetastoreInUseError` when another process holds the embedded Derby
   *  metastore that `hadoopConf` (the session's Hive settings) names. */
  def checkAvailable(hadoopConf: Configuration): Unit = {
    derbyDirectory(Option(hadoopConf.get("javax.jdo.option.ConnectionURL")).getOrElse(DefaultUrl))
      .foreach(checkDirectory)
  }

  /** Hosts that open the metastore as they start (`SparkSQLEnv.init`), before a catalog
   *  plugin could look: `spark-sql` and `start-thriftserver.sh`. */
  private val EagerHosts = Seq("SparkSQLCLIDriver", "HiveThriftServer2")

  /** [[checkAvailable]] while `session`'s state is built, for the hosts that open the
   *  metastore right after; other hosts are checked when they first use the catalog
   *  (`DeltaCatalog.initialize`), so a process that never does runs beside the holder. */
  def checkAtHostStart(session: org.apache.spark.sql.SparkSession): Unit = {
    val command = Option(System.getProperty("sun.java.command")).getOrElse("")
    val hive = session.sparkContext.getConf.get("spark.sql.catalogImplementation", "in-memory")
    if (hive == "hive" && EagerHosts.exists(command.contains)) {
      val conf = new Configuration(false)
      session.sparkContext.getConf.getAllWithPrefix("spark.hadoop.").foreach { case (k, v) =>
        conf.set(k, v)
      }
      checkAvailable(conf)
    }
  }

  /** The database directory of an embedded Derby URL; None for anything else (a server,
   *  an in-memory Derby, another database). */
  def derbyDirectory(url: String): Option[Path] = {
    if (!url.startsWith("jdbc:derby:") || url.startsWith("jdbc:derby://")) return None
    val body = url.stripPrefix("jdbc:derby:")
    val parts = body.split(";").toSeq
    val named = parts.drop(1).collectFirst {
      case kv if kv.toLowerCase.startsWith("databasename=") => kv.substring("databaseName=".length)
    }
    val name = named.getOrElse(parts.headOption.getOrElse("")).stripPrefix("directory:")
    if (name.isEmpty || name.startsWith("memory:") || name.contains(":") && !name.matches(
      "^[A-Za-z]:[\\\\/].*")) return None
    val path = Paths.get(name)
    val base = Option(System.getProperty("derby.system.home"))
      .getOrElse(System.getProperty("user.dir"))
    Some(if (path.isAbsolute) path else Paths.get(base).resolve(path).normalize())
  }

  private def checkDirectory(directory: Path): Unit = {
    val lockFile = directory.resolve("dbex.lck")
    val locks = Paths.get("/proc/locks")
    if (!Files.exists(lockFile) || !Files.isReadable(locks)) return
    val inode = Try(Files.getAttribute(lockFile, "unix:ino").toString).getOrElse(return)
    val self = ProcessHandle.current().pid()
    val holders = Files.readAllLines(locks, StandardCharsets.UTF_8).asScala.flatMap { line =>
      // "1: POSIX  ADVISORY  WRITE 12345 fe:00:9986344 0 EOF" (a blocked waiter: "-> ...")
      val fields = line.trim.split("\\s+")
      if (fields.length >= 6 && fields(1) != "->" && fields(5).endsWith(s":$inode")) {
        Try(fields(4).toLong).toOption
      } else None
    }.filter(_ != self).distinct
    holders.headOption.foreach { pid => throw inUse(directory, pid) }
  }

  private def inUse(directory: Path, pid: Long): DeltaflowException = {
    val command = Try {
      new String(Files.readAllBytes(Paths.get(s"/proc/$pid/cmdline")), StandardCharsets.UTF_8)
        .replace('\u0000', ' ').trim
    }.getOrElse("")
    val shown = if (command.length > 300) command.take(297) + "..." else command
    val cwd = Try(Files.readSymbolicLink(Paths.get(s"/proc/$pid/cwd")).toString).getOrElse("")
    val holder = Seq(s"pid $pid", shown, if (cwd.nonEmpty) s"in $cwd" else "")
      .filter(_.nonEmpty).mkString(", ")
    DeltaflowException.of("MetastoreInUseError",
      s"The catalog's metastore at $directory (embedded Derby) is in use by another " +
        s"process ($holder). Embedded Derby admits one process at a time. Stop that " +
        "process; or give this one its own warehouse (spark.sql.warehouse.dir: its " +
        "metastore is <warehouse>/_metastore); or let both share a metastore database: " +
        "set DELTAFLOW_METASTORE_URL (and DELTAFLOW_METASTORE_JARS, the JDBC driver) for " +
        "every process, e.g. jdbc:postgresql://host:5432/metastore (docs/sql.md, \"The " +
        "catalog\").",
      Map("metastore" -> directory.toString, "holder_pid" -> pid.toString,
        "holder" -> shown))
  }
}
