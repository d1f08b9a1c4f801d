package org.apache.spark.sql.deltaflow

import java.util.concurrent.ConcurrentHashMap

/**
 * A real-time source tells the sink writer of its own task when it has handed on every row
 * it holds and now waits for the table's next commit (`idle = true`), and when rows come
 * again (`idle = false`). deltaflow's Delta source says it; the Delta sink's
 * [[RealTimeWriter]] listens under its task attempt's id, since a stateless query runs
 * source and sink in one task. Told idle, the writer hands its roll over at once, not
 * [[RealTimeCommits.GraceMs]] after its first row: the source's burst (a commit's files)
 * is known to be whole. A source that says nothing (Kafka) and a sink behind a shuffle
 * (another task) keep the grace: the signal only ever shortens that wait.
 */
object RealTimeIdle {
  private val listeners = new ConcurrentHashMap[java.lang.Long, Boolean => Unit]()

  def listen(taskAttempt: Long, listener: Boolean => Unit): Unit =
    listeners.put(taskAttempt, listener)

  def forget(taskAttempt: Long): Unit = listeners.remove(taskAttempt)

  /** From the source's thread, when its state changes; nothing when no writer listens. */
  def say(taskAttempt: Long, idle: Boolean): Unit = {
    val listener = listeners.get(taskAttempt)
    if (listener != null) listener(idle)
  }

  /** When a writer's roll may be handed over: `grace` after its first row unless the source
   *  is idle, and never before the driver's next group may start (`nextDue`); all times on
   *  one clock and in one unit. */
  def handOverDue(firstRow: Long, grace: Long, nextDue: Long, sourceIdle: Boolean): Long =
    if (sourceIdle) nextDue else math.max(firstRow + grace, nextDue)
}
