package io.deltaflow.spark

/**
 * Spark 4.0 has no `SupportsV1OverwriteWithSaveAsTable` (Spark 4.1 added it: see
 * `scala-spark-4.1+/.../SaveAsTableOverwrite.scala`), so Spark never marks the plan of
 * `df.write.mode("overwrite").saveAsTable(t)`. The catalog then tells it from
 * `CREATE OR REPLACE TABLE ... AS SELECT` by the stack alone (`DataFrameWriter` calling),
 * which sees it in a classic session and under Spark 4.0's Connect planner (it runs
 * `saveAsTable` in place); a host that planned it and ran it later would replace the
 * table's metadata, as a REPLACE does.
 */
trait SaveAsTableOverwriteMarker

object SaveAsTableOverwrite {
  /** Spark 4.1's option name; no Spark 4.0 sets it. */
  val OptionName: String = "__v1_save_as_table_overwrite"

  /** Whether Spark marks `saveAsTable`'s overwrite on this version. */
  val markedBySpark: Boolean = false
}
