package io.deltaflow.spark

import org.apache.spark.sql.connector.catalog.SupportsV1OverwriteWithSaveAsTable

/**
 * Spark 4.1+ (SPARK-54462): a `TableProvider` with `SupportsV1OverwriteWithSaveAsTable`
 * gets the write option [[SaveAsTableOverwrite.OptionName]] on the plan of
 * `df.write.mode("overwrite").saveAsTable(t)`, wherever it was planned (classic or Spark
 * Connect), so the catalog keeps the table's metadata, as delta-spark's V1 writer does.
 * Spark 4.0 has no such interface: see `scala-spark-4.0/.../SaveAsTableOverwrite.scala`.
 */
trait SaveAsTableOverwriteMarker extends SupportsV1OverwriteWithSaveAsTable

object SaveAsTableOverwrite {
  /** The write option Spark sets on `saveAsTable`'s overwrite. */
  val OptionName: String = SupportsV1OverwriteWithSaveAsTable.OPTION_NAME

  /** Whether Spark marks `saveAsTable`'s overwrite on this version. */
  val markedBySpark: Boolean = true
}
