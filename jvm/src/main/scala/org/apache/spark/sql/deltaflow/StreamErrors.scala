package org.apache.spark.sql.deltaflow

import java.nio.charset.StandardCharsets
import java.util.UUID
import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.hadoop.fs.Path

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.streaming.StreamingQueryListener

/**
 * A streaming query's last failure, kept beside its checkpoint
 * (`<checkpoint>/_deltaflow/last_error.json`: query id, run id, time, error class and
 * message), where the console (and anyone reading the checkpoint) finds it after the
 * driver is gone: Spark keeps it only in the failed query object. In this package for
 * the query's resolved checkpoint root, which Spark does not make public. The query
 * wrapper that holds it moved package in Spark 4.1 (`execution.streaming.runtime`), so it
 * is reached by its methods' names, the same in every Spark 4.x.
 */
class StreamErrors(session: SparkSession) extends StreamingQueryListener with Logging {
  private val roots = new ConcurrentHashMap[UUID, String]()

  override def onQueryStarted(event: StreamingQueryListener.QueryStartedEvent): Unit =
    try {
      Option(session.streams.get(event.id)).flatMap(StreamErrors.checkpointRoot).foreach {
        root => roots.put(event.id, root)
      }
    } catch {
      case NonFatal(e) => logWarning(s"deltaflow: no checkpoint root for query ${event.id}", e)
    }

  override def onQueryProgress(event: StreamingQueryListener.QueryProgressEvent): Unit = ()

  override def onQueryIdle(event: StreamingQueryListener.QueryIdleEvent): Unit = ()

  override def onQueryTerminated(event: StreamingQueryListener.QueryTerminatedEvent): Unit = {
    val root = Option(roots.remove(event.id))
    for (r <- root; error <- event.exception) {
      try write(r, event, error)
      catch {
        case NonFatal(e) => logWarning(s"deltaflow: could not record query ${event.id}'s error", e)
      }
    }
  }

  private def write(
      root: String, event: StreamingQueryListener.QueryTerminatedEvent, error: String): Unit = {
    val record = StreamErrors.Json.createObjectNode()
    record.put("id", event.id.toString)
    record.put("runId", event.runId.toString)
    record.put("timestamp", System.currentTimeMillis())
    event.errorClassOnException.foreach(record.put("errorClass", _))
    record.put("message", error.take(StreamErrors.MaxChars))
    val folder = new Path(root, "_deltaflow")
    val fs = folder.getFileSystem(session.sessionState.newHadoopConf())
    fs.mkdirs(folder)
    val temp = new Path(folder, s".last_error-${UUID.randomUUID()}.tmp")
    val out = fs.create(temp, true)
    try out.write(StreamErrors.Json.writeValueAsString(record).getBytes(StandardCharsets.UTF_8))
    finally out.close()
    val target = new Path(folder, "last_error.json")
    fs.delete(target, false)
    if (!fs.rename(temp, target)) fs.delete(temp, false)
  }
}

object StreamErrors {
  private val Json = new ObjectMapper()
  private val MaxChars = 20000
  private val installed = ConcurrentHashMap.newKeySet[SparkSession]()

  /** The resolved checkpoint root of `query` (a `StreamingQueryWrapper` around a
   *  `StreamExecution`), or None for a query of another kind. */
  private def checkpointRoot(query: AnyRef): Option[String] =
    if (query.getClass.getSimpleName != "StreamingQueryWrapper") None
    else {
      val execution = query.getClass.getMethod("streamingQuery").invoke(query)
      Option(execution.getClass.getMethod("resolvedCheckpointRoot").invoke(execution))
        .map(_.toString)
    }

  /** Adds the recorder to `session`'s streaming queries, once per session. */
  def install(session: SparkSession): Unit =
    if (installed.add(session)) session.streams.addListener(new StreamErrors(session))
}
