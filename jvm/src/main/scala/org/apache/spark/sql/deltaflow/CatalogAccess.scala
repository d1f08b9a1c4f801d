package org.apache.spark.sql.deltaflow

import org.apache.spark.sql.catalyst.catalog.CatalogTable
import org.apache.spark.sql.connector.catalog.{CatalogV2Util, Column, Table, V1Table}
import org.apache.spark.sql.types.StructType

/**
 * Spark-internal catalog types the connector's catalog needs (hence this package): the
 * session catalog's entry behind a table it loaded, and a column list as a schema.
 */
object CatalogAccess {
  /** The catalog entry of a table Spark's session catalog loaded, if it is one. */
  def entryOf(table: Table): Option[CatalogTable] = table match {
    case v1: V1Table => Some(v1.v1Table)
    case _ => None
  }

  def schemaOf(columns: Array[Column]): StructType = CatalogV2Util.v2ColumnsToStructType(columns)
}

