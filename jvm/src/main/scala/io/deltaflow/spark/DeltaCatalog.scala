package io.deltaflow.spark

import java.util

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode

import org.apache.spark.sql.{DataFrame, SaveMode, SparkSession}
import org.apache.spark.sql.catalyst.TableIdentifier
import org.apache.spark.sql.catalyst.catalog.{CatalogStorageFormat, CatalogTable, CatalogTableType, CatalogUtils}
import org.apache.spark.sql.connector.catalog.{Column, DelegatingCatalogExtension, Identifier, StagedTable, StagingTableCatalog, SupportsWrite, Table, TableCapability, TableCatalog, TableCatalogCapability, TableChange}
import org.apache.spark.sql.deltaflow.CatalogAccess
import org.apache.spark.sql.connector.expressions.Transform
import org.apache.spark.sql.connector.write.{LogicalWriteInfo, SupportsOverwrite, SupportsTruncate, V1Write, Write, WriteBuilder}
import org.apache.spark.sql.sources.{Filter, InsertableRelation}
import org.apache.spark.sql.types.StructType

import io.deltaflow.spark.catalog.{AlterTable, Metastore}

/**
 * `spark.sql.catalog.spark_catalog=io.deltaflow.spark.DeltaCatalog`: Spark's session catalog,
 * with Delta tables served by deltaflow (as delta-spark's `DeltaCatalog` does).
 *
 * The Delta log is the table: the catalog entry of a `USING delta` table holds only its
 * name, location, `OPTIONS` and whether it is managed; schema, partitioning, properties and
 * comment are read from the log on every load, so nothing can drift apart. Creating a
 * table writes the log (through the brain) before the entry; `CREATE TABLE ... AS SELECT`
 * and `REPLACE` are staged, so the table and its data are one commit; `ALTER TABLE`
 * changes the log ([[AlterTable]]); dropping a managed table deletes its data (Spark's
 * session catalog does that for managed tables). `delta.\`/path\`` names a table by its
 * location wherever a table name goes. Tables of other providers are Spark's business.
 */
class DeltaCatalog extends DelegatingCatalogExtension with StagingTableCatalog {
  import DeltaCatalog._

  // SQL's `GENERATED ALWAYS AS (expr)` and `GENERATED ... AS IDENTITY` columns: Spark
  // checks the expressions, then hands them over in each Column (the brain turns them into
  // Delta's column metadata).
  override def capabilities(): util.Set[TableCatalogCapability] = {
    val all = new util.HashSet[TableCatalogCapability](super.capabilities())
    all.add(TableCatalogCapability.SUPPORTS_CREATE_TABLE_WITH_GENERATED_COLUMNS)
    all.add(TableCatalogCapability.SUPPORTS_CREATE_TABLE_WITH_IDENTITY_COLUMNS)
    all
  }

  // Before the session first reaches the metastore: an embedded Derby database another
  // process holds is refused here, typed, rather than deep inside Hive's client.
  override def initialize(
      name: String, options: org.apache.spark.sql.util.CaseInsensitiveStringMap): Unit = {
    super.initialize(name, options)
    if (session.conf.get("spark.sql.catalogImplementation", "in-memory") == "hive") {
      Metastore.checkAvailable(CatalogAccess.sharedHadoopConf(session))
    }
  }

  override def loadTable(ident: Identifier): Table = load(ident, Map.empty)

  override def loadTable(ident: Identifier, version: String): Table =
    load(ident, Map("versionAsOf" -> version))

  override def loadTable(ident: Identifier, timestamp: Long): Table =
    load(ident, Map("timestampAsOf" -> timestampOption(timestamp)))

  private def load(ident: Identifier, timeTravel: Map[String, String]): Table = {
    // delta-spark's `t@v3` / `t@20261124083000000` names: a version of the table.
    versionSuffix(ident.name()) match {
      case Some((base, pinned)) if timeTravel.isEmpty && !tableExists(ident) =>
        return load(Identifier.of(ident.namespace(), base), pinned)
      case _ =>
    }
    if (isPathIdentifier(ident)) return pathTable(ident.name(), timeTravel)
    // Time travel is the log's business: the catalog entry is the same at every version.
    val table = super.loadTable(ident)
    CatalogAccess.entryOf(table) match {
      case Some(entry) if isDelta(entry) => catalogTable(entry, timeTravel)
      case _ if timeTravel.isEmpty => table
      case _ =>
        timeTravel.get("versionAsOf") match {
          case Some(v) => super.loadTable(ident, v)
          case None => super.loadTable(ident, timeTravelMicros(timeTravel("timestampAsOf")))
        }
    }
  }

  override def tableExists(ident: Identifier): Boolean =
    if (isPathIdentifier(ident)) TableInfo.load(Map("path" -> ident.name()).asJava).exists
    else super.tableExists(ident)

  override def createTable(
      ident: Identifier,
      columns: Array[Column],
      partitions: Array[Transform],
      properties: util.Map[String, String]): Table = {
    if (!isDeltaCreate(ident, properties)) {
      return super.createTable(ident, columns, partitions, properties)
    }
    val request = CreateRequest(this, ident, CatalogAccess.schemaOf(columns),
      partitions, properties.asScala.toMap, "create")
    request.checkManagedLocation()
    request.commitLog()
    request.register()
    loadTable(ident)
  }

  override def stageCreate(
      ident: Identifier,
      columns: Array[Column],
      partitions: Array[Transform],
      properties: util.Map[String, String]): StagedTable =
    stage(ident, columns, partitions, properties, "create")

  override def stageReplace(
      ident: Identifier,
      columns: Array[Column],
      partitions: Array[Transform],
      properties: util.Map[String, String]): StagedTable =
    stage(ident, columns, partitions, properties, "replace")

  override def stageCreateOrReplace(
      ident: Identifier,
      columns: Array[Column],
      partitions: Array[Transform],
      properties: util.Map[String, String]): StagedTable =
    stage(ident, columns, partitions, properties, "createOrReplace")

  private def stage(
      ident: Identifier,
      columns: Array[Column],
      partitions: Array[Transform],
      properties: util.Map[String, String],
      mode: String): StagedTable = {
    if (!isDeltaCreate(ident, properties)) {
      // Another provider: Spark's own non-atomic create/replace, as its session catalog does.
      return new NonDeltaStaged(this, ident, columns, partitions, properties, mode)
    }
    if (mode == "replace" && !tableExists(ident)) {
      throw new org.apache.spark.sql.catalyst.analysis.CannotReplaceMissingTableException(ident)
    }
    val request = CreateRequest(this, ident,
      CatalogAccess.schemaOf(columns), partitions, properties.asScala.toMap, mode)
    request.checkManagedLocation()
    new StagedDeltaTable(request)
  }

  override def alterTable(ident: Identifier, changes: TableChange*): Table = {
    loadTable(ident) match {
      case table: DeltaTable =>
        val (moves, rest) = changes.partition {
          case c: TableChange.SetProperty => c.property() == TableCatalog.PROP_LOCATION
          case _ => false
        }
        moves.lastOption.foreach(m =>
          setLocation(table, m.asInstanceOf[TableChange.SetProperty].value()))
        if (rest.nonEmpty) AlterTable(table.info.uri, table.name(), rest.toSeq)
        loadTable(ident)
      case _ if isPathIdentifier(ident) =>
        // A Delta table the brain routes to the Python data source (an object store).
        AlterTable(ident.name(), s"delta.`${ident.name()}`", changes.toSeq)
        loadTable(ident)
      case _ => super.alterTable(ident, changes: _*)
    }
  }

  /** `ALTER TABLE t SET LOCATION '<path>'`: the catalog entry points at the Delta table
   *  there (which must exist), as with delta-spark; neither table's log changes. */
  private def setLocation(table: DeltaTable, location: String): Unit = {
    val entry = table.entry.getOrElse {
      throw DeltaflowException.of("InvalidOptionError",
        s"ALTER TABLE ${table.name()} SET LOCATION: a table named by its path has no catalog " +
          "entry to move. Read the table at the new path instead.",
        Map("option" -> "location"))
    }
    if (!TableInfo.load(Map("path" -> location).asJava).exists) {
      throw DeltaflowException.of("TableNotFoundError",
        s"ALTER TABLE ${table.name()} SET LOCATION '$location': there is no Delta table " +
          "there (no _delta_log). Write the table there first, then move the entry.",
        Map("table_uri" -> location))
    }
    sessionCatalog.alterTable(entry.copy(
      storage = entry.storage.copy(locationUri = Some(CatalogUtils.stringToURI(location)))))
  }

  override def dropTable(ident: Identifier): Boolean = {
    if (isPathIdentifier(ident)) {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"DROP TABLE delta.`${ident.name()}`: a table named by its path is not in the " +
          "catalog, so there is nothing to drop. Delete the directory to delete the table.",
        Map("table_uri" -> ident.name(), "feature" -> "dropPathTable"))
    }
    super.dropTable(ident)
  }

  private[spark] def sessionCatalog = session.sessionState.catalog

  private[spark] def callSuperCreate(
      ident: Identifier,
      columns: Array[Column],
      partitions: Array[Transform],
      properties: util.Map[String, String]): Table =
    super.createTable(ident, columns, partitions, properties)

  private[spark] def callSuperDrop(ident: Identifier): Boolean = super.dropTable(ident)
}

object DeltaCatalog {
  private[spark] def session: org.apache.spark.sql.classic.SparkSession =
    org.apache.spark.sql.classic.SparkSession.active

  def isDelta(table: CatalogTable): Boolean = table.provider.exists(_.equalsIgnoreCase("delta"))

  /** `delta.\`/some/path\``: a table named by its location (absolute path or URI). */
  def isPathIdentifier(ident: Identifier): Boolean = {
    ident.namespace().length == 1 && ident.namespace()(0).equalsIgnoreCase("delta") && {
      val name = ident.name()
      name.startsWith("/") || name.matches("^[A-Za-z][A-Za-z0-9+.-]*:/.*") ||
        name.matches("^[A-Za-z]:[\\\\/].*")
    }
  }

  private def isDeltaCreate(ident: Identifier, properties: util.Map[String, String]): Boolean =
    isPathIdentifier(ident) ||
      Option(properties.get(TableCatalog.PROP_PROVIDER)).exists(_.equalsIgnoreCase("delta"))

  /**
   * Registers the Delta table whose log is already at `location` as external catalog table
   * `name` (`t`, `db.t` or `spark_catalog.db.t`): the entry `CREATE TABLE <name> USING delta
   * LOCATION '<location>'` makes, through the same [[CreateRequest]], without parsing,
   * analysing and planning a statement (and without loading the table back). For callers
   * that wrote the log themselves (the table builder, pipelines). An existing entry is a
   * `TableAlreadyExistsError`. False, and nothing done, when `spark_catalog` is not
   * deltaflow's or `name` is in another catalog: run the statement then.
   */
  def registerExternal(
      session: org.apache.spark.sql.classic.SparkSession,
      name: String,
      location: String): Boolean = registerTable(session, name, location, managed = false)

  /** [[registerExternal]], or with `managed`, the managed entry (`CREATE TABLE <name> USING
   *  delta` without LOCATION) of the table the caller wrote at the managed location, which
   *  the caller checked was empty before (the builder): the statement would refuse it now
   *  that the folder holds the caller's log. */
  def registerTable(
      session: org.apache.spark.sql.classic.SparkSession,
      name: String,
      location: String,
      managed: Boolean): Boolean = CatalogAccess.withActive(session) {
    // Active first: which plugin is `spark_catalog` depends on the session's settings.
    val catalog = CatalogAccess.sessionCatalogPlugin(session) match {
      case delta: DeltaCatalog => Some(delta)
      case _ => None
    }
    val ident = session.sessionState.sqlParser.parseMultipartIdentifier(name) match {
      case Seq(table) => Some(Identifier.of(Array.empty[String], table))
      case Seq(db, table) => Some(Identifier.of(Array(db), table))
      case Seq(cat, db, table) if cat.equalsIgnoreCase(CatalogManagerName) =>
        Some(Identifier.of(Array(db), table))
      case _ => None
    }
    (catalog, ident) match {
      case (Some(delta), Some(id)) if !isPathIdentifier(id) =>
        val properties =
          if (managed) CatalogAccess.managedTableProperties("delta")
          else CatalogAccess.locatedTableProperties(session, "delta", location)
        CreateRequest(delta, id, new StructType(), Array.empty, properties, "create").register()
        true
      case _ => false
    }
  }

  /**
   * `spark.catalog.tableExists(name)` for a `db.table` name of the session catalog, looked
   * up in the session catalog directly: no query resolution, no exception raised and
   * caught for a missing table (10+ ms). Null when `name` may resolve to anything else (a
   * temporary view, another catalog's table): ask `spark.catalog.tableExists` then.
   */
  def sessionTableExists(
      session: org.apache.spark.sql.classic.SparkSession,
      name: String): java.lang.Boolean = CatalogAccess.withActive(session) {
    session.sessionState.sqlParser.parseMultipartIdentifier(name) match {
      case Seq(db, table) if CatalogAccess.inSessionDatabase(session, db) =>
        java.lang.Boolean.valueOf(
          session.sessionState.catalog.tableExists(TableIdentifier(table, Some(db))))
      case _ => null
    }
  }

  /** A table named by its location. */
  def pathTable(path: String, extra: Map[String, String]): Table =
    DeltaDataSource.tableFor((extra + ("path" -> path)).asJava, None, byName = true)

  /** The Delta table a catalog entry points at, read from its log. */
  def catalogTable(entry: CatalogTable, extra: Map[String, String]): Table = {
    val location = entry.storage.locationUri.map(CatalogUtils.URIToString).getOrElse {
      throw DeltaflowException.of("TableNotFoundError",
        s"Catalog table ${entry.identifier.quotedString} says it is a Delta table but has " +
          "no location. Drop it and create it again (CREATE TABLE ... USING delta LOCATION).",
        Map("table_uri" -> entry.identifier.quotedString))
    }
    val options = entry.storage.properties ++ extra + ("path" -> location)
    DeltaDataSource.tableFor(options.asJava, Some(entry))
  }

  /** Whether Spark runs this statement for `DataFrameWriter.saveAsTable` (the V1 writer,
   *  classic or through Spark Connect's planner). Its `mode("overwrite")` reaches the catalog
   *  as a CREATE OR REPLACE AS SELECT, yet delta-spark keeps the table's metadata there (it
   *  overwrites the data); only SQL and `writeTo` (V2) replace it. Spark hands the catalog
   *  nothing else that tells the two apart, so, as delta-spark does, the stack says. */
  private[spark] def calledByV1Writer: Boolean =
    Thread.currentThread().getStackTrace.exists { frame =>
      val cls = frame.getClassName
      cls == "org.apache.spark.sql.classic.DataFrameWriter" ||
        cls == "org.apache.spark.sql.DataFrameWriter"
    }

  /** The write option that carries a CREATE's properties and comment to the brain's
   *  write plan (`CREATE_SPEC_OPTION` in `spark/_options.py`). */
  val CreateSpecOption = "__deltaflow_create"

  private[spark] val CatalogManagerName = "spark_catalog"

  private val VersionSuffix = """^(.+)@[vV](\d+)$""".r
  private val TimestampSuffix = """^(.+)@(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})(\d{3})$""".r

  /** `name@v<version>` or `name@yyyyMMddHHmmssSSS` (UTC): the name and the time travel. */
  private[spark] def versionSuffix(name: String): Option[(String, Map[String, String])] =
    name match {
      case VersionSuffix(base, version) => Some(base -> Map("versionAsOf" -> version))
      case TimestampSuffix(base, y, mo, d, h, mi, sec, ms) =>
        Some(base -> Map("timestampAsOf" -> s"$y-$mo-$d $h:$mi:$sec.$ms"))
      case _ => None
    }

  /** Spark hands time travel by timestamp as microseconds since the epoch. */
  private[spark] def timestampOption(micros: Long): String = {
    val instant = java.time.Instant.ofEpochSecond(
      Math.floorDiv(micros, 1000000L), Math.floorMod(micros, 1000000L) * 1000L)
    instant.toString
  }

  private def timeTravelMicros(text: String): Long = {
    val instant = java.time.Instant.parse(text)
    instant.getEpochSecond * 1000000L + instant.getNano / 1000L
  }
}

/**
 * One CREATE / REPLACE of a Delta table: where it goes, what the log gets, and the catalog
 * entry that points at it.
 */
private[spark] case class CreateRequest(
    catalog: DeltaCatalog,
    ident: Identifier,
    schema: StructType,
    partitions: Array[Transform],
    properties: Map[String, String],
    mode: String) {
  import DeltaCatalog._

  val pathOnly: Boolean = isPathIdentifier(ident)
  private val explicitLocation: Option[String] =
    if (pathOnly) Some(ident.name()) else properties.get(TableCatalog.PROP_LOCATION)
  val managed: Boolean = explicitLocation.isEmpty

  lazy val tableIdent: TableIdentifier = {
    val db = ident.namespace().lastOption.orElse(Some(catalog.sessionCatalog.getCurrentDatabase))
    TableIdentifier(ident.name(), db, Some(CatalogManagerName))
  }

  lazy val location: String = explicitLocation.getOrElse(
    CatalogUtils.URIToString(catalog.sessionCatalog.defaultTablePath(tableIdent)))

  val comment: Option[String] = properties.get(TableCatalog.PROP_COMMENT)

  /** REPLACE / CREATE OR REPLACE (SQL, `writeTo().replace()` / `createOrReplace()`): an
   *  existing table's metadata becomes this statement's (its TBLPROPERTIES, over the
   *  session defaults, are the whole configuration). `saveAsTable` in overwrite mode keeps
   *  the table's metadata, as delta-spark's V1 writer does. Decided here, while Spark's
   *  caller is still on the stack. */
  val replacesMetadata: Boolean = mode != "create" && !calledByV1Writer

  /** `OPTIONS (...)`: kept on the catalog entry and passed to every read and write. */
  val options: Map[String, String] = properties.collect {
    case (k, v) if k.startsWith(TableCatalog.OPTION_PREFIX) =>
      k.stripPrefix(TableCatalog.OPTION_PREFIX) -> v
  }

  /** `TBLPROPERTIES (...)`, over the session's defaults: the Delta table's configuration. */
  val tableProperties: Map[String, String] = TableDefaults.applyTo(properties.filter {
    case (k, _) => !k.startsWith(TableCatalog.OPTION_PREFIX) && !CatalogKeys.contains(k)
  }, session)

  /** CLUSTER BY's columns (Spark's `cluster_by` transform), for every create route; the
   *  brain checks them against the schema and refuses them on a partitioned table. */
  val clusteringColumns: Option[Seq[String]] =
    partitions.find(_.name() == "cluster_by").map(_.references().toSeq.map { ref =>
      ref.fieldNames().map(n => if (n.contains(".") || n.contains("`")) {
        "`" + n.replace("`", "``") + "`"
      } else n).mkString(".")
    })

  /** PARTITIONED BY's columns; anything else Spark hands over as partitioning is refused
   *  here, for every route (CREATE, CTAS, REPLACE, saveAsTable, writeTo). */
  val partitionColumns: Seq[String] = {
    val other = partitions.filterNot(p => p.name() == "identity" || p.name() == "cluster_by")
    if (other.nonEmpty) {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"PARTITIONED BY ${other.map(_.describe()).mkString(", ")} on $describe: Delta tables " +
          "are partitioned by plain columns only, not by transforms or buckets. Partition by " +
          "a column (add a computed column to the query if needed).",
        Map("table_uri" -> describe, "feature" -> "partitionTransforms"))
    }
    partitions.toSeq.filter(_.name() == "identity")
      .flatMap(_.references().map(_.fieldNames().mkString(".")))
  }

  def describe: String =
    if (pathOnly) s"delta.`${ident.name()}`" else tableIdent.copy(catalog = None).quotedString

  /**
   * A new managed table gets a folder of its own: when the folder Spark picks for it
   * (`<database location>/<table>`) already holds anything — the Delta log of a table the
   * catalog forgot (an in-memory catalog's restart, a DROP that kept the data), any file —
   * the create is refused before anything is written, as Spark (`LOCATION_ALREADY_EXISTS`)
   * and delta-spark refuse it. Adopting that table instead would let a CREATE + INSERT
   * report success while the old rows stay (a `dbt seed` doubled every row). A REPLACE of
   * a catalog table keeps its own folder.
   */
  def checkManagedLocation(): Unit = {
    if (!managed || pathOnly || catalog.sessionCatalog.tableExists(tableIdent)) return
    val path = new org.apache.hadoop.fs.Path(CatalogUtils.stringToURI(location))
    val holdsFiles =
      try {
        val fs = path.getFileSystem(session.sessionState.newHadoopConf())
        fs.exists(path) && fs.listStatus(path).nonEmpty
      } catch { case _: java.io.IOException => false } // a store Hadoop cannot open here
    if (holdsFiles) {
      val quoted = location.replace("'", "\\'")
      throw DeltaflowException.of("LocationNotEmptyError",
        s"Cannot create managed table $describe: its location $location already holds " +
          "files (a table the catalog no longer lists, or other data). Nothing was written. " +
          s"To use the table that is there, register it: CREATE TABLE $describe USING delta " +
          s"LOCATION '$quoted'. Otherwise remove that folder or choose another name.",
        Map("table_uri" -> location, "table_name" -> describe,
          "error_class" -> "LOCATION_ALREADY_EXISTS"))
    }
  }

  /** The brain writes (or checks) the log per `mode`; the table's URI. */
  def commitLog(): String = {
    val args = Brain.newArgs()
    args.put("mode", mode)
    args.put("location", location)
    args.put("name", describe)
    args.put("pathOnly", pathOnly)
    args.put("managed", managed && !pathOnly)
    if (schema.nonEmpty) args.put("schema", schema.json)
    val parts = args.putArray("partitionColumns")
    partitionColumns.foreach(parts.add)
    val props = args.putObject("properties")
    tableProperties.foreach { case (k, v) => props.put(k, v) }
    comment.foreach(args.put("comment", _))
    clusteringColumns.foreach { cols =>
      val array = args.putArray("clusteringColumns")
      cols.foreach(array.add)
    }
    Brain.call("catalog.create", args).get("uri").asText()
  }

  /** Parameters for a write that creates the table with its data in one commit.
   *  `v1Overwrite`: the write is `saveAsTable`'s overwrite, which keeps the metadata and
   *  is recorded as delta-spark's V1 writer records it (`isV1SaveAsTableOverwrite`). */
  def writeParameters(uri: String, v1Overwrite: Boolean = false): Map[String, String] = {
    val base = options ++ tableProperties.filter(_._1.startsWith("delta.")) + ("path" -> uri)
    val parts = if (partitionColumns.nonEmpty) {
      Map("partitionBy" -> partitionColumns.mkString(","))
    } else Map.empty[String, String]
    val json = Brain.json
    val spec = Brain.newArgs()
    // The statement (create | replace | createOrReplace) names the commit, as delta-spark's
    // CREATE [OR REPLACE] / REPLACE TABLE AS SELECT.
    spec.put("mode", mode)
    spec.put("managed", managed && !pathOnly)
    spec.put("replaceMetadata", replacesMetadata && !v1Overwrite)
    if (v1Overwrite) spec.put("v1Overwrite", true)
    val props = spec.putObject("properties")
    tableProperties.foreach { case (k, v) => props.put(k, v) }
    comment.foreach(spec.put("comment", _))
    clusteringColumns.foreach { cols =>
      val array = spec.putArray("clusteringColumns")
      cols.foreach(array.add)
    }
    base ++ parts + (CreateSpecOption -> json.writeValueAsString(spec))
  }

  /** The catalog entry: name, location, OPTIONS, managed or not. */
  def register(): Unit = {
    if (pathOnly) return
    val sessionCatalog = catalog.sessionCatalog
    val uri = CatalogUtils.stringToURI(location)
    val entry = CatalogTable(
      identifier = tableIdent,
      tableType = if (managed) CatalogTableType.MANAGED else CatalogTableType.EXTERNAL,
      storage = CatalogStorageFormat.empty.copy(locationUri = Some(uri), properties = options),
      schema = new StructType(),
      provider = Some("delta"),
      comment = comment,
      properties = properties.get(TableCatalog.PROP_OWNER).map("owner" -> _).toMap)
    if (sessionCatalog.tableExists(tableIdent)) {
      if (mode == "create") {
        throw DeltaflowException.of("TableAlreadyExistsError",
          s"Table $describe already exists in the catalog. Use CREATE TABLE IF NOT EXISTS to " +
            "keep it or CREATE OR REPLACE TABLE to replace it.",
          Map("table_uri" -> describe))
      }
      val existing = sessionCatalog.getTableMetadata(tableIdent)
      // A replaced table keeps its owner and stays managed or external.
      sessionCatalog.alterTable(entry.copy(owner = existing.owner, tableType = existing.tableType))
    } else {
      sessionCatalog.createTable(entry, ignoreIfExists = false, validateLocation = false)
    }
  }

  private def CatalogKeys: Set[String] = Set(TableCatalog.PROP_PROVIDER,
    TableCatalog.PROP_LOCATION, TableCatalog.PROP_COMMENT, TableCatalog.PROP_OWNER,
    TableCatalog.PROP_EXTERNAL, TableCatalog.PROP_IS_MANAGED_LOCATION,
    // TableCatalog.PROP_TABLE_TYPE and PROP_COLLATION, by value: Spark 4.0 lacks both.
    "table_type", "collation")

}

/**
 * A staged `CREATE TABLE ... AS SELECT` / `REPLACE TABLE [AS SELECT]`: Spark writes the
 * query through this table, which creates (or replaces) the Delta table with the data in
 * one commit; `commitStagedChanges` then registers the catalog entry. A REPLACE without a
 * query writes only the new metadata.
 */
private[spark] class StagedDeltaTable(request: CreateRequest)
  extends StagedTable with SupportsWrite {
  @volatile private var written = false

  override def name(): String = request.describe

  override def schema(): StructType = request.schema

  override def partitioning(): Array[Transform] = request.partitions

  override def properties(): util.Map[String, String] = request.properties.asJava

  // REPLACE ... AS SELECT writes with an overwrite of everything (TRUNCATE /
  // OVERWRITE_BY_FILTER with `true`): the replace is the write itself.
  override def capabilities(): util.Set[TableCapability] = Set(TableCapability.V1_BATCH_WRITE,
    TableCapability.TRUNCATE, TableCapability.OVERWRITE_BY_FILTER).asJava

  override def newWriteBuilder(info: LogicalWriteInfo): WriteBuilder =
    new WriteBuilder with SupportsTruncate with SupportsOverwrite {
      override def truncate(): WriteBuilder = this
      override def overwrite(filters: Array[Filter]): WriteBuilder = this
      override def build(): Write = new V1Write {
        override def toInsertableRelation: InsertableRelation = (data: DataFrame, _: Boolean) => {
          // `saveAsTable(t)` in overwrite mode: Spark's marker (classic and Connect alike) or,
          // for a provider Spark did not ask, the stack at staging time.
          val marker = SaveAsTableOverwrite.OptionName
          val v1Overwrite = request.mode != "create" &&
            (info.options().getBoolean(marker, false) || !request.replacesMetadata)
          val options = info.options().asCaseSensitiveMap().asScala.toMap
            .filterNot(_._1.equalsIgnoreCase(marker))
          val mode = if (request.mode == "create") SaveMode.ErrorIfExists else SaveMode.Overwrite
          // A replace takes the query's schema. `saveAsTable`'s overwrite is a DataFrame
          // overwrite of the table (delta-spark's V1 writer): the table's schema and
          // partitioning stay and the data must fit them (mergeSchema may add columns),
          // unless the writer asked for overwriteSchema; with replaceWhere it keeps the
          // rows outside the predicate, so their schema too.
          val asked = !info.options().containsKey("replaceWhere") &&
            options.exists { case (k, v) =>
              k.equalsIgnoreCase("overwriteSchema") && v.trim.equalsIgnoreCase("true") }
          val keepsSchema = request.mode == "create" || (v1Overwrite && !asked)
          val params = request.writeParameters(request.location, v1Overwrite) ++ options ++
            (if (keepsSchema) Map.empty else Map("overwriteSchema" -> "true"))
          DeltaBatchWrite.save(data, mode, params)
          written = true
        }
      }
    }

  override def commitStagedChanges(): Unit = {
    if (!written) request.commitLog()
    request.register()
  }

  override def abortStagedChanges(): Unit = ()
}

/** Create/replace of a non-Delta table: Spark's session catalog, not atomic. */
private[spark] class NonDeltaStaged(
    catalog: DeltaCatalog,
    ident: Identifier,
    columns: Array[Column],
    partitions: Array[Transform],
    properties: util.Map[String, String],
    mode: String) extends StagedTable with SupportsWrite {
  private val table: Table = {
    if (mode != "create" && catalog.tableExists(ident)) catalog.callSuperDrop(ident)
    catalog.callSuperCreate(ident, columns, partitions, properties)
  }

  override def name(): String = table.name()
  override def schema(): StructType = table.schema()
  override def columns(): Array[Column] = table.columns()
  override def partitioning(): Array[Transform] = table.partitioning()
  override def properties(): util.Map[String, String] = table.properties()
  override def capabilities(): util.Set[TableCapability] = table.capabilities()

  override def newWriteBuilder(info: LogicalWriteInfo): WriteBuilder = table match {
    case t: SupportsWrite => t.newWriteBuilder(info)
    case _ => throw new UnsupportedOperationException(s"${table.name()} does not support writes")
  }

  override def commitStagedChanges(): Unit = ()
  override def abortStagedChanges(): Unit = catalog.callSuperDrop(ident)
}
