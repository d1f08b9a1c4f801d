package io.deltaflow.spark

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.catalyst.streaming.{StreamingRelationV2, WriteToStreamStatement}
import org.apache.spark.sql.connector.catalog.Table

/**
 * `trigger(continuous=...)` from or into a Delta table is refused when the query starts,
 * with a typed error naming `trigger(realTime=...)`: deltaflow's source is not a
 * `ContinuousStream` and its sink not a continuous write, and Spark's own failures there
 * are untyped ("Unknown type of trigger: ContinuousTrigger(1000)") or come only after
 * `start()` returned. The statement that carries the trigger (`WriteToStreamStatement`)
 * is resolved away by Spark's first resolution rules, so this runs with the hint rules,
 * which come before them.
 */
class ContinuousTriggerCheck extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = {
    plan match {
      case w: WriteToStreamStatement if ContinuousTrigger.of(w).isDefined =>
        val trigger = ContinuousTrigger.of(w).get
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
      case _ =>
    }
    plan
  }

  private def deltaUri(table: Table): Option[String] = table match {
    case t: DeltaTable => Some(t.info.uri)
    case s: DeltaSink => Some(s.path)
    case _ => None
  }
}
