package org.apache.spark.sql.deltaflow

import org.apache.arrow.vector.types.pojo.Schema

import org.apache.spark.sql.types.{DataType, StructType}
import org.apache.spark.sql.util.ArrowUtils

/** Spark's Arrow type mapping (private to `org.apache.spark.sql`), for the row log's
 *  reader: a frame's schema as the Spark schema it encodes. */
object RowLogArrow {
  def sparkSchema(schema: Schema): StructType = ArrowUtils.fromArrowSchema(schema)

  /** `t` with every nested field nullable: what two schemas are compared by. */
  def nullable(t: DataType): DataType = t.asNullable
}
