package io.deltaflow.spark

import java.nio.charset.StandardCharsets
import java.util.Base64

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.JsonNode

/**
 * A deltaflow error on the JVM side: `errorType` is the Python class's name
 * (`TableNotFoundError`, `ConcurrentWriteError`, ...), `fields` its structured fields.
 *
 * The message is the error's own text, then on a line of its own its wire marker,
 * `[deltaflow-error:<base64 JSON>]`: whatever wraps it on the way to the user (a
 * `StreamingQueryException`, py4j, a JDBC error) shows our text first and still carries
 * the marker, from which `deltaflow.typed_error(exc)` rebuilds the typed Python error.
 */
class DeltaflowException(
    val errorType: String,
    val plainMessage: String,
    val fields: Map[String, String],
    wire: String,
    cause: Throwable = null)
  extends RuntimeException(if (wire.isEmpty) plainMessage else s"$plainMessage\n$wire", cause) {
  override def toString: String = s"deltaflow.$errorType: $getMessage"
}

object DeltaflowException {
  private val Marker = """\[deltaflow-error:([A-Za-z0-9+/=]+)\]""".r

  /** The exception for the error object of a bridge answer. */
  def fromAnswer(op: String, error: JsonNode): DeltaflowException = {
    val fields = Option(error.get("fields")).toSeq
      .flatMap(_.properties().asScala.map(e => e.getKey -> text(e.getValue)))
      .toMap
    new DeltaflowException(
      error.path("type").asText("BridgeError"),
      error.path("message").asText(s"deltaflow's `$op` failed"),
      fields,
      error.path("wire").asText(""))
  }

  /** An error raised by the connector itself, with its wire marker; `numbers`: fields
   *  the Python error holds as integers (a version); `flags`: as booleans. */
  def of(errorType: String, message: String, fields: Map[String, String],
      numbers: Map[String, Long] = Map.empty,
      flags: Map[String, Boolean] = Map.empty): DeltaflowException = {
    val payload = Brain.json.createObjectNode()
    payload.put("type", errorType)
    payload.put("message", message)
    val f = payload.putObject("fields")
    fields.foreach { case (k, v) => f.put(k, v) }
    numbers.foreach { case (k, v) => f.put(k, v) }
    flags.foreach { case (k, v) => f.put(k, v) }
    val encoded = Base64.getEncoder.encodeToString(
      Brain.json.writeValueAsString(payload).getBytes(StandardCharsets.UTF_8))
    new DeltaflowException(errorType, message, fields, s"[deltaflow-error:$encoded]")
  }

  /**
   * The deltaflow error `e` carries: `e` itself, one of its causes, or one rebuilt from a
   * wire marker in a message along the chain (what a Python worker's deltaflow error
   * becomes on its way through Spark), with `e` as its cause.
   */
  def carried(e: Throwable): Option[DeltaflowException] = {
    var current = e
    var depth = 0
    while (current != null && depth < 32) {
      current match {
        case d: DeltaflowException => return Some(d)
        case _ =>
      }
      val found = Option(current.getMessage).flatMap(Marker.findFirstMatchIn).flatMap { m =>
        try {
          val payload = Brain.json.readTree(Base64.getDecoder.decode(m.group(1)))
          val fields = Option(payload.get("fields")).toSeq
            .flatMap(_.properties().asScala.map(p => p.getKey -> text(p.getValue))).toMap
          Some(new DeltaflowException(payload.path("type").asText("BridgeError"),
            payload.path("message").asText(""), fields, m.matched, e))
        } catch { case NonFatal(_) => None }
      }
      if (found.isDefined) return found
      current = current.getCause
      depth += 1
    }
    None
  }

  /** `body`, with a deltaflow error buried in what it throws raised as itself. */
  def surfaced[T](body: => T): T = {
    try body
    catch {
      case e: DeltaflowException => throw e
      case NonFatal(e) => throw carried(e).getOrElse(e)
    }
  }

  private def text(node: JsonNode): String = if (node.isValueNode) node.asText() else node.toString
}
