package org.apache.spark.sql.deltaflow

import scala.jdk.CollectionConverters._
import scala.util.Try

import org.apache.spark.sql.catalyst.analysis.NamespaceAlreadyExistsException
import org.apache.spark.sql.catalyst.catalog.{CatalogTable, CatalogUtils}
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.catalog.{CatalogPlugin, CatalogV2Util, Column, Identifier, LookupCatalog, SupportsNamespaces, Table, TableCatalog, V1Table}
import org.apache.spark.sql.types.{MetadataBuilder, StructType}
import org.apache.spark.util.Utils

/**
 * Spark-internal catalog types the connector's catalog needs (hence this package): the
 * session catalog's entry behind a table it loaded, a column list as a schema, and what
 * Spark's `CREATE TABLE` / `CREATE DATABASE` hand a catalog.
 */
object CatalogAccess {
  // The key Spark 4.1+'s CatalogV2Util gives a V2 column's generation expression
  // (catalog/_columns.py turns it into Delta's `delta.generationExpression`).
  private val GenerationKey = "GENERATION_EXPRESSION"

  /** The catalog entry of a table Spark's session catalog loaded, if it is one. */
  def entryOf(table: Table): Option[CatalogTable] = table match {
    case v1: V1Table => Some(v1.v1Table)
    case _ => None
  }

  /** The columns as a schema; an identity column's spec (which Spark leaves out of the
   *  field) goes into its metadata under Spark's `identity.*` keys, and a generated
   *  column's expression under `GENERATION_EXPRESSION` (Spark 4.1+ puts it there itself;
   *  4.0's `v2ColumnsToStructType` leaves it out). */
  def schemaOf(columns: Array[Column]): StructType = {
    val schema = CatalogV2Util.v2ColumnsToStructType(columns)
    StructType(schema.fields.zip(columns).map { case (withoutGeneration, column) =>
      val field = Option(column.generationExpression())
        .filterNot(_ => withoutGeneration.metadata.contains(GenerationKey))
        .map(expression => withoutGeneration.copy(metadata = new MetadataBuilder()
          .withMetadata(withoutGeneration.metadata).putString(GenerationKey, expression).build()))
        .getOrElse(withoutGeneration)
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

  /** The table a write names (`writeTo(t)`), loaded as Spark's name resolution would load
   *  it (current catalog and namespace); None for a temporary view or a missing table. */
  def loadWriteTarget(
      session: SparkSession, parts: Seq[String]): Option[(TableCatalog, Identifier, Table)] = {
    if (session.sessionState.catalog.isTempView(parts)) return None
    val lookup = new LookupCatalog {
      override protected val catalogManager = session.sessionState.catalogManager
    }
    import lookup._
    parts match {
      case CatalogAndIdentifier(catalog: TableCatalog, ident) =>
        Try(catalog.loadTable(ident)).toOption.map(table => (catalog, ident, table))
      case _ => None
    }
  }

  /** The session's `spark_catalog` plugin (deltaflow's catalog when configured). */
  def sessionCatalogPlugin(session: SparkSession): CatalogPlugin =
    session.sessionState.catalogManager.v2SessionCatalog

  /** The table properties Spark's `CREATE TABLE <t> USING <provider> LOCATION '<l>'` hands
   *  the catalog: provider, the location qualified as Spark qualifies it (`file:/x` for
   *  `/x`), external, and the current user as owner. */
  def locatedTableProperties(
      session: SparkSession, provider: String, location: String): Map[String, String] = {
    val uri = CatalogUtils.stringToURI(location)
    // A scheme Hadoop cannot open here (s3:// without hadoop-aws) stays as written.
    val qualified =
      try CatalogUtils.makeQualifiedPath(uri, session.sessionState.newHadoopConf())
      catch { case _: java.io.IOException => uri }
    CatalogV2Util.withDefaultOwnership(Map(
      TableCatalog.PROP_PROVIDER -> provider,
      TableCatalog.PROP_LOCATION -> CatalogUtils.URIToString(qualified),
      TableCatalog.PROP_EXTERNAL -> "true"))
  }

  /** The table properties Spark's `CREATE TABLE <t> USING <provider>` (no LOCATION: a
   *  managed table) hands the catalog: provider and the current user as owner. */
  def managedTableProperties(provider: String): Map[String, String] =
    CatalogV2Util.withDefaultOwnership(Map(TableCatalog.PROP_PROVIDER -> provider))

  /** Whether `db.table` names a table of the session catalog's own database (not another
   *  catalog's namespace, not the global temporary views'), as name resolution would find
   *  it: then the session catalog answers whether it exists. */
  def inSessionDatabase(session: SparkSession, db: String): Boolean = {
    val globalTemp = session.conf.get("spark.sql.globalTempDatabase", "global_temp")
    !db.equalsIgnoreCase(globalTemp) &&
      !session.sessionState.catalogManager.isCatalogRegistered(db)
  }

  /** `CREATE DATABASE IF NOT EXISTS <name>` of the session catalog without the statement:
   *  the namespace Spark's command creates (default location, the current user as owner).
   *  True when it was created, false when it existed, null when `spark_catalog` has no
   *  namespaces to create (run the statement then). */
  def createDatabaseIfMissing(session: SparkSession, name: String): java.lang.Boolean =
    withActive(session) {
      sessionCatalogPlugin(session) match {
        case catalog: SupportsNamespaces =>
          val namespace = Array(name)
          if (catalog.namespaceExists(namespace)) java.lang.Boolean.FALSE
          else {
            val owner = Map(TableCatalog.PROP_OWNER -> Utils.getCurrentUserName()).asJava
            try {
              catalog.createNamespace(namespace, owner)
              java.lang.Boolean.TRUE
            } catch {
              case _: NamespaceAlreadyExistsException => java.lang.Boolean.FALSE
            }
          }
        case _ => null
      }
    }

  /** The Hadoop settings Spark's Hive client is built from (`spark.hadoop.*`, the
   *  `hive-site.xml` on the class path): where the metastore is. */
  def sharedHadoopConf(session: SparkSession): org.apache.hadoop.conf.Configuration =
    session.sharedState.hadoopConf

  /** `body` with `session` as the active session (as a SQL statement runs). */
  def withActive[T](session: SparkSession)(body: => T): T = session.withActive(body)
}
