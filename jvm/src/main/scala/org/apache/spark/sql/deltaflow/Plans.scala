package org.apache.spark.sql.deltaflow

import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.classic.{Dataset => ClassicDataset, SparkSession => ClassicSession}

/** A logical plan as a DataFrame (Spark-internal, hence this package): how a command
 *  runs a plan it holds, e.g. a DML statement deltaflow hands back to Spark. */
object Plans {
  def ofRows(session: SparkSession, plan: LogicalPlan): DataFrame =
    ClassicDataset.ofRows(session.asInstanceOf[ClassicSession], plan)
}
