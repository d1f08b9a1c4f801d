package io.deltaflow.spark

import org.apache.spark.sql.SparkSessionExtensions

import io.deltaflow.spark.catalog.AlterTableRule
import io.deltaflow.spark.sql.{DeltaSqlParser, TableChanges}

/**
 * `spark.sql.extensions=io.deltaflow.spark.DeltaSparkSessionExtension`: what deltaflow adds to
 * a session's SQL, as delta-spark's `DeltaSparkSessionExtension` does for it. The SQL parser
 * learns Delta's own statements ([[DeltaSqlParser]]) and the `table_changes` functions
 * ([[TableChanges]]); everything else stays Spark's. Catalog reads honour `readChangeFeed`
 * and dynamic partition overwrites work ([[DeltaAnalysis]]). ALTER TABLE forms Spark's
 * analysis would refuse for a Delta table go to its catalog ([[AlterTableRule]]).
 * `deltaflow.spark_conf()` sets this and `spark.sql.catalog.spark_catalog` ([[DeltaCatalog]]).
 */
class DeltaSparkSessionExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    extensions.injectParser((_, delegate) => DeltaSqlParser(delegate))
    TableChanges.functions.foreach(extensions.injectTableFunction)
    extensions.injectResolutionRule(session => new DeltaAnalysis(session))
    extensions.injectResolutionRule(session => new AlterTableRule(session))
  }
}
