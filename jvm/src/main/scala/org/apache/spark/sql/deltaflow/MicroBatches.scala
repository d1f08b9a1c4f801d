package org.apache.spark.sql.deltaflow

import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.classic.{Dataset => ClassicDataset}
import org.apache.spark.sql.execution.LogicalRDD

/**
 * The one place deltaflow's connector uses a Spark-internal API (hence this package):
 * a sink's micro-batch as a plain batch DataFrame, exactly as Spark's own
 * `ForeachBatchSink` makes it. The incremental plan runs once, as Spark planned it (with
 * its state stores), and the writer's own operators go on top; re-planning the micro-batch
 * itself would run stateful operators without their state.
 */
object MicroBatches {
  def asBatch(data: DataFrame): DataFrame = {
    val ds = data.asInstanceOf[ClassicDataset[_]]
    val node = LogicalRDD.fromDataset(ds.queryExecution.toRdd, ds, isStreaming = false)
    ClassicDataset.ofRows(ds.sparkSession, node)
  }
}
