package io.deltaflow.spark

/**
 * Spark 4.0 has no `SupportsV1OverwriteWithSaveAsTable` (Spark 4.1 added it: see
 * `scala-spark-4.1+/.../SaveAsTableOverwrite.scala`), so Spark never marks the plan of
 * `df.write.mode("overwrite").saveAsTable(t)`. The catalog then tells it from
 * `CREATE OR REPLACE TABLE ... AS SELECT` by the stack alone (`DataFrameWriter` calling):
 * that works in a classic session; over Spark Connect the plan runs later, off that
 * stack, so there `saveAsTable`'s overwrite replaces the table's metadata (properties,
 * comment) as a REPLACE does.
 */
trait SaveAsTableOverwriteMarker

object SaveAsTableOverwrite {
  /** Spark 4.1's option name; no Spark 4.0 sets it. */
  val OptionName: String = "__v1_save_as_table_overwrite"

  /** Whether Spark marks `saveAsTable`'s overwrite on this version. */
  val markedBySpark: Boolean = false
}
