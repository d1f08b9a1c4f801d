package io.deltaflow.spark

import scala.jdk.CollectionConverters._

import org.apache.spark.internal.Logging
import org.apache.spark.sql.{DataFrame, SaveMode, SparkSession}
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
 *
 * `appId`: the app transaction's id instead of the query id (a pipeline flow's identity,
 * which its foreachBatch writes use too, so either way a batch is written once); the
 * commit's info still names the query, which progress tracking pairs batches by.
 *
 * Output mode update appends, as append does: [[StreamWriteCheck]] refuses it at
 * `start()` for a query with per-key state (an aggregation), whose update rows would be
 * duplicates in the table.
 */
class DeltaSink(private[spark] val path: String, writeOptions: Map[String, String], partitionColumns: Seq[String],
    outputMode: OutputMode, appId: Option[String] = None) extends Sink with Logging {

  override def addBatch(batchId: Long, data: DataFrame): Unit = {
    val queryId = data.sparkSession.sparkContext.getLocalProperty(QueryIdKey)
    val txnAppId = appId.getOrElse(queryId)
    val batch = org.apache.spark.sql.deltaflow.MicroBatches.asBatch(data)
    val options = writeOptions ++
      Map("path" -> path, "txnAppId" -> txnAppId, "txnVersion" -> batchId.toString) ++
      (if (partitionColumns.isEmpty) Map.empty else Map("partitionBy" -> partitionColumns.mkString(",")))
    val mode = if (outputMode == OutputMode.Complete()) SaveMode.Overwrite else SaveMode.Append
    val route = DeltaBatchWrite.save(batch, mode, options, Some((txnAppId, batchId, queryId)))
    if (route == "skip") {
      logInfo(s"deltaflow stream batch $batchId to $path is in the log already: not written")
      batch.write.format("noop").mode("overwrite").save()
    }
  }

  override def toString: String = s"DeltaSink[$path]"

  private val QueryIdKey = "sql.streaming.queryId"
}

object DeltaSink {
  private val CheckpointConf = "spark.sql.streaming.checkpointLocation"

  /**
   * The sink for `createSink`, which Spark calls inside `start()`: the brain checks the
   * stream's settings there (`sink.check`: output mode, checkpoint location, write
   * options, the target path), so a wrong one fails `start()` with a typed error instead
   * of the query's first batch.
   */
  def create(session: SparkSession, parameters: Map[String, String],
      partitionColumns: Seq[String], outputMode: OutputMode): DeltaSink = {
    val args = Brain.newArgs()
    val opts = args.putObject("options")
    parameters.foreach { case (k, v) => opts.put(k, v) }
    args.put("outputMode", outputMode.toString)
    val checkpoint = parameters.collectFirst {
      case (k, v) if k.equalsIgnoreCase("checkpointLocation") => v
    }.orElse(session.conf.getOption(CheckpointConf))
    checkpoint.foreach(args.put("checkpointLocation", _))
    val columns = args.putArray("partitionColumns")
    partitionColumns.foreach(columns.add)
    val checked = Brain.call("sink.check", args)
    val writeOptions = checked.get("writeOptions").properties().asScala
      .map(e => e.getKey -> e.getValue.asText()).toMap
    val appId = Option(checked.get("appId")).filterNot(_.isNull).map(_.asText())
    new DeltaSink(checked.get("path").asText(), writeOptions, partitionColumns, outputMode, appId)
  }
}
