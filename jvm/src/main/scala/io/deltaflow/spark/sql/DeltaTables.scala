package io.deltaflow.spark.sql

import org.apache.spark.sql.catalyst.TableIdentifier
import org.apache.spark.sql.catalyst.catalog.{CatalogStorageFormat, CatalogTable, CatalogTableType, CatalogUtils}
import org.apache.spark.sql.connector.catalog.Identifier
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.types.StructType

import org.apache.spark.sql.deltaflow.CatalogAccess

import io.deltaflow.spark.{DeltaCatalog, DeltaflowException}

/** The table a statement names, as written. */
private[sql] sealed trait TableRef
/** `'/path'`: a table by its location. */
private[sql] case class PathRef(path: String) extends TableRef
/** `db.t`, `t`, `spark_catalog.db.t`, `delta.\`/path\``, `parquet.\`/path\``. */
private[sql] case class NameRef(parts: Seq[String]) extends TableRef

/** Where a statement's table lives; `entry` is its catalog entry, if it has one. */
private[sql] case class ResolvedTable(uri: String, name: Option[String], entry: Option[CatalogTable])

/** Where a SHALLOW CLONE goes: `uri`, how to name it in errors, whether a table is there
 *  already, and how to enter it in the catalog once written (nothing for a path). */
private[sql] case class CloneTarget(
    uri: String, shown: String, exists: Boolean, register: SparkSession => Unit)

/** Resolves the tables Delta's statements name, through the session catalog. */
private[sql] object DeltaTables {
  private def session = org.apache.spark.sql.classic.SparkSession.active

  def resolve(ref: TableRef, statement: String): ResolvedTable = ref match {
    case PathRef(path) => ResolvedTable(path, None, None)
    case NameRef(Seq(format, path)) if isPath(format, path) &&
        (format.equalsIgnoreCase("delta") || statement == "CONVERT TO DELTA") =>
      if (!format.equalsIgnoreCase("delta") && !format.equalsIgnoreCase("parquet")) {
        throw DeltaflowException.of("UnsupportedFeatureError",
          s"$statement $format.`$path`: only Parquet directories can be converted to Delta.",
          Map("table_uri" -> path, "feature" -> s"convert:$format"))
      }
      ResolvedTable(path, None, None)
    case NameRef(parts) => catalogTable(parts, statement)
  }

  /** The target of `CREATE TABLE <target> SHALLOW CLONE ...`: a path (`delta.\`/p\``), or
   *  a session catalog name, at `location` or the managed location Spark picks. */
  def cloneTarget(ref: TableRef, location: Option[String]): CloneTarget = ref match {
    case NameRef(Seq(format, path)) if format.equalsIgnoreCase("delta") && isPath(format, path) =>
      CloneTarget(path, s"delta.`$path`", holdsLog(path), _ => ())
    case PathRef(path) =>
      throw DeltaflowException.of("SqlSyntaxError",
        s"SHALLOW CLONE into '$path': name the new table, or its path as delta.`$path`.",
        Map("statement" -> "SHALLOW CLONE", "expected" -> "a table name or delta.`<path>`"))
    case NameRef(parts) =>
      val (local, shown) = sessionName(parts, "SHALLOW CLONE into")
      if (!CatalogAccess.sessionCatalogPlugin(session).isInstanceOf[DeltaCatalog]) {
        throw DeltaflowException.of("UnsupportedFeatureError",
          s"SHALLOW CLONE into $shown: the session's spark_catalog is not deltaflow's, so the " +
            "clone could not be entered in it. Clone into a path (delta.`<path>`) and register " +
            "it with CREATE TABLE ... USING delta LOCATION, or start the session with " +
            "deltaflow.spark_conf().",
          Map("table_uri" -> shown, "feature" -> "sessionCatalog"))
      }
      val catalog = session.sessionState.catalog
      val ident = TableIdentifier(local.last, Some(local.init.headOption
        .getOrElse(catalog.getCurrentDatabase)))
      val name = ident.unquotedString
      // A table there already (CREATE OR REPLACE): its entry and location stay.
      val existing = if (catalog.tableExists(ident)) Some(catalog.getTableMetadata(ident)) else None
      existing.filterNot(_.provider.exists(_.equalsIgnoreCase("delta"))).foreach { entry =>
        throw DeltaflowException.of("TableAlreadyExistsError",
          s"SHALLOW CLONE into $shown: it is a ${entry.provider.getOrElse("non-Delta")} " +
            "table, which a clone cannot replace. Drop it first, or clone into another name.",
          Map("table_uri" -> shown))
      }
      val uri = existing.map(e => CatalogUtils.URIToString(e.location))
        .orElse(location)
        .getOrElse(CatalogUtils.URIToString(catalog.defaultTablePath(ident)))
      CloneTarget(uri, shown, existing.isDefined, s =>
        if (existing.isEmpty) {
          DeltaCatalog.registerTable(s.asInstanceOf[org.apache.spark.sql.classic.SparkSession],
            name, uri, managed = location.isEmpty)
        } else s.catalog.refreshTable(name))
  }

  // Whether `path` has a `_delta_log`; false where Hadoop cannot look (the brain checks
  // again before it writes, and refuses an existing table).
  private def holdsLog(path: String): Boolean =
    try {
      val log = new org.apache.hadoop.fs.Path(CatalogUtils.stringToURI(path).toString, "_delta_log")
      log.getFileSystem(session.sessionState.newHadoopConf()).exists(log)
    } catch { case _: java.io.IOException => false }

  private def isPath(format: String, path: String): Boolean =
    DeltaCatalog.isPathIdentifier(Identifier.of(Array("delta"), path))

  /** A name of the session catalog without its `spark_catalog.` prefix, and the name as
   *  written, for errors; a name of another catalog is refused. */
  private def sessionName(parts: Seq[String], statement: String): (Seq[String], String) = {
    val local = if (parts.length == 3 && parts.head.equalsIgnoreCase("spark_catalog")) parts.tail
      else parts
    val shown = parts.map(p => s"`${p.replace("`", "``")}`").mkString(".")
    if (local.length > 2) {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"$statement $shown: deltaflow runs Delta statements on tables of the session catalog " +
          "(spark_catalog) only. Name the table as db.table, or by its path: delta.`<path>`.",
        Map("table_uri" -> shown, "feature" -> "otherCatalogs"))
    }
    (local, shown)
  }

  private def catalogTable(parts: Seq[String], statement: String): ResolvedTable = {
    val catalog = session.sessionState.catalog
    val (local, shown) = sessionName(parts, statement)
    val ident = TableIdentifier(local.last, local.init.headOption)
    if (local.length == 1 && catalog.isTempView(local)) {
      throw notDelta(statement, shown, "a temporary view")
    }
    if (!catalog.tableExists(ident)) {
      throw DeltaflowException.of("TableNotFoundError",
        s"$statement $shown: there is no such table in the catalog " +
          s"(current database: ${catalog.getCurrentDatabase}). Check the name with SHOW TABLES, " +
          "or name a Delta table by its path: delta.`<path>`.",
        Map("table_uri" -> shown))
    }
    val entry = catalog.getTableMetadata(ident)
    val isParquet = entry.provider.exists(_.equalsIgnoreCase("parquet"))
    if (!DeltaCatalog.isDelta(entry) && !(statement == "CONVERT TO DELTA" && isParquet)) {
      val kind = if (entry.tableType == CatalogTableType.VIEW) "a view"
        else s"a ${entry.provider.getOrElse("Hive")} table"
      throw notDelta(statement, shown, kind)
    }
    val location = entry.storage.locationUri.map(CatalogUtils.URIToString).getOrElse {
      throw DeltaflowException.of("TableNotFoundError",
        s"$statement $shown: the catalog entry has no location, so there is no table data to " +
          "work on. Drop it and create it again with a LOCATION.",
        Map("table_uri" -> shown))
    }
    ResolvedTable(location, Some(entry.identifier.copy(catalog = Some("spark_catalog"))
      .unquotedString), Some(entry))
  }

  private def notDelta(statement: String, shown: String, kind: String): DeltaflowException = {
    val convert = if (kind.startsWith("a parquet")) s" Convert it first: CONVERT TO DELTA $shown."
      else ""
    DeltaflowException.of("TableNotFoundError",
      s"$statement $shown: $shown is $kind, not a Delta table; $statement works on Delta " +
        s"tables only.$convert",
      Map("table_uri" -> shown))
  }

  /** After CONVERT TO DELTA of a catalog Parquet table: the entry becomes a Delta one
   *  (name, location, options, managed or not; the rest is read from the log). */
  def markConverted(table: ResolvedTable): Unit = table.entry.filterNot(DeltaCatalog.isDelta)
    .foreach { entry =>
      val catalog = session.sessionState.catalog
      catalog.alterTable(entry.copy(
        provider = Some("delta"),
        schema = new StructType(),
        partitionColumnNames = Nil,
        bucketSpec = None,
        storage = CatalogStorageFormat.empty.copy(
          locationUri = entry.storage.locationUri, properties = entry.storage.properties)))
      catalog.refreshTable(entry.identifier)
    }
}
