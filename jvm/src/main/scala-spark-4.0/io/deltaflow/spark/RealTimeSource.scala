package io.deltaflow.spark

import org.apache.spark.sql.catalyst.streaming.WriteToStreamStatement
import org.apache.spark.sql.connector.read.{InputPartition, PartitionReaderFactory}
import org.apache.spark.sql.connector.read.streaming.Offset

/**
 * Spark 4.0 has no real-time mode (`SupportsRealTimeMode` came with Spark 4.1: see
 * `scala-spark-4.1+/.../RealTimeSource.scala`), so the Delta source is micro-batch only.
 */
trait RealTimeSupport { self: DeltaMicroBatchStream =>
  private[spark] def realTimeMode: Boolean = false

  private[spark] def stopRealTime(): Unit = ()

  private[spark] def realTimeReplay(start: Offset, end: Offset): Array[InputPartition] =
    throw new IllegalStateException("no real-time mode on Spark 4.0")

  private[spark] def realTimeReaderFactory(): PartitionReaderFactory =
    throw new IllegalStateException("no real-time mode on Spark 4.0")
}

/** What [[StreamTriggerCheck]] needs to know of a statement's trigger. */
object StreamTrigger {
  /** Spark 4.0's statement only says whether the trigger is continuous. */
  def continuous(w: WriteToStreamStatement): Option[String] =
    if (w.isContinuousTrigger) Some("ContinuousTrigger") else None

  /** Spark 4.0 has no real-time mode. */
  def realTime(w: WriteToStreamStatement): Boolean = false
}
