package io.deltaflow.spark

import org.apache.hadoop.fs.Path

object RealTimePoll {
  /** How often an idle real-time reader stats the next commit file of the table at `uri`
   *  (`realTimePollIntervalMs` when the query does not give it): a commit waits half of
   *  this on average before its rows flow. A stat of a local file costs microseconds (500
   *  a second are ~1% of a core); on any other store it is a request (a HEAD on an object
   *  store, billed per thousand), so those poll less often. */
  def defaultMs(uri: String): Long = if (isLocal(uri)) LocalMs else RemoteMs

  def isLocal(uri: String): Boolean = Option(new Path(uri).toUri.getScheme).forall(_ == "file")

  /** Hadoop settings for the files a real-time reader opens on the table at `uri`, unless
   *  the session's Hadoop configuration sets them itself. On a local table: no vectored
   *  IO. A commit's file is small, one range, so parquet's vectored read buys nothing there,
   *  and Hadoop's local stream serves it through an asynchronous channel, a hand-off to a
   *  pool thread and back (measured: open p50 -16%, p90 -43%; docs/notes/rtm-open.md §4).
   *  On an object store the initial snapshot's large files gain from vectored reads. */
  def readerConf(uri: String, session: org.apache.hadoop.conf.Configuration): Map[String, String] =
    if (isLocal(uri) && session.get(VectoredIo) == null) Map(VectoredIo -> "false") else Map.empty

  val VectoredIo = "parquet.hadoop.vectored.io.enabled"

  val LocalMs: Long = 2L
  val RemoteMs: Long = 10L
}
