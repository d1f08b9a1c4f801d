package org.apache.spark.sql.deltaflow

import org.apache.spark.sql.catalyst.catalog.CatalogTable
import org.apache.spark.sql.connector.catalog.{CatalogV2Util, Column, Table, V1Table}
import org.apache.spark.sql.types.{MetadataBuilder, StructType}

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

  /** The columns as a schema; an identity column's spec (which Spark leaves out of the
   *  field) goes into its metadata under Spark's `identity.*` keys. */
  def schemaOf(columns: Array[Column]): StructType = {
    val schema = CatalogV2Util.v2ColumnsToStructType(columns)
    StructType(schema.fields.zip(columns).map { case (field, column) =>
      Option(column.identityColumnSpec()) match {
        case Some(spec) =>
          val metadata = new MetadataBuilder().withMetadata(field.metadata)
            .putLong("identity.start", spec.getStart)
            .putLong("identity.step", spec.getStep)
            .putBoolean("identity.allowExplicitInsert", spec.isAllowExplicitInsert)
            .build()
          field.copy(metadata = metadata)
        case None => field
      }
    })
  }
}

