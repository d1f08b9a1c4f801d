package io.deltaflow.spark

import java.io.{BufferedReader, BufferedWriter, InputStreamReader, OutputStreamWriter}
import java.nio.charset.StandardCharsets
import java.util.concurrent.{CompletableFuture, ConcurrentHashMap, TimeUnit}
import java.util.concurrent.atomic.AtomicLong

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import com.fasterxml.jackson.databind.node.ObjectNode

import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.deltaflow.{BrainGateway, BrainSessions, MissingFiles}

/**
 * The driver JVM's way into deltaflow's Python brain (the Delta log's rules).
 *
 * The JVM starts one long-lived Python process, `python -m deltaflow.spark.bridge._server`, and
 * talks to it over its stdin/stdout: one JSON object a line each way. A request is
 * `{"id": n, "op": "...", "args": {...}}`; its answer is `{"id": n, "result": ...}` or
 * `{"id": n, "error": {"type", "message", "wire"}}`. Requests are multiplexed: the
 * Python side answers each on its own thread, so one slow snapshot load never holds up
 * another query's planning. Every operation is listed in `deltaflow/spark/bridge/_server.py`.
 *
 * This works in every host Spark runs the connector in (a PySpark driver, the Connect
 * server, `spark-sql`, the Thrift server) because it needs nothing but a Python with
 * deltaflow installed: `spark.deltaflow.python` names it (`deltaflow.spark_conf()` sets
 * it), else `DELTAFLOW_PYTHON`, `PYSPARK_PYTHON`, then `python3`. If the process dies,
 * pending calls fail with a [[DeltaflowException]] and the next call starts a new one.
 *
 * The brain also reaches back into this JVM through a Py4J gateway ([[BrainGateway]]):
 * [[callInSession]] lends it the caller's Spark session for one request (a DML
 * statement runs there, in that session, with the code the `DeltaTable` API runs).
 */
object Brain extends Logging {
  val PythonConf = "spark.deltaflow.python"
  private val mapper = new ObjectMapper()
  // A planning call that takes longer than this is stuck, not slow.
  private val CallTimeoutSeconds = 600L
  @volatile private var current: BrainProcess = _

  def json: ObjectMapper = mapper

  def newArgs(): ObjectNode = mapper.createObjectNode()

  /** Call `op` with `args`; the result, or the deltaflow error the Python side raised. */
  def call(op: String, args: ObjectNode): JsonNode = {
    val process = ensure()
    process.call(op, args, Some(CallTimeoutSeconds))
  }

  /**
   * Call `op` with `session` lent to the brain (`args.session` names it): the brain runs
   * the request in that session, on the host's SparkContext. No time limit (a MERGE may
   * run for as long as its jobs do); a brain that dies fails the call.
   */
  def callInSession(op: String, args: ObjectNode, session: SparkSession): JsonNode =
    BrainSessions.lend(session) { token =>
      args.put("session", token)
      ensure().call(op, args, None)
    }

  private def ensure(): BrainProcess = {
    val existing = current
    if (existing != null && existing.alive && existing.generation == BrainGateway.generation) {
      existing
    } else synchronized {
      if (current == null || !current.alive || current.generation != BrainGateway.generation) {
        if (current != null) current.retire()
        current = new BrainProcess(pythonCommand())
      }
      current
    }
  }

  private def pythonCommand(): String = {
    val fromConf = Option(SparkEnv.get).flatMap(env => env.conf.getOption(PythonConf))
    fromConf
      .orElse(sys.env.get("DELTAFLOW_PYTHON"))
      .orElse(Option(SparkEnv.get).flatMap(_.conf.getOption("spark.pyspark.python")))
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .getOrElse("python3")
  }
}

private class BrainProcess(python: String) extends Logging {
  private val mapper = Brain.json
  val generation: Long = BrainGateway.generation
  private val gateway = BrainGateway.environment()
  private val nextId = new AtomicLong(1)
  private val pending = new ConcurrentHashMap[Long, CompletableFuture[JsonNode]]()
  @volatile private var failure: String = _

  private val process: Process = {
    val builder = new ProcessBuilder(python, "-u", "-m", "deltaflow.spark.bridge._server")
    builder.redirectError(ProcessBuilder.Redirect.INHERIT)
    builder.environment().putAll(gateway.asJava)
    builder.environment().putAll(HadoopStores.environment(builder.environment()).asJava)
    try builder.start()
    catch {
      case e: java.io.IOException =>
        throw DeltaflowException.of(
          "BridgeError",
          s"deltaflow's connector could not start its Python side `$python -m " +
            s"deltaflow.spark.bridge._server`: ${e.getMessage}. Set the Spark conf " +
            s"${Brain.PythonConf} to a Python that has deltaflow installed " +
            "(deltaflow.spark_conf() does).",
          Map("operation" -> "start"))
    }
  }
  private val out = new BufferedWriter(
    new OutputStreamWriter(process.getOutputStream, StandardCharsets.UTF_8))
  private val in = new BufferedReader(
    new InputStreamReader(process.getInputStream, StandardCharsets.UTF_8))

  private val readerThread = {
    val t = new Thread(() => readAnswers(), "deltaflow-brain-reader")
    t.setDaemon(true)
    t.start()
    t
  }

  def alive: Boolean = failure == null && process.isAlive

  /** Stop this process (its gateway is gone): closing stdin ends it. */
  def retire(): Unit = fail("retired: the Spark application it served ended")

  def call(op: String, args: com.fasterxml.jackson.databind.node.ObjectNode,
           timeoutSeconds: Option[Long]): JsonNode = {
    val id = nextId.getAndIncrement()
    val future = new CompletableFuture[JsonNode]()
    pending.put(id, future)
    val request = mapper.createObjectNode()
    request.put("id", id)
    request.put("op", op)
    request.set[JsonNode]("args", args)
    // Drained under the write lock, so a request written after another one's mark carries it
    // or follows the request that does (the brain drops them in the order it reads lines).
    def withStaleTables(): ObjectNode = {
      val stale = MissingFiles.drain()
      if (stale.nonEmpty) {
        val listed = request.putArray("staleSnapshots")
        stale.foreach(listed.add)
      }
      request
    }
    try {
      out.synchronized {
        out.write(mapper.writeValueAsString(withStaleTables()))
        out.write('\n')
        out.flush()
      }
    } catch {
      case e: java.io.IOException =>
        pending.remove(id)
        fail(s"writing to the Python side failed: ${e.getMessage}")
        throw died(op)
    }
    val answer = try timeoutSeconds match {
      case Some(limit) => future.get(limit, TimeUnit.SECONDS)
      case None => future.get()
    } catch {
      case _: java.util.concurrent.TimeoutException =>
        throw DeltaflowException.of("BridgeError",
          s"deltaflow's Python side did not answer `$op` within ${timeoutSeconds.getOrElse(0L)} s.",
          Map("operation" -> op))
      case e: java.util.concurrent.ExecutionException => throw e.getCause
    } finally {
      // Answered, timed out, or the caller was interrupted (a cancelled statement): the
      // entry goes either way, so an answer that comes late finds nothing to complete.
      pending.remove(id)
    }
    if (answer.has("error")) throw DeltaflowException.fromAnswer(op, answer.get("error"))
    answer.get("result")
  }

  private def died(op: String): DeltaflowException = DeltaflowException.of("BridgeError",
    s"deltaflow's Python side stopped while answering `$op`: $failure. Its output above " +
      "(the driver's stderr) says why; the next call starts it again.",
    Map("operation" -> op))

  private def readAnswers(): Unit = {
    try {
      var line = in.readLine()
      while (line != null) {
        val answer = mapper.readTree(line)
        val future = pending.remove(answer.get("id").asLong())
        if (future != null) future.complete(answer)
        line = in.readLine()
      }
      fail(s"the process exited (code ${process.waitFor()})")
    } catch {
      case e: Exception => fail(s"reading its answers failed: $e")
    }
  }

  private def fail(reason: String): Unit = {
    if (failure == null) failure = reason
    process.destroy()
    for (id <- pending.keySet().asScala.toList) {
      val future = pending.remove(id)
      if (future != null) future.completeExceptionally(died("a pending call"))
    }
  }
}
