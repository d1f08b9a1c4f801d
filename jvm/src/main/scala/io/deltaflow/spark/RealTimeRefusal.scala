package io.deltaflow.spark

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.plans.logical.{Deduplicate, LogicalPlan}
import org.apache.spark.sql.deltaflow.RealTimeQueries

/**
 * What a real-time mode query into a Delta table may run, checked on the analysed query
 * when it starts ([[StreamTriggerCheck]]); the physical plan's check at each epoch
 * (`RealTimeQueries.notReplayable`) is the backstop for what analysis cannot see (a
 * source's partition count).
 *
 * The sink commits inside an epoch and stays exactly once by replaying the epoch row for
 * row. A stateless query does that; so does `dropDuplicates` (Spark >= 4.3) when its
 * shuffle has a single producer partition, with the state checkpoint format 2 (see
 * docs/realtime.md). Refused here: `dropDuplicates` over several streaming sources (a
 * union: their rows interleave in arrival order, which a replay does not repeat), with
 * checkpoint format 1, or before Spark 4.3; a repartition in front of it;
 * `dropDuplicatesWithinWatermark` (not in Spark 4.3's real-time mode).
 */
object RealTimeRefusal {
  val Alternative = "trigger(processingTime='1 second')"

  def message(uri: String, what: String, why: String = ""): String = {
    val reason = if (why.nonEmpty) why else "which only a stateless query, or dropDuplicates " +
      "reading a single source partition, does"
    s"A real-time mode stream into $uri runs $what: deltaflow's Delta sink commits inside " +
      s"each epoch and stays exactly once by replaying an epoch row for row, $reason. For " +
      s"exactly once into Delta, run this query with $Alternative (about 0.3-0.7 s end to " +
      "end). In real-time mode, Kafka and foreach sinks take it but deliver at least once."
  }

  /** Refuse (typed) a real-time query into `uri` whose analysed plan the sink cannot replay. */
  def check(session: SparkSession, uri: String, query: LogicalPlan): Unit = {
    def refuse(what: String, why: String = ""): Nothing =
      throw DeltaflowException.of("UnsupportedFeatureError", message(uri, what, why),
        Map("table_uri" -> uri, "feature" -> "realTimeSinkOperators", "operators" -> what,
          "alternative" -> Alternative))
    query.foreach { p =>
      p.nodeName match {
        case "DeduplicateWithinWatermark" =>
          refuse("dropDuplicatesWithinWatermark",
            "and Spark's real-time mode does not run dropDuplicatesWithinWatermark")
        case _ =>
      }
    }
    val dedups = query.collect { case d: Deduplicate if d.isStreaming => d }
    if (dedups.isEmpty) return
    val what = dedups.map(d => s"dropDuplicates(${d.keys.map(_.name).mkString(", ")})")
      .distinct.mkString(", ")
    if (!sparkAtLeast(4, 3))
      refuse(what, s"and Spark ${org.apache.spark.SPARK_VERSION} runs dropDuplicates in " +
        "real-time mode only from 4.3")
    val format = RealTimeQueries.explicitConf(session, RealTimeQueries.CheckpointFormat).map(_.trim)
    if (format.contains("1"))
      refuse(s"$what (checkpoint format v1)", s"which needs each epoch's own state checkpoint " +
        s"ids to replay it: set ${RealTimeQueries.CheckpointFormat} to 2 (real-time mode's default)")
    dedups.foreach { d =>
      val sources = d.child.collectLeaves().filter(_.isStreaming)
      if (sources.size > 1)
        refuse(what, s"but it reads ${sources.size} streaming sources into the shuffle " +
          "(a union): their rows reach dropDuplicates in a different order when an epoch " +
          "is replayed")
      d.child.foreach { p =>
        if (p.nodeName.startsWith("Repartition"))
          refuse(s"${p.nodeName} before $what", "but a repartition in front of dropDuplicates " +
            "gives its shuffle several producer partitions, whose rows interleave in a " +
            "different order when an epoch is replayed")
      }
      // One source, but how many partitions (a Kafka topic's) shows only in the physical
      // plan: the epoch's check refuses several. deltaflow's Delta source plans one.
    }
  }

  private def sparkAtLeast(major: Int, minor: Int): Boolean = {
    val parts = org.apache.spark.SPARK_VERSION.split("[.-]").take(2).map(_.toInt)
    parts(0) > major || (parts(0) == major && parts(1) >= minor)
  }
}
