package io.deltaflow.spark

import org.apache.spark.sql.SparkSession

/**
 * delta-spark's session defaults for new tables: `spark.databricks.delta.properties.defaults.X`
 * is table property `delta.X` of every table created in the session, unless the statement
 * or write sets it.
 */
object TableDefaults {
  val Prefix = "spark.databricks.delta.properties.defaults."

  def of(session: SparkSession): Map[String, String] =
    session.conf.getAll.collect {
      case (key, value) if key.startsWith(Prefix) => "delta." + key.stripPrefix(Prefix) -> value
    }

  /** [[of]] as one string for a py4j caller (one round trip): `key\u0001value` pairs
   *  joined by `\u0000`. */
  def joined(session: SparkSession): String =
    of(session).map { case (k, v) => k + "\u0001" + v }.mkString("\u0000")

  /** `properties` with the session's defaults for the keys it does not set. */
  def applyTo(properties: Map[String, String], session: SparkSession): Map[String, String] = {
    val set = properties.keys.map(_.toLowerCase).toSet
    of(session).filter { case (k, _) => !set.contains(k.toLowerCase) } ++ properties
  }
}
