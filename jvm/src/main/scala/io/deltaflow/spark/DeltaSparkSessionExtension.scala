package io.deltaflow.spark

import org.apache.spark.sql.SparkSessionExtensions

import io.deltaflow.spark.sql.DeltaSqlParser

/**
 * `spark.sql.extensions=io.deltaflow.spark.DeltaSparkSessionExtension`: what deltaflow adds to
 * a session's SQL, as delta-spark's `DeltaSparkSessionExtension` does for it. The SQL parser
 * learns Delta's own statements ([[DeltaSqlParser]]); everything else stays Spark's. Catalog
 * reads honour `readChangeFeed` and dynamic partition overwrites work ([[DeltaAnalysis]]).
 * `deltaflow.spark_conf()` sets this and `spark.sql.catalog.spark_catalog` ([[DeltaCatalog]]).
 */
class DeltaSparkSessionExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    extensions.injectParser((_, delegate) => new DeltaSqlParser(delegate))
    extensions.injectResolutionRule(session => new DeltaAnalysis(session))
  }
}
