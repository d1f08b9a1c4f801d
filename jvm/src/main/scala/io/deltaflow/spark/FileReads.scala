package io.deltaflow.spark

import java.io.{DataInputStream, DataOutputStream, ObjectInputStream}
import java.util.Locale

import scala.jdk.CollectionConverters._

import com.esotericsoftware.kryo.{Kryo, KryoSerializable}
import com.esotericsoftware.kryo.io.{Input, Output}
import com.fasterxml.jackson.databind.JsonNode
import org.apache.hadoop.fs.Path
import org.apache.hadoop.mapred.JobConf

import org.apache.spark.paths.SparkPath
import org.apache.spark.sql.catalyst.{InternalRow, ProjectingInternalRow}
import org.apache.spark.sql.catalyst.expressions.{Cast, Literal, UnsafeProjection}
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.connector.read.{InputPartition, PartitionReader, PartitionReaderFactory}
import org.apache.spark.sql.deltaflow.{MissingFileSignal, MissingFileWatch}
import org.apache.spark.sql.execution.datasources.{FilePartition, PartitionedFile}
import org.apache.spark.sql.execution.datasources.parquet.{ParquetOptions, ParquetUtils}
import org.apache.spark.sql.execution.datasources.v2.parquet.ParquetPartitionReaderFactory
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types._
import org.apache.spark.sql.vectorized.ColumnarBatch
import org.apache.spark.unsafe.types.UTF8String
import org.apache.spark.util.SerializableConfiguration

/**
 * One data file the brain planned for a batch scan or a micro-batch: its location (an
 * absolute, percent-decoded path or URI, as Hadoop's `Path(String)` takes it), size,
 * partition values (Delta's serialized strings, null for null) and deleted row indexes.
 * A change-feed file also carries its change ([[ChangeInfo]]); with `keepOnly`,
 * `deleted` lists the only rows to read instead (a deletion vector pair's difference).
 */
case class ScanFile(location: String, size: Long, partitionValues: Map[String, String],
    deleted: Array[Long], modificationTime: Long = 0L, change: Option[ChangeInfo] = None,
    keepOnly: Boolean = false)

object ScanFile {
  def fromJson(node: JsonNode): ScanFile = {
    val values = node.get("partitionValues").properties().asScala.map(e =>
      e.getKey -> (if (e.getValue.isNull) null else e.getValue.asText())).toMap
    def longs(key: String) = Option(node.get(key)).map(_.elements().asScala.map(_.asLong()).toArray)
    val kept = longs("kept")
    ScanFile(node.get("location").asText(), node.get("size").asLong(), values,
      kept.orElse(longs("deleted")).getOrElse(Array.empty), node.path("modificationTime").asLong(0L),
      ChangeInfo.fromJson(node.get("change")), keepOnly = kept.isDefined)
  }
}

/**
 * How files of a table are read for a given output: data columns (logical and physical
 * names) and the partition columns, which Spark's reader appends after them in the
 * table's order; then `constants` (the change feed's per-file columns, [[ChangeFeed]]);
 * then `_metadata` when the output asks for it ([[FileMetadata]]).
 */
case class ReadLayout(info: TableInfo, required: StructType, constants: Seq[StructField] = Nil) {
  private val partitionNames = info.partitionColumns.map(_.toLowerCase(Locale.ROOT)).toSet
  private def isPartition(f: StructField) = partitionNames.contains(f.name.toLowerCase(Locale.ROOT))
  // Spark's `_metadata` column, unless the table has a column of that name.
  private val metadataColumn: Option[StructField] = required.fields.find(f =>
    f.name == FileMetadata.Name && !info.schema.fieldNames.exists(_.equalsIgnoreCase(f.name)))
  /** The `_metadata` fields the output asks for, in its order. */
  val metadataFields: Array[StructField] =
    metadataColumn.map(_.dataType.asInstanceOf[StructType].fields).getOrElse(Array.empty)

  private val constantNames = constants.map(_.name).toSet
  val dataFields: Array[StructField] = required.fields.filterNot(f =>
    isPartition(f) || metadataColumn.contains(f) || constantNames.contains(f.name))
  val partitionFields: Array[StructField] = info.schema.fields.filter(isPartition).filter(f =>
    required.fields.exists(_.name.equalsIgnoreCase(f.name)))
  val readSchema: StructType =
    StructType(dataFields ++ partitionFields ++ constants ++ metadataColumn)
  /** For each column of `required`, its position in what the reader emits (data columns,
   *  then partition columns); None when the two orders agree. */
  val requiredOrder: Option[Array[Int]] = {
    val positions = required.fields.map(f => readSchema.fieldNames.indexWhere(_.equalsIgnoreCase(f.name)))
    if (positions.sameElements(positions.indices)) None else Some(positions)
  }
  /** What the Parquet reader appends after the data columns: partition values, then the
   *  `_metadata` fields as constant columns. */
  val partitionSchema: StructType =
    StructType(partitionFields ++ constants ++ FileMetadata.leaves(metadataFields))
  lazy val physicalData: StructType =
    SchemaMapping.physical(StructType(dataFields), info.schema, info.physicalSchema)
  // Plus data columns the table's schema lacks (a cdc file's `_change_type`).
  lazy val physicalTable: StructType = StructType(info.physicalSchema.fields.filterNot(f =>
    partitionNames.contains(f.name.toLowerCase(Locale.ROOT))) ++
    dataFields.filterNot(f => info.schema.fieldNames.exists(_.equalsIgnoreCase(f.name))))

  /** The constant columns of the split [start, start + length) of `file`. */
  def partitionRow(file: ScanFile, start: Long, length: Long): InternalRow =
    if (metadataFields.isEmpty && constants.isEmpty) partitionRow(file.partitionValues)
    else InternalRow.fromSeq(partitionRow(file.partitionValues).toSeq(StructType(partitionFields)) ++
      ChangeFeed.values(constants, file) ++ FileMetadata.values(metadataFields, file, start, length))

  def partitionRow(values: Map[String, String]): InternalRow = {
    val byName = values.map { case (k, v) => k.toLowerCase(Locale.ROOT) -> v }
    InternalRow.fromSeq(partitionFields.toSeq.map { f =>
      byName.get(f.name.toLowerCase(Locale.ROOT)).flatMap(Option(_)) match {
        case None => null
        case Some(text) if f.dataType == StringType => UTF8String.fromString(text)
        case Some("") => null
        case Some(text) =>
          Cast(Literal(UTF8String.fromString(text)), f.dataType, Some("UTC")).eval()
      }
    })
  }
}

/** Planned files into Spark tasks, and the reader factory over Spark's Parquet reader. */
object FileReads {
  /** Tasks as Spark's file scans make them (split, bin-packed with the open cost); a file
   *  with deleted rows is read whole in a task of its own, its rows counted from the first. */
  def partitions(spark: SparkSession, files: Seq[ScanFile], layout: ReadLayout)
      : Array[InputPartition] = {
    if (files.isEmpty) return Array.empty
    if (files.exists(_.deleted.nonEmpty)) {
      return files.zipWithIndex.map { case (f, i) =>
        DeltaInputPartition(FilePartition(i, Array(partitioned(f, 0, f.size, layout))),
          Array(f.deleted)): InputPartition
      }.toArray
    }
    val conf = spark.sessionState.conf
    val totalBytes = files.map(_.size + conf.filesOpenCostInBytes).sum
    val parallelism = math.max(1, spark.sparkContext.defaultParallelism)
    val maxSplit = math.min(conf.filesMaxPartitionBytes,
      math.max(conf.filesOpenCostInBytes, totalBytes / parallelism))
    val splits = files.flatMap { f =>
      (0L until math.max(f.size, 1L) by maxSplit).map(start =>
        partitioned(f, start, math.min(maxSplit, f.size - start), layout))
    }.sortBy(-_.length)
    FilePartition.getFilePartitions(spark, splits, maxSplit).map(p =>
      DeltaInputPartition(p, Array.empty): InputPartition).toArray
  }

  /** `f` read whole, in one task of its own (its deleted rows, if any, left out). */
  def wholeFile(f: ScanFile, layout: ReadLayout): DeltaInputPartition =
    DeltaInputPartition(FilePartition(0, Array(partitioned(f, 0, f.size, layout))), Array(f.deleted),
      Array(f.keepOnly))

  private def partitioned(f: ScanFile, start: Long, length: Long, layout: ReadLayout) =
    PartitionedFile(layout.partitionRow(f, start, length), SparkPath.fromPath(new Path(f.location)),
      start, length, Array.empty[String], f.modificationTime, f.size, Map.empty)

  /** Spark's vectorized Parquet reader for `layout`; row mode when files have deleted rows
   *  (the pushed filters then stay out of the reader, so no row group is skipped).
   *  `inRequiredOrder`: emit `layout.required`'s column order (a stream's output is the
   *  table's columns in order; a batch scan declares its own via `readSchema`).
   *  `missing`: raised when a task fails on a missing file ([[MissingFileSignal]]). */
  def readerFactory(spark: SparkSession, layout: ReadLayout, withDeletes: Boolean,
      pushed: Array[Filter], inRequiredOrder: Boolean = false,
      hadoopOptions: Map[String, String] = Map.empty,
      missing: Option[MissingFileSignal] = None): PartitionReaderFactory = {
    val sqlConf = spark.sessionState.conf
    val hadoopConf = spark.sessionState.newHadoopConfWithOptions(hadoopOptions)
    ParquetConf.prepare(hadoopConf, sqlConf, layout.physicalData)
    // Files read row by row (deleted rows, the real-time source) with Spark's vectorized
    // reader are opened file by file as batches (see DeltaReaderFactory), under a shared
    // JobConf: nothing is pushed into that reader, so nothing writes to its configuration,
    // and Spark's copy of it for every file it opens is not needed (docs/notes/rtm-open.md).
    val fileByFile = withDeletes && ParquetUtils.isBatchReadSupportedForSchema(sqlConf,
      StructType(layout.partitionSchema.fields ++ layout.physicalData.fields))
    val conf = if (fileByFile) new SharedJobConf(new JobConf(hadoopConf))
      else new SerializableConfiguration(hadoopConf)
    val broadcast = spark.sparkContext.broadcast[SerializableConfiguration](conf)
    val parquet = ParquetPartitionReaderFactory(sqlConf, broadcast, layout.physicalTable,
      layout.physicalData, layout.partitionSchema,
      if (withDeletes) Array.empty[Filter] else pushed, None,
      new ParquetOptions(Map.empty[String, String], sqlConf))
    val order = if (inRequiredOrder) layout.requiredOrder else None
    val metadata = if (layout.metadataFields.isEmpty) None else Some((layout.metadataFields,
      (layout.physicalData.fields ++ layout.partitionSchema.fields).map(_.dataType).toSeq))
    val batches = if (!fileByFile) None
      else Some(StructType(layout.physicalData.fields ++ layout.partitionSchema.fields))
    new DeltaReaderFactory(parquet, withDeletes, order.map(o => (layout.required, o)), metadata,
      batches, missing)
  }
}

/** The files of one task and, per file (in order), the sorted indexes of deleted rows, or
 *  with `keepOnly` set for the file, of the only rows to read. */
case class DeltaInputPartition(files: FilePartition, deleted: Array[Array[Long]],
    keepOnly: Array[Boolean] = Array.empty) extends InputPartition {
  override def preferredLocations(): Array[String] = files.preferredLocations()
}

/** Spark's Parquet reader, with rows removed by deletion vectors left out and, given
 *  `reorder` (output schema, reader position of each output column), columns reordered.
 *  With `batches` (what the vectorized reader emits: data columns, then partition
 *  columns), a row-by-row read opens each file as batches and makes its rows into
 *  `UnsafeRow`s with one projection per thread, where Spark's row reader generates that
 *  projection's code anew for every file (about a quarter of opening a small file, which
 *  the real-time source does for every commit: docs/notes/rtm-open.md). */
class DeltaReaderFactory(
    parquet: ParquetPartitionReaderFactory,
    withDeletes: Boolean,
    reorder: Option[(StructType, Array[Int])],
    metadata: Option[(Array[StructField], Seq[DataType])] = None,
    batches: Option[StructType] = None,
    missing: Option[MissingFileSignal] = None)
  extends PartitionReaderFactory {

  // A projection keeps its output row between calls, so each thread has its own.
  @transient private lazy val unsafeRows: ThreadLocal[UnsafeProjection] = {
    val attributes = DataTypeUtils.toAttributes(batches.get)
    ThreadLocal.withInitial(() => UnsafeProjection.create(attributes, attributes))
  }

  /** One file's rows, as Spark's row reader gives them. */
  private def openRows(file: PartitionedFile): PartitionReader[InternalRow] =
    if (batches.isEmpty) parquet.buildReader(file)
    else new BatchRows(parquet.buildColumnarReader(file), unsafeRows.get())

  private def files(p: InputPartition) = p.asInstanceOf[DeltaInputPartition].files

  override def supportColumnarReads(partition: InputPartition): Boolean =
    !withDeletes && parquet.supportColumnarReads(files(partition))

  private def watched[T](reader: PartitionReader[T]): PartitionReader[T] =
    missing.fold(reader)(signal => new MissingFileWatch(reader, signal))

  override def createColumnarReader(partition: InputPartition): PartitionReader[ColumnarBatch] =
    watched(columnarReader(partition))

  override def createReader(partition: InputPartition): PartitionReader[InternalRow] =
    watched(rowReader(partition))

  private def columnarReader(partition: InputPartition): PartitionReader[ColumnarBatch] = {
    val read = parquet.createColumnarReader(files(partition))
    val reader = metadata.fold(read) { case (fields, _) => FileMetadata.collapse(read, fields) }
    reorder match {
      case None => reader
      case Some((_, order)) => new PartitionReader[ColumnarBatch] {
        override def next(): Boolean = reader.next()
        override def get(): ColumnarBatch = {
          val batch = reader.get()
          new ColumnarBatch(order.map(batch.column), batch.numRows())
        }
        override def close(): Unit = reader.close()
      }
    }
  }

  private def rowReader(partition: InputPartition): PartitionReader[InternalRow] = {
    val p = partition.asInstanceOf[DeltaInputPartition]
    val read =
      if (!withDeletes) parquet.createReader(p.files) else new DeletedRowsReader(p, openRows)
    val reader = metadata.fold(read) { case (fields, types) =>
      FileMetadata.collapseRows(read, types, fields)
    }
    reorder match {
      case None => reader
      case Some((schema, order)) => new PartitionReader[InternalRow] {
        private val row = ProjectingInternalRow(schema, order.toSeq)
        override def next(): Boolean = reader.next()
        override def get(): InternalRow = { row.project(reader.get()); row }
        override def close(): Unit = reader.close()
      }
    }
  }
}

/** Reads each file of a partition whole, in row order (`open`), skipping its deleted rows
 *  (or, for a keep-only file, every row but the listed ones). */
class DeletedRowsReader(
    partition: DeltaInputPartition,
    open: PartitionedFile => PartitionReader[InternalRow])
  extends PartitionReader[InternalRow] {
  private var fileIndex = -1
  private var current: PartitionReader[InternalRow] = _
  private var deleted: Array[Long] = Array.empty
  private var nextDeleted = 0
  private var keep = false
  private var row = -1L

  private def openNext(): Boolean = {
    if (current != null) current.close()
    fileIndex += 1
    if (fileIndex >= partition.files.files.length) { current = null; return false }
    current = open(partition.files.files(fileIndex))
    // A partition planned without deleted rows (none of its files has any) has none.
    deleted = if (fileIndex < partition.deleted.length) partition.deleted(fileIndex) else Array.empty
    keep = fileIndex < partition.keepOnly.length && partition.keepOnly(fileIndex)
    nextDeleted = 0
    row = -1L
    true
  }

  override def next(): Boolean = {
    if (current == null && !openNext()) return false
    while (true) {
      // A keep-only file past its last listed row has nothing more to give.
      if (keep && nextDeleted >= deleted.length) {
        if (!openNext()) return false
      } else if (current.next()) {
        row += 1
        while (nextDeleted < deleted.length && deleted(nextDeleted) < row) nextDeleted += 1
        val listed = nextDeleted < deleted.length && deleted(nextDeleted) == row
        if (listed) nextDeleted += 1
        if (listed == keep) return true
      } else if (!openNext()) {
        return false
      }
    }
    false
  }

  override def get(): InternalRow = current.get()

  override def close(): Unit = if (current != null) current.close()
}


/** The rows of `batches`, each made an `UnsafeRow` by `unsafe` (its output is reused, as
 *  Spark's row reader reuses its own). */
class BatchRows(batches: PartitionReader[ColumnarBatch], unsafe: UnsafeProjection)
  extends PartitionReader[InternalRow] {
  private var batch: ColumnarBatch = _
  private var row = 0

  override def next(): Boolean = {
    row += 1
    while (batch == null || row >= batch.numRows()) {
      if (!batches.next()) return false
      batch = batches.get()
      row = 0
    }
    true
  }

  override def get(): InternalRow = unsafe(batch.getRow(row))

  override def close(): Unit = batches.close()
}

/** A Hadoop configuration broadcast as a `JobConf`, and a `JobConf` again where it is
 *  deserialized (Spark's holder gives back a plain `Configuration`), so that Spark's
 *  Parquet reader takes it as it is for each file instead of copying it. Only for readers
 *  that write nothing to their configuration (no pushed filter; the vectorized reader). */
class SharedJobConf(conf: JobConf) extends SerializableConfiguration(conf) with KryoSerializable {
  // Java serialization: Spark's holder has read a plain Configuration into `value`.
  private def readObject(in: ObjectInputStream): Unit = {
    in.defaultReadObject()
    value = new JobConf(value)
  }

  // Kryo (spark.serializer): Spark registers its own holder, not this subclass, which Kryo
  // would otherwise write field by field, leaving out the (transient) configuration.
  override def write(kryo: Kryo, out: Output): Unit = {
    val data = new DataOutputStream(out)
    value.write(data)
    data.flush()
  }

  override def read(kryo: Kryo, in: Input): Unit = {
    val read = new JobConf(false)
    read.readFields(new DataInputStream(in))
    value = read
  }
}
