package io.deltaflow.spark

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.plans.logical.{AnalysisHelper, LogicalPlan}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.catalyst.streaming.{StreamingRelationV2, WriteToStreamStatement}
import org.apache.spark.sql.connector.catalog.Table

/**
 * Triggers a Delta stream cannot run with, refused when the query starts with a typed
 * error naming what to use instead:
 *
 *  - `trigger(continuous=...)` from or into a Delta table (`UnsupportedTriggerError`):
 *    deltaflow's source is not a `ContinuousStream` and its sink not a continuous write, and
 *    Spark's own failures there are untyped ("Unknown type of trigger:
 *    ContinuousTrigger(1000)") or come only after `start()` returned.
 *  - `trigger(realTime=...)` on a Delta source read by the Python data source (object
 *    stores, `deltaflow.read.nativeScan=false`): real-time mode takes only JVM sources
 *    (`RealTimeModeError`).
 *  - `trigger(realTime=...)` into `start(path)` (`RealTimeModeError`, `feature="startPath"`):
 *    a path runs through the V1 sink, which real-time mode cannot run; `toTable` runs the
 *    table's own real-time write.
 *
 * A real-time query over a table's change feed (`readChangeFeed`, which batch and
 * micro-batch reads take from the Python data source) gets the JVM's change feed source
 * instead ([[ChangeFeedTable]]): the stream's relation keeps its output attributes, so the
 * analysed query above it stays valid; the two schemas are checked equal first.
 *
 * A real-time query into a Delta table whose operators the sink cannot replay exactly once
 * (`dropDuplicates` over several sources, ...) is refused here ([[RealTimeRefusal]]).
 *
 * And one setting a real-time query into a Delta table needs is made here: Spark turns
 * asynchronous progress tracking on by default for a stateless real-time query and then
 * refuses any sink but its own. Its offset log written ahead of the epoch's end would also
 * break the sink's premise (an epoch replayed from the offsets it started at), so the
 * session's real-time default (`spark.sql.streaming.realTimeMode.
 * asyncProgressTrackingByDefault.enabled`) is set to false when a real-time query into
 * Delta starts and the user has not set it. Spark reads it right after this analysis, in
 * the same `start()`. An explicit `asyncProgressTrackingEnabled` option still wins.
 *
 * The statement that carries the trigger (`WriteToStreamStatement`) is resolved away by
 * Spark's first resolution rules, so this runs with the hint rules, which come before them.
 */
class StreamTriggerCheck(session: SparkSession) extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = {
    plan match {
      case w: WriteToStreamStatement if StreamTrigger.realTime(w) && w.sink.isInstanceOf[DeltaSink] =>
        val uri = w.sink.asInstanceOf[DeltaSink].path
        throw DeltaflowException.of("RealTimeModeError",
          s"A real-time mode stream into $uri was started with start(path), which runs " +
            "Spark's V1 sink: real-time mode cannot run it. Name the table instead: " +
            s"toTable(\"delta.`$uri`\"), or a catalog table (CREATE TABLE t USING delta " +
            s"LOCATION '$uri', then toTable(\"t\")).",
          Map("table_uri" -> uri, "feature" -> "startPath"))
      case w: WriteToStreamStatement if StreamTrigger.realTime(w) && w.sink.isInstanceOf[DeltaTable] =>
        RealTimeRefusal.check(session, w.sink.asInstanceOf[DeltaTable].info.uri, w.inputQuery)
        org.apache.spark.sql.deltaflow.RealTimeQueries.setUnlessSet(session,
          StreamTriggerCheck.AsyncByDefault, "false")
        return realTimeSource(w)
      case w: WriteToStreamStatement if StreamTrigger.continuous(w).isDefined =>
        val trigger = StreamTrigger.continuous(w).get
        val sink = deltaUri(w.sink).map(uri => (uri, "sink"))
        val source = w.inputQuery.collectFirst {
          case r: StreamingRelationV2 if deltaUri(r.table).isDefined => (deltaUri(r.table).get, "source")
        }
        sink.orElse(source).foreach { case (uri, role) =>
          throw DeltaflowException.of("UnsupportedTriggerError",
            s"The continuous trigger ($trigger) is not supported with a Delta $role " +
              s"($uri). For low latency use trigger(realTime=\"5 minutes\") (Spark's real-time " +
              "mode, Spark 4.1+; the duration is how often it checkpoints), or a " +
              "processingTime trigger.",
            Map("table_uri" -> uri, "trigger" -> trigger,
              "alternative" -> "trigger(realTime=...)"))
        }
      case w: WriteToStreamStatement if StreamTrigger.realTime(w) => return realTimeSource(w)
      case _ =>
    }
    plan
  }

  /** `w` with each change feed source on the JVM's reader; refused (typed) when a source
   *  is the Python data source's for another reason. */
  private def realTimeSource(w: WriteToStreamStatement): LogicalPlan = {
    val python = w.inputQuery.collect {
      case r: StreamingRelationV2 if r.table.isInstanceOf[LocatedPythonTable] => r
    }
    if (python.isEmpty) return w
    val swaps = python.map(r => r -> changeFeedTable(r)).toMap
    val rewritten = AnalysisHelper.allowInvokingTransformsInAnalyzer {
      w.inputQuery.transform { case r: StreamingRelationV2 if swaps.contains(r) =>
        r.copy(table = swaps(r))
      }
    }
    w.copy(inputQuery = rewritten)
  }

  private def changeFeedTable(r: StreamingRelationV2): ChangeFeedTable = {
    val info = r.table.asInstanceOf[LocatedPythonTable].info
    val feed = ChangeFeed.requested(r.extraOptions)
    if (feed && info.jvmChangeFeed) {
      val table = new ChangeFeedTable(info.copy(route = "jvm"))
      val (jvm, python) = (table.schema(), r.table.schema())
      if (jvm.fields.map(f => (f.name, f.dataType)).sameElements(python.fields.map(f => (f.name, f.dataType))))
        return table
      throw DeltaflowException.of("RealTimeModeError",
        s"The change feed of ${info.uri} in real-time mode: the JVM reader's schema " +
          s"(${jvm.simpleString}) differs from the feed's (${python.simpleString}), a " +
          "deltaflow bug; read the feed with a processingTime trigger meanwhile.",
        Map("table_uri" -> info.uri, "feature" -> "readChangeFeed"))
    }
    val feature = if (feed) "readChangeFeed" else "pythonDataSource"
    val why = if (info.routeReason.isEmpty) "" else s" (${info.routeReason})"
    throw DeltaflowException.of("RealTimeModeError",
      s"This Delta stream over ${info.uri} is read by deltaflow's Python data source$why, " +
        "which Spark's real-time mode cannot run. Read it with a processingTime or " +
        "availableNow trigger" + (if (info.routeReason.contains("://")) ", or from a store " +
          "Spark's Hadoop layer opens (S3A for s3://)." else "."),
      Map("table_uri" -> info.uri, "feature" -> feature))
  }

  private def deltaUri(table: Table): Option[String] = table match {
    case t: DeltaTable => Some(t.info.uri)
    case t: LocatedPythonTable => Some(t.info.uri)
    case s: DeltaSink => Some(s.path)
    case _ => None
  }
}

object StreamTriggerCheck {
  /** Spark's (4.1+) default for asynchronous progress tracking in real-time mode. */
  val AsyncByDefault = "spark.sql.streaming.realTimeMode.asyncProgressTrackingByDefault.enabled"
}
