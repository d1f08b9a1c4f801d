package io.deltaflow.spark

import java.util

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.catalyst.catalog.CatalogTable
import org.apache.spark.sql.connector.catalog.{MetadataColumn, SupportsMetadataColumns, SupportsRead,
  SupportsWrite, Table, TableCapability, TruncatableTable}
import org.apache.spark.sql.connector.expressions.{Expressions, Transform}
import org.apache.spark.sql.connector.read.ScanBuilder
import org.apache.spark.sql.{DataFrame, SaveMode}
import org.apache.spark.sql.connector.write.{LogicalWriteInfo, PhysicalWriteInfo, SupportsDynamicOverwrite, SupportsOverwrite, SupportsTruncate, V1Write, Write, WriteBuilder, WriterCommitMessage}
import org.apache.spark.sql.connector.write.streaming.{StreamingDataWriterFactory, StreamingWrite}
import org.apache.spark.sql.sources.{AlwaysTrue, Filter, InsertableRelation}
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2
import org.apache.spark.sql.types.StructType
import org.apache.spark.sql.internal.connector.SupportsStreamingUpdateAsAppend
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/**
 * One Delta table, pinned at the version the brain loaded for this read.
 *
 * Batch scans and stream sources run on the JVM ([[DeltaScanBuilder]],
 * [[DeltaMicroBatchStream]]) when the brain routes the table `jvm`; stream sinks are the
 * provider's [[DeltaSink]]. Tables it routes `python` (object stores Spark's Hadoop layer
 * cannot open, change-feed reads) go to deltaflow's Python data source
 * ([[PythonDelegate]]), and so do streams into the table when
 * `deltaflow.write.nativeWrite=false`.
 */
class DeltaTable(
    val info: TableInfo,
    options: util.Map[String, String],
    val entry: Option[CatalogTable] = None,
    byName: Boolean = false)
  extends Table with SupportsRead with SupportsWrite with TruncatableTable
  with SupportsMetadataColumns {

  override def name(): String =
    entry.map(_.identifier.quotedString).getOrElse(s"delta.`${info.uri}`")

  // `_metadata` (the file of each row) on the JVM's scans; the Python data source's
  // scans (object stores, change feeds) have none.
  override def metadataColumns(): Array[MetadataColumn] =
    if (info.route == "jvm") Array(FileMetadata.column) else Array.empty

  override def schema(): StructType = info.schema

  // What a stream's progress names as its sink (a catalog table's streaming write).
  override def toString: String = s"DeltaTable[${info.uri}]"

  override def partitioning(): Array[Transform] =
    info.partitionColumns.map(c => Expressions.identity(c): Transform).toArray

  /** What `SHOW TBLPROPERTIES` and `DESCRIBE EXTENDED` show: the table's configuration
   *  and protocol from its log, its provider, location and comment. */
  override def properties(): util.Map[String, String] = {
    val base = info.configuration ++ info.protocol ++ Map(
      "provider" -> "delta", "location" -> info.uri) ++ info.description.map("comment" -> _)
    // DESCRIBE EXTENDED says MANAGED unless told the table is external.
    val external = entry.filter(_.tableType.name == "EXTERNAL").map(_ => "external" -> "true")
    (base ++ external ++ entry.map(e => "owner" -> e.owner).filter(_._2.nonEmpty)).asJava
  }

  // A catalog table streams through its own STREAMING_WRITE ([[DeltaStreamingWrite]]:
  // `toTable(name)` needs it), and so does a path the catalog resolves (`byName`:
  // `toTable("delta.`/path`")`, the way into a path in real-time mode). The provider's
  // table for `start(path)` reports none, so Spark runs it through the V1 sink
  // ([[DeltaSink]]), which checks the stream's settings inside start();
  // `deltaflow.write.nativeWrite=false` keeps the Python sink.
  override def capabilities(): util.Set[TableCapability] = {
    val base = Set(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ,
      TableCapability.V1_BATCH_WRITE, TableCapability.TRUNCATE,
      TableCapability.OVERWRITE_BY_FILTER, TableCapability.OVERWRITE_DYNAMIC)
    val streams = entry.isDefined || byName || DeltaTable.pythonSink
    (if (streams) base + TableCapability.STREAMING_WRITE else base).asJava
  }

  /** `TRUNCATE TABLE` (how Spark's declarative pipelines empty a materialized view before
   *  its refresh): one commit that removes every file, schema and properties kept. */
  override def truncateTable(): Boolean = DeltaTruncate.truncate(info)

  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder = {
    if (!info.exists) {
      throw DeltaflowException.of("TableNotFoundError",
        s"No Delta table at ${info.uri}: the path has no _delta_log. Write one first " +
          "(df.write.format('delta').save(path)) or check the path.",
        Map("table_uri" -> info.uri))
    }
    if (info.route == "jvm") return new DeltaScanBuilder(info, options)
    // A catalog table's scan options do not name its location; the table does.
    val withPath = new java.util.HashMap[String, String](options)
    withPath.putAll(options.asCaseSensitiveMap())
    withPath.put("path", info.uri)
    PythonDelegate.table(withPath).newScanBuilder(new CaseInsensitiveStringMap(withPath))
  }

  override def newWriteBuilder(writeInfo: LogicalWriteInfo): WriteBuilder =
    new DeltaWriteBuilder(info, writeInfo)
}

object DeltaTable {
  private[spark] def pythonSink: Boolean =
    org.apache.spark.sql.SparkSession.getActiveSession
      .orElse(org.apache.spark.sql.SparkSession.getDefaultSession)
      .flatMap(_.conf.getOption("deltaflow.write.nativeWrite"))
      .exists(_.trim.equalsIgnoreCase("false"))
}

/**
 * Writes Spark plans against the table itself (SQL `INSERT [OVERWRITE] INTO` a view
 * or catalog table of it; `toTable(name)` streams). Batch: a V1 write, so the DataFrame
 * reaches [[DeltaBatchWrite]] whole. Streaming: [[DeltaStreamingWrite]]; the Python data
 * source's sink for tables the brain routes `python` or with `deltaflow.write.nativeWrite=false`.
 * Update output mode streams append (`SupportsStreamingUpdateAsAppend`): a query with
 * per-key state is refused at `start()` ([[StreamWriteCheck]]).
 */
class DeltaWriteBuilder(info: TableInfo, writeInfo: LogicalWriteInfo)
  extends WriteBuilder with SupportsOverwrite with SupportsDynamicOverwrite
  with SupportsStreamingUpdateAsAppend {
  private var overwrite = false
  // INSERT OVERWRITE t PARTITION (p = v): the rows to replace, as a replaceWhere predicate.
  private var replaceWhere: Option[String] = None
  private var dynamic = false

  override def truncate(): WriteBuilder = { overwrite = true; this }

  override def overwrite(filters: Array[Filter]): WriteBuilder = {
    overwrite = true
    val predicates = filters.filterNot(_.isInstanceOf[AlwaysTrue]).map(FilterSql.of)
    replaceWhere = if (predicates.isEmpty) None else Some(predicates.mkString(" AND "))
    this
  }

  // df.writeTo(t).overwritePartitions(), INSERT OVERWRITE with
  // spark.sql.sources.partitionOverwriteMode=dynamic.
  override def overwriteDynamicPartitions(): WriteBuilder = {
    overwrite = true
    dynamic = true
    this
  }

  private def refusePartitionOverwrite(): Unit =
    if (replaceWhere.isDefined || dynamic) {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"A stream into ${info.uri} cannot overwrite partitions; streams append (or " +
          "complete-mode overwrite the whole table).",
        Map("table_uri" -> info.uri, "feature" -> "streamingPartitionOverwrite"))
    }

  override def build(): Write = new V1Write {
    override def description(): String = s"DeltaWrite delta.`${info.uri}`"

    override def toInsertableRelation: InsertableRelation = (data: DataFrame, ow: Boolean) => {
      val options = writeInfo.options().asCaseSensitiveMap().asScala.toMap +
        ("path" -> info.uri) ++ replaceWhere.map("replaceWhere" -> _) ++
        (if (dynamic) Map("partitionOverwriteMode" -> "dynamic") else Map.empty)
      DeltaBatchWrite.save(data, if (overwrite || ow) SaveMode.Overwrite else SaveMode.Append,
        options)
    }

    override def toStreaming: StreamingWrite = DeltaflowException.surfaced {
      refusePartitionOverwrite()
      if (info.route != "python" && !DeltaTable.pythonSink) {
        new DeltaStreamingWrite(info, writeInfo, overwrite)
      } else {
        val delegate = PythonDelegate.writeTable(writeInfo).newWriteBuilder(writeInfo)
        val builder =
          if (overwrite) delegate.asInstanceOf[SupportsTruncate].truncate() else delegate
        new SurfacedStreamingWrite(builder.build().toStreaming)
      }
    }
  }
}

/**
 * The Python data source's table for a table the brain routes `python` (an object store),
 * whose writes always know the table's location. A SQL `INSERT INTO delta.`s3://b/t``
 * writes with no options at all, so the Python writer would not know where the table is;
 * the location comes from the table here, as `df.write.save(uri)` passes it.
 *
 * Writes go the way [[DeltaTable]]'s do ([[DeltaWriteBuilder]]: batches through
 * [[DeltaBatchWrite]], which hands the brain's `python` route to the Python data source
 * with the location; streams to the Python sink), and the table reports the Delta
 * table's partition columns: `INSERT OVERWRITE ... PARTITION (p = v)` and dynamic
 * partition overwrites then mean what they do on a local table (a Python data source
 * reports no partitioning and takes only whole-table overwrites).
 */
class LocatedPythonTable(delegate: Table with SupportsRead with SupportsWrite, private[spark] val info: TableInfo)
  extends Table with SupportsRead with SupportsWrite {
  // The Python source's name: SQL DML (dml/SqlDml.scala) knows these tables by it.
  override def name(): String = delegate.name()
  override def schema(): StructType = delegate.schema()
  override def partitioning(): Array[Transform] =
    info.partitionColumns.map(c => Expressions.identity(c): Transform).toArray
  override def properties(): util.Map[String, String] = delegate.properties()
  override def capabilities(): util.Set[TableCapability] =
    (delegate.capabilities().asScala ++ Set(TableCapability.V1_BATCH_WRITE,
      TableCapability.TRUNCATE, TableCapability.OVERWRITE_BY_FILTER,
      TableCapability.OVERWRITE_DYNAMIC)).asJava

  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder =
    delegate.newScanBuilder(options)

  override def newWriteBuilder(writeInfo: LogicalWriteInfo): WriteBuilder = {
    val options = new util.HashMap[String, String](writeInfo.options().asCaseSensitiveMap())
    if (!writeInfo.options().containsKey("path")) options.put("path", info.uri)
    val located = new CaseInsensitiveStringMap(options)
    new DeltaWriteBuilder(info, new LogicalWriteInfo {
      override def options(): CaseInsensitiveStringMap = located
      override def queryId(): String = writeInfo.queryId()
      override def schema(): StructType = writeInfo.schema()
      override def rowIdSchema(): java.util.Optional[StructType] = writeInfo.rowIdSchema()
      override def metadataSchema(): java.util.Optional[StructType] = writeInfo.metadataSchema()
    })
  }
}

/**
 * The Python sink's streaming write, raising the deltaflow error a Python worker's
 * failure carries as a [[DeltaflowException]]: the query then fails with deltaflow's
 * message first, not Spark's `PYTHON_DATA_SOURCE_ERROR` and a Python traceback.
 */
class SurfacedStreamingWrite(delegate: StreamingWrite) extends StreamingWrite {
  override def createStreamingWriterFactory(info: PhysicalWriteInfo): StreamingDataWriterFactory =
    DeltaflowException.surfaced(delegate.createStreamingWriterFactory(info))

  override def useCommitCoordinator(): Boolean = delegate.useCommitCoordinator()

  override def commit(epochId: Long, messages: Array[WriterCommitMessage]): Unit =
    DeltaflowException.surfaced(delegate.commit(epochId, messages))

  override def abort(epochId: Long, messages: Array[WriterCommitMessage]): Unit =
    DeltaflowException.surfaced(delegate.abort(epochId, messages))

  override def toString: String = delegate.toString
}

/**
 * deltaflow's Python data source, under [[Name]], for what the JVM face does not do yet
 * (change-feed reads, object stores, `replaceWhere` and partition overwrites, Python
 * sinks). `deltaflow.register()` registers it in a PySpark session; in any other session
 * (a Connect client's, a Thrift connection's, `spark-sql`'s) the brain registers it, with
 * `cloudFiles`, the first time the session needs it (`session.sources`).
 */
object PythonDelegate {
  val Name = "deltaflow_python"

  def table(options: util.Map[String, String]): Table with SupportsRead with SupportsWrite = {
    requireRegistered(Option(options.get("path")).getOrElse("(no path)"))
    val provider = new PythonDataSourceV2()
    provider.setShortName(Name)
    val map = new CaseInsensitiveStringMap(options)
    provider.getTable(provider.inferSchema(map), provider.inferPartitioning(map), options)
      .asInstanceOf[Table with SupportsRead with SupportsWrite]
  }

  /** The Python source's table for a write, made with the query's schema (the source
   *  takes external metadata, so no table needs to exist yet). */
  def writeTable(writeInfo: LogicalWriteInfo): Table with SupportsWrite = {
    val options = writeInfo.options().asCaseSensitiveMap()
    requireRegistered(Option(options.get("path")).getOrElse("(no path)"))
    val provider = new PythonDataSourceV2()
    provider.setShortName(Name)
    provider.getTable(writeInfo.schema(), Array.empty[Transform], options)
      .asInstanceOf[Table with SupportsWrite]
  }

  /** Makes sure the active session has the Python data source: the brain registers it
   *  when it is missing. Fails typed if it still is (the brain could not reach this JVM). */
  def requireRegistered(path: String): Unit = {
    val spark = org.apache.spark.sql.classic.SparkSession.active
    val manager = spark.sessionState.dataSourceManager
    if (!manager.dataSourceExists(Name)) {
      val args = Brain.newArgs()
      args.put("path", path)
      Brain.callInSession("session.sources", args, spark)
    }
    if (!manager.dataSourceExists(Name)) {
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"Writing a stream to $path, reading its change feed, an object store, or a write " +
          "the connector does not take yet (replaceWhere, partition overwrite) needs " +
          "deltaflow's Python data source, and the brain could not register it in this " +
          "session. The Spark driver's log says why; deltaflow.register(spark) registers " +
          "it from a PySpark session.",
        Map("table_uri" -> path, "feature" -> "pythonDataSource"))
    }
  }
}
