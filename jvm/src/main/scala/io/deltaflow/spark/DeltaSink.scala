package io.deltaflow.spark

import org.apache.spark.internal.Logging
import org.apache.spark.sql.{DataFrame, SaveMode}
import org.apache.spark.sql.execution.streaming.Sink
import org.apache.spark.sql.streaming.OutputMode

/**
 * `df.writeStream.format("delta").start(path)`: one Delta commit per micro-batch, exactly
 * once per `(query id, batch id)`.
 *
 * Each batch is written like a batch write ([[DeltaBatchWrite]]: the brain plans, Spark's
 * Parquet writer writes into staging, one commit) with the app transaction
 * `txnAppId = query id` (stable across restarts: Spark keeps it in the checkpoint),
 * `txnVersion = batch id`, and the batch recorded in the commit's info. Delivery: Spark
 * replays the last batch after a crash; the brain finds its transaction in the log and
 * nothing is written, and the replayed batch still runs, into Spark's `noop` sink, so a
 * stateful query's state stores commit it. Files of an attempt that died before its
 * commit are never referenced (VACUUM removes them). Output mode complete overwrites.
 */
class DeltaSink(parameters: Map[String, String], partitionColumns: Seq[String],
    outputMode: OutputMode) extends Sink with Logging {

  private val path = parameters.getOrElse("path", throw DeltaflowException.of(
    "InvalidOptionError",
    "writeStream.format('delta') needs a table location: .start('/path/to/table') or " +
      ".toTable(name).", Map("option" -> "path")))
  // Stream settings, not write options of the table.
  private val streamOnly = Set("checkpointlocation", "queryname", "path")

  override def addBatch(batchId: Long, data: DataFrame): Unit = {
    val queryId = data.sparkSession.sparkContext.getLocalProperty(QueryIdKey)
    val batch = org.apache.spark.sql.deltaflow.MicroBatches.asBatch(data)
    val options = parameters.filter { case (k, _) => !streamOnly.contains(k.toLowerCase) } ++
      Map("path" -> path, "txnAppId" -> queryId, "txnVersion" -> batchId.toString) ++
      (if (partitionColumns.isEmpty) Map.empty else Map("partitionBy" -> partitionColumns.mkString(",")))
    val mode = if (outputMode == OutputMode.Complete()) SaveMode.Overwrite else SaveMode.Append
    val route = DeltaBatchWrite.save(batch, mode, options, Some((queryId, batchId)))
    if (route == "skip") {
      logInfo(s"deltaflow stream batch $batchId to $path is in the log already: not written")
      batch.write.format("noop").mode("overwrite").save()
    }
  }

  override def toString: String = s"DeltaSink[$path]"

  private val QueryIdKey = "sql.streaming.queryId"
}
