package deltaflow.bench

import java.io.{BufferedWriter, FileWriter}
import java.util.UUID

import org.apache.spark.sql.{ForeachWriter, Row}

/** A JVM foreach sink for the real-time latency benchmark: each row's first column
 *  (`seq`) and the wall clock (ms) it reached the sink, a line each, flushed per row.
 *  (Python's foreach sink hands rows to its worker in growing batches, which would
 *  measure the batching, not the stream.) */
class LatencyWriter(dir: String) extends ForeachWriter[Row] {
  @transient private var out: BufferedWriter = _

  override def open(partitionId: Long, epochId: Long): Boolean = {
    out = new BufferedWriter(new FileWriter(s"$dir/$epochId-$partitionId-${UUID.randomUUID()}.txt"))
    true
  }

  override def process(row: Row): Unit = {
    out.write(s"${row.getLong(0)} ${System.currentTimeMillis()}\n")
    out.flush()
  }

  override def close(error: Throwable): Unit = if (out != null) out.close()
}
