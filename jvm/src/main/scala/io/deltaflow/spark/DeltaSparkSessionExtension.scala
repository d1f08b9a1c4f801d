package io.deltaflow.spark

import org.apache.spark.sql.SparkSessionExtensions

import io.deltaflow.spark.catalog.{AlterTableRule, Metastore}
import io.deltaflow.spark.sql.{DeltaSqlParser, TableChanges}

/**
 * `spark.sql.extensions=io.deltaflow.spark.DeltaSparkSessionExtension`: what deltaflow adds to
 * a session's SQL, as delta-spark's `DeltaSparkSessionExtension` does for it. The SQL parser
 * learns Delta's own statements ([[DeltaSqlParser]]) and the `table_changes` functions
 * ([[TableChanges]]); everything else stays Spark's. Catalog reads honour `readChangeFeed`
 * and dynamic partition overwrites work ([[DeltaAnalysis]]); writes into a catalog table
 * evolve its schema under `mergeSchema` or autoMerge ([[WriteSchemaEvolution]]). ALTER TABLE forms Spark's
 * analysis would refuse for a Delta table go to its catalog ([[AlterTableRule]]). A
 * stream into a catalog table is checked when it starts ([[StreamWriteCheck]]), and a
 * continuous trigger from or into Delta refused ([[StreamTriggerCheck]]).
 * `deltaflow.spark_conf()` sets this and `spark.sql.catalog.spark_catalog` ([[DeltaCatalog]]).
 */
class DeltaSparkSessionExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    extensions.injectParser { (session, delegate) =>
      // Built with the session's state: `spark-sql` and `start-thriftserver.sh` open the
      // metastore right after that, before any catalog plugin loads.
      Metastore.checkAtHostStart(session)
      DeltaSqlParser(delegate)
    }
    TableChanges.functions.foreach(extensions.injectTableFunction)
    extensions.injectResolutionRule(session => new DeltaAnalysis(session))
    extensions.injectResolutionRule(session => new AlterTableRule(session))
    // Twice: before Resolution for the DataFrame API's writes, in it for SQL INSERT.
    extensions.injectHintResolutionRule(session => new WriteSchemaEvolution(session))
    extensions.injectResolutionRule(session => new WriteSchemaEvolution(session))
    extensions.injectCheckRule(_ => new StreamWriteCheck)
    extensions.injectHintResolutionRule(session => new StreamTriggerCheck(session))
  }
}
