package org.apache.spark.sql.deltaflow

import java.util.{Properties, UUID}
import java.util.concurrent.ConcurrentHashMap

import org.apache.spark.SparkContext
import org.apache.spark.sql.SparkSession
import org.apache.spark.util.Utils

import io.deltaflow.spark.DeltaflowException

/**
 * The sessions lent to the brain for the requests it runs in them.
 *
 * A statement that needs the brain to work in its session (a DML statement, registering
 * the Python data source) lends the session for the length of one call: a token names it,
 * and the brain, through its gateway ([[BrainGateway]]), turns the token into the session
 * itself — a Connect client's isolated session, a Thrift connection's, the PySpark
 * driver's — with its temp views, current database and confs. The brain's thread then
 * runs as the statement's did: that session active, and the caller's local properties
 * (job group, Connect's job tags, scheduler pool, the SQL execution it is part of), so
 * cancelling the statement cancels the jobs the brain starts for it. Local properties
 * are Spark-internal, hence this package.
 */
object BrainSessions {
  private final case class Lent(session: SparkSession, properties: Properties)

  private val lent = new ConcurrentHashMap[String, Lent]()

  /** `body` with `session` lent under a token, which `body` passes to the brain. */
  def lend[T](session: SparkSession)(body: String => T): T = {
    val token = UUID.randomUUID().toString
    val properties = Utils.cloneProperties(session.sparkContext.getLocalProperties)
    lent.put(token, Lent(session, properties))
    try body(token) finally lent.remove(token)
  }

  /** Called by the brain on its thread: the session `token` names, made active there
   *  with the lending thread's local properties. */
  def enter(token: String): SparkSession = {
    val found = lent.get(token)
    if (found == null) {
      throw DeltaflowException.of("BridgeError",
        s"The session lent to deltaflow's brain under $token is no longer lent: the " +
          "statement that lent it ended (cancelled or timed out).",
        Map("operation" -> "session.enter"))
    }
    SparkSession.setActiveSession(found.session)
    found.session.sparkContext.setLocalProperties(Utils.cloneProperties(found.properties))
    found.session
  }

  /** Called by the brain when its request ends: its thread's session and properties
   *  cleared, so the next request on that thread starts clean. */
  def leave(): Unit = {
    SparkSession.clearActiveSession()
    SparkContext.getActive.foreach(_.setLocalProperties(new Properties()))
  }
}
