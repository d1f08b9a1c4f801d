package io.deltaflow.spark

import java.net.URI

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.FileSystem

import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging
import org.apache.spark.sql.deltaflow.BrainGateway

/**
 * What the brain learns, at its start, about the object stores this JVM's Hadoop opens.
 *
 * The pyspark wheel has no `hadoop-aws`; a cluster may bring it (or GCS / ABFS connectors).
 * Which URIs take the JVM data path is decided by the brain (`read/_native.hadoop_opens`),
 * so the driver tells it which object-store schemes have a Hadoop `FileSystem` here
 * (`DELTAFLOW_HADOOP_SCHEMES`, empty when `spark.deltaflow.objectStore.jvmPath=false`). The
 * local schemes (file, hdfs, viewfs) are always the JVM's.
 *
 * Credentials come from one place: the driver's `fs.s3a.*` settings become the standard
 * AWS variables of the brain (delta-rs and pyarrow read them) when the driver's own
 * environment does not set them already. They go to the child's environment only: never
 * to its arguments, never to a log.
 */
object HadoopStores extends Logging {
  val JvmPathConf = "spark.deltaflow.objectStore.jvmPath"
  val SchemesVariable = "DELTAFLOW_HADOOP_SCHEMES"
  // Object-store schemes Hadoop connectors register; each is asked about, none assumed.
  private val Candidates = Seq(
    "s3a", "s3", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cosn", "obs", "ofs")

  /** The variables to add to a brain's environment (`existing`: what it inherits). */
  def environment(existing: java.util.Map[String, String]): Map[String, String] = {
    val conf = hadoopConf()
    val schemes = if (jvmPathOff) Seq.empty else Candidates.filter(opens(_, conf))
    if (schemes.nonEmpty) {
      logInfo(s"deltaflow: Hadoop opens ${schemes.mkString(", ")} here: tables there take " +
        s"the JVM data path ($JvmPathConf=false keeps them on the Python path)")
    }
    val wanted: Map[String, String] =
      if (schemes.exists(s => s == "s3a" || s == "s3")) awsVariables(conf) else Map.empty
    wanted.filter { case (k, _) => !existing.containsKey(k) } +
      (SchemesVariable -> schemes.mkString(","))
  }

  /** The AWS variables deltaflow's Python data source needs in its workers (the driver's
   *  planners and the executors' tasks, which read and write object stores through
   *  delta-rs and pyarrow): what the `fs.s3a.*` settings imply, less what this JVM's own
   *  environment sets (every Python worker inherits that). Empty without S3 settings. */
  def pythonWorkerVariables(): java.util.Map[String, String] = {
    val existing = System.getenv()
    awsVariables(hadoopConf()).filter { case (k, _) => !existing.containsKey(k) }.asJava
  }

  private def jvmPathOff: Boolean = Option(SparkEnv.get)
    .flatMap(_.conf.getOption(JvmPathConf)).exists(_.trim.equalsIgnoreCase("false"))

  private def hadoopConf(): Configuration =
    try BrainGateway.sparkContext().hadoopConfiguration
    catch { case NonFatal(_) => new Configuration() }

  private def opens(scheme: String, conf: Configuration): Boolean =
    try FileSystem.getFileSystemClass(scheme, conf) != null
    catch { case NonFatal(_) | _: LinkageError => false }

  private def uri(text: String): Option[URI] =
    try Some(URI.create(text)) catch { case NonFatal(_) => None }

  /** The AWS variables S3A's own settings imply (static keys, region, endpoint, style). */
  private[spark] def awsVariables(conf: Configuration): Map[String, String] = {
    def setting(key: String): Option[String] =
      (try Option(conf.getPassword(key)).map(new String(_))
       catch { case NonFatal(_) => None })
        .orElse(Option(conf.get(key))).map(_.trim).filter(_.nonEmpty)
    val ssl = Option(conf.get("fs.s3a.connection.ssl.enabled")).forall(_.trim != "false")
    // AWS's own endpoints are left to the SDKs (they resolve them from the region, in the
    // addressing style each prefers); others (S3-compatible servers) are passed on.
    val endpoint = setting("fs.s3a.endpoint")
      .map(e => if (e.contains("://")) e else (if (ssl) "https://" else "http://") + e)
      .filterNot(e =>
        uri(e).flatMap(u => Option(u.getHost)).exists(_.endsWith(".amazonaws.com")))
    val region = setting("fs.s3a.endpoint.region").orElse(setting("fs.s3a.region"))
    val pathStyle = Option(conf.get("fs.s3a.path.style.access")).exists(_.trim == "true")
    val plainHttp = endpoint.flatMap(uri).flatMap(u => Option(u.getScheme)).contains("http")
    Seq(
      "AWS_ACCESS_KEY_ID" -> setting("fs.s3a.access.key"),
      "AWS_SECRET_ACCESS_KEY" -> setting("fs.s3a.secret.key"),
      "AWS_SESSION_TOKEN" -> setting("fs.s3a.session.token"),
      "AWS_REGION" -> region,
      "AWS_ENDPOINT_URL" -> endpoint,
      "AWS_ALLOW_HTTP" -> (if (plainHttp) Some("true") else None),
      "AWS_VIRTUAL_HOSTED_STYLE_REQUEST" -> (if (pathStyle) Some("false") else None)
    ).collect { case (k, Some(v)) => k -> v }.toMap
  }
}
