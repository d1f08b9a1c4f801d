package io.deltaflow.spark.catalog

import org.apache.spark.sql.connector.catalog.TableChange

import io.deltaflow.spark.DeltaflowException

/**
 * `ALTER TABLE` on a Delta table: the changes Spark parsed, applied to the Delta log by
 * the brain in one metadata commit, or refused with a typed error. Never a catalog-only
 * change: the log is the table.
 */
object AlterTable {
  /** Apply `changes` to the Delta table at `uri` (`name` is how the user named it). */
  def apply(uri: String, name: String, changes: Seq[TableChange]): Unit = {
    throw DeltaflowException.of("UnsupportedFeatureError",
      s"ALTER TABLE $name is not supported by deltaflow yet: it would change only the " +
        "catalog, not the Delta log.",
      Map("table_uri" -> uri, "feature" -> "alterTable"))
  }
}
