package io.deltaflow.spark

import java.nio.charset.StandardCharsets
import java.util.Base64

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode

/**
 * A deltaflow error on the JVM side: `errorType` is the Python class's name
 * (`TableNotFoundError`, `ConcurrentWriteError`, ...), `fields` its structured fields.
 *
 * The message ends with the error's wire marker, `[deltaflow-error:<base64 JSON>]`, so
 * whatever wraps it on the way to the user (a `StreamingQueryException`, py4j, a JDBC
 * error) still carries it: `deltaflow.errors.typed_error(exc)` rebuilds the typed Python
 * error from any exception whose text holds one.
 */
class DeltaflowException(
    val errorType: String,
    val plainMessage: String,
    val fields: Map[String, String],
    wire: String)
  extends RuntimeException(s"$plainMessage $wire") {
  override def toString: String = s"deltaflow.$errorType: $getMessage"
}

object DeltaflowException {
  /** The exception for the error object of a bridge answer. */
  def fromAnswer(op: String, error: JsonNode): DeltaflowException = {
    val fields = Option(error.get("fields")).toSeq
      .flatMap(_.properties().asScala.map(e => e.getKey -> e.getValue.asText()))
      .toMap
    new DeltaflowException(
      error.path("type").asText("BridgeError"),
      error.path("message").asText(s"deltaflow's `$op` failed"),
      fields,
      error.path("wire").asText(""))
  }

  /** An error raised by the connector itself, with its wire marker. */
  def of(errorType: String, message: String, fields: Map[String, String]): DeltaflowException = {
    val payload = Brain.json.createObjectNode()
    payload.put("type", errorType)
    payload.put("message", message)
    val f = payload.putObject("fields")
    fields.foreach { case (k, v) => f.put(k, v) }
    val encoded = Base64.getEncoder.encodeToString(
      Brain.json.writeValueAsString(payload).getBytes(StandardCharsets.UTF_8))
    new DeltaflowException(errorType, message, fields, s"[deltaflow-error:$encoded]")
  }
}
