package io.deltaflow.spark

import org.apache.hadoop.fs.Path

object RealTimePoll {
  /** How often an idle real-time reader stats the next commit file of the table at `uri`
   *  (`realTimePollIntervalMs` when the query does not give it): a commit waits half of
   *  this on average before its rows flow. A stat of a local file costs microseconds (500
   *  a second are ~1% of a core); on any other store it is a request (a HEAD on an object
   *  store, billed per thousand), so those poll less often. */
  def defaultMs(uri: String): Long =
    if (Option(new Path(uri).toUri.getScheme).forall(_ == "file")) LocalMs else RemoteMs

  val LocalMs: Long = 2L
  val RemoteMs: Long = 10L
}
