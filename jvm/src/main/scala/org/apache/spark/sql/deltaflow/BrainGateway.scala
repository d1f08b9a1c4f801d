package org.apache.spark.sql.deltaflow

import scala.util.control.NonFatal

import org.apache.spark.{SparkConf, SparkContext, SparkEnv}
import org.apache.spark.api.python.Py4JServer
import org.apache.spark.internal.Logging
import org.apache.spark.scheduler.{SparkListener, SparkListenerApplicationEnd}

/**
 * The brain's way into this JVM: a Py4J gateway, as `spark-submit` gives a Python app.
 *
 * Spark's own `Py4JServer` (what a PySpark driver talks to; `private[spark]`, hence this
 * package), bound to the loopback address with a random secret, started the first time a
 * brain process is started, and stopped when the application ends. The brain receives
 * its port and secret in `PYSPARK_GATEWAY_PORT` / `PYSPARK_GATEWAY_SECRET`, the variables
 * pyspark's `launch_gateway` reads, and builds a PySpark context on the host's running
 * `SparkContext` from them (`deltaflow/spark/bridge/_host.py`). A restarted brain connects
 * to the same server again. Whoever holds the secret can run anything in this JVM, like
 * a PySpark driver's gateway: it goes only to the brain's environment, readable by this
 * user alone.
 */
object BrainGateway extends Logging {
  @volatile private var server: Py4JServer = _
  @volatile private var failure: String = _
  // Bumped when the server stops: a brain started with the old port is retired (Brain).
  @volatile var generation: Long = 0L

  /** The environment a brain process needs to reach this JVM (empty when the gateway
   *  could not start: the brain then refuses what needs a session, naming [[failure]]). */
  def environment(): Map[String, String] = synchronized {
    if (server == null && failure == null) start()
    if (server == null) Map("DELTAFLOW_GATEWAY_FAILURE" -> failure)
    else Map(
      "PYSPARK_GATEWAY_PORT" -> server.getListeningPort.toString,
      "PYSPARK_GATEWAY_SECRET" -> server.secret,
      // The brain talks the protocol this server speaks (Py4JServer reads the same variable).
      "PYSPARK_PIN_THREAD" -> sys.env.getOrElse("PYSPARK_PIN_THREAD", "true"))
  }

  /** The host's running SparkContext, for the brain (never a new one). */
  def sparkContext(): SparkContext = SparkContext.getActive.getOrElse {
    throw new IllegalStateException("deltaflow's brain asked for the SparkContext, and " +
      "this JVM has none running (it stopped, or has not started yet).")
  }

  private def start(): Unit = {
    try {
      val conf = Option(SparkEnv.get).map(_.conf).getOrElse(new SparkConf())
      val started = new Py4JServer(conf)
      started.start()
      server = started
      SparkContext.getActive.foreach(_.addSparkListener(new SparkListener {
        override def onApplicationEnd(end: SparkListenerApplicationEnd): Unit = stop()
      }))
    } catch {
      case NonFatal(e) =>
        failure = s"its Py4J gateway did not start: $e"
        logWarning(s"deltaflow: the brain's Py4J gateway did not start", e)
    }
  }

  private def stop(): Unit = synchronized {
    if (server != null) {
      try server.shutdown()
      catch { case NonFatal(e) => logWarning("deltaflow: stopping the brain's gateway", e) }
      server = null
      generation += 1
    }
  }
}
