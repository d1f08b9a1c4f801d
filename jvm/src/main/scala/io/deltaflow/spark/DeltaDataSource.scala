package io.deltaflow.spark

import java.util

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{DataFrame, SaveMode, SQLContext}
import org.apache.spark.sql.connector.catalog.{Table, TableProvider}
import org.apache.spark.sql.connector.expressions.Transform
import org.apache.spark.sql.execution.streaming.Sink
import org.apache.spark.sql.sources.{BaseRelation, CreatableRelationProvider, DataSourceRegister, StreamSinkProvider}
import org.apache.spark.sql.streaming.OutputMode
import org.apache.spark.sql.types.{DataType, StructType}
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/**
 * `format("delta")`: deltaflow's DataSource V2 provider.
 *
 * Reads: [[DeltaTable]] (batch scans on Spark's vectorized Parquet reader; streams and
 * change-feed reads through the Python data source until the JVM implements them).
 * Batch writes: `df.write.format("delta").save(...)` comes here through
 * [[CreatableRelationProvider]] for every save mode, as delta-spark's does: the table
 * reports no `BATCH_WRITE`, so Spark hands the DataFrame over whole ([[DeltaBatchWrite]]).
 */
class DeltaDataSource extends TableProvider with DataSourceRegister
  with CreatableRelationProvider with StreamSinkProvider
  // `saveAsTable` in overwrite mode marks its write (option `__v1_save_as_table_overwrite`)
  // wherever it is planned — classic or Spark Connect — so the catalog keeps the table's
  // metadata, as delta-spark's V1 writer does (SPARK-54462, Spark 4.1+; nothing on 4.0).
  with SaveAsTableOverwriteMarker {

  override def shortName(): String = "delta"

  // Spark calls inferSchema then getTable for one read, back to back on one thread:
  // getTable takes the table inferSchema resolved, so both see one version.
  private val resolved = new ThreadLocal[(Map[String, String], Table)]

  override def inferSchema(options: CaseInsensitiveStringMap): StructType = {
    val properties = options.asCaseSensitiveMap()
    val table = resolve(properties)
    resolved.set((properties.asScala.toMap, table))
    table.schema()
  }

  override def getTable(
      schema: StructType,
      partitioning: Array[Transform],
      properties: util.Map[String, String]): Table = {
    val cached = resolved.get()
    resolved.remove()
    if (cached != null && cached._1 == properties.asScala.toMap) cached._2 else resolve(properties)
  }

  private def resolve(properties: util.Map[String, String]): Table =
    try DeltaDataSource.tableFor(properties, None)
    catch {
      // delta-spark's `load("/path@v3")` and `load("/path@yyyyMMddHHmmssSSS")`: no table at
      // the path as written, and it ends so: the table before the suffix, at that version.
      case missing: DeltaflowException if missing.errorType == "TableNotFoundError" =>
        DeltaDataSource.withTimeTravelSuffix(properties)
          .map(DeltaDataSource.tableFor(_, None)).getOrElse(throw missing)
    }

  // Every Spark type may reach the brain, which knows what Delta can store (VARIANT
  // needs the variantType feature); Spark's default refuses VARIANT here.
  override def supportsDataType(dt: DataType): Boolean = true

  override def createSink(
      sqlContext: SQLContext,
      parameters: Map[String, String],
      partitionColumns: Seq[String],
      outputMode: OutputMode): Sink =
    DeltaSink.create(sqlContext.sparkSession, parameters, partitionColumns, outputMode)

  override def createRelation(
      sqlContext: SQLContext,
      mode: SaveMode,
      parameters: Map[String, String],
      data: DataFrame): BaseRelation = {
    DeltaBatchWrite.save(data, mode, parameters)
    val written = data.schema
    new BaseRelation {
      override def sqlContext: SQLContext = data.sparkSession.sqlContext
      override def schema: StructType = written
    }
  }
}

object DeltaDataSource {
  private val TimeTravelKeys = Set("versionasof", "timestampasof")

  /** `properties` with a path ending in `@v<n>` or `@yyyyMMddHHmmssSSS` (and no time
   *  travel option of its own) cut there, the suffix made the time travel option. */
  private[spark] def withTimeTravelSuffix(
      properties: util.Map[String, String]): Option[util.Map[String, String]] = {
    val given = properties.asScala.toMap
    if (given.keys.exists(k => TimeTravelKeys.contains(k.toLowerCase))) return None
    for {
      (key, path) <- given.find(_._1.equalsIgnoreCase("path"))
      (base, travel) <- DeltaCatalog.versionSuffix(path)
    } yield (given + (key -> base) ++ travel).asJava
  }

  /** The connector's table, or the Python data source's for a table the brain routes
   *  there. `entry`: the catalog's entry for it, when it was named so; `byName`: the
   *  catalog resolved it from a path identifier (delta.`/path`). */
  def tableFor(
      properties: util.Map[String, String],
      entry: Option[org.apache.spark.sql.catalyst.catalog.CatalogTable],
      byName: Boolean = false): Table = {
    val info = TableInfo.load(properties)
    if (info.exists && info.route == "python")
      new LocatedPythonTable(PythonDelegate.table(properties), info)
    else new DeltaTable(info, properties, entry, byName)
  }
}

/**
 * What the brain says about a table for one read: where it is, the version pinned, its
 * logical and physical schemas and partition columns. `exists` is false for a path with
 * no table yet (a first write asks for its schema too).
 */
case class TableInfo(
    uri: String,
    version: Long,
    exists: Boolean,
    timeTravel: Boolean,
    schema: StructType,
    physicalSchema: StructType,
    partitionColumns: Seq[String],
    deletionVectors: Boolean,
    route: String,
    routeReason: String,
    configuration: Map[String, String],
    description: Option[String],
    protocol: Map[String, String],
    // Routed to Python only for its change feed, which the JVM's real-time reader reads.
    jvmChangeFeed: Boolean = false)

object TableInfo {
  private val NativeScanConf = "deltaflow.read.nativeScan"

  def load(options: util.Map[String, String]): TableInfo = {
    val key = options.asScala.toMap
    val args = Brain.newArgs()
    val opts = args.putObject("options")
    key.foreach { case (k, v) => opts.put(k, v) }
    val conf = args.putObject("conf")
    // py4j calls run on threads with no active session: fall back to the default one.
    val active = org.apache.spark.sql.SparkSession.getActiveSession
      .orElse(org.apache.spark.sql.SparkSession.getDefaultSession)
    for (session <- active;
         value <- session.conf.getOption(NativeScanConf)) conf.put(NativeScanConf, value)
    val r = Brain.call("table.load", args)
    TableInfo(
      uri = r.get("uri").asText(),
      version = r.get("version").asLong(),
      exists = r.get("exists").asBoolean(),
      timeTravel = key.keys.exists(k =>
        k.equalsIgnoreCase("versionAsOf") || k.equalsIgnoreCase("timestampAsOf")),
      schema = DataType.fromJson(r.get("schema").toString).asInstanceOf[StructType],
      physicalSchema = DataType.fromJson(r.get("physicalSchema").toString).asInstanceOf[StructType],
      partitionColumns = r.get("partitionColumns").elements().asScala.map(_.asText()).toSeq,
      deletionVectors = r.path("deletionVectors").asBoolean(false),
      route = r.get("route").asText(),
      routeReason = r.path("routeReason").asText(""),
      configuration = strings(r.path("configuration")),
      description = Option(r.path("description").textValue()),
      protocol = strings(r.path("protocol")),
      jvmChangeFeed = r.path("jvmChangeFeed").asBoolean(false))
  }

  private def strings(node: com.fasterxml.jackson.databind.JsonNode): Map[String, String] =
    node.properties().asScala.map(e => e.getKey -> e.getValue.asText()).toMap
}
