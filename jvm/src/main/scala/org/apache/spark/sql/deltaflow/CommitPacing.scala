package org.apache.spark.sql.deltaflow

/**
 * When the next group of a query's real-time commits may start: a token bucket (the
 * generic cell rate algorithm) that refills one commit per `intervalMs` and holds
 * [[CommitPacing.Burst]]. Over any span of `t` ms the query commits at most
 * `t / intervalMs + Burst` times, as with a fixed spacing, but a burst of rows that lands
 * soon after an earlier commit goes at once when the query has been slower than its cap,
 * which is the usual case behind a Delta source whose commits come about an interval apart
 * (a fixed spacing made such a burst wait out the rest of the interval: that wait was the
 * tail of the latency). Not thread-safe: the endpoint calls it under its lock.
 */
final class CommitPacing(intervalMs: Long) {
  // The earliest time a group could start if the bucket were empty ("theoretical arrival
  // time"); a full bucket is any value up to `now`.
  private var due = 0L

  /** The earliest time (ms) the next group may start. */
  def nextStart: Long = due - (CommitPacing.Burst - 1) * intervalMs

  /** A group started at `now` (ms): it takes one commit from the bucket. */
  def start(now: Long): Unit = due = math.max(due, now) + intervalMs
}

object CommitPacing {
  /** Commits the query may make back to back after a quiet spell. */
  val Burst = 3
}
