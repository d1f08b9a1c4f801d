package io.deltaflow.spark

import org.apache.spark.paths.SparkPath
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{BoundReference, CreateNamedStruct, Expression, Literal, UnsafeProjection}
import org.apache.spark.sql.connector.catalog.MetadataColumn
import org.apache.spark.sql.connector.read.PartitionReader
import org.apache.spark.sql.types._
import org.apache.spark.sql.vectorized.{ColumnVector, ColumnarArray, ColumnarBatch, ColumnarMap}
import org.apache.spark.unsafe.types.UTF8String

/**
 * Spark's file metadata column, `_metadata`, on a Delta table's batch scan: the data file
 * each row comes from (`file_path`, `file_name`, `file_size`, `file_block_start`,
 * `file_block_length`, `file_modification_time`), as Spark's file sources and delta-spark
 * answer `SELECT _metadata.file_path FROM t`.
 *
 * The values are constant per file, so they travel as Spark's Parquet reader carries
 * partition values: one extra constant column per requested field (named with
 * [[LeafPrefix]]) after the partition columns, which [[FileMetadata.collapse]] then
 * turns into the one `_metadata` struct column of the scan's output.
 */
object FileMetadata {
  val Name = "_metadata"

  val Schema: StructType = StructType(Seq(
    StructField("file_path", StringType, nullable = false),
    StructField("file_name", StringType, nullable = false),
    StructField("file_size", LongType, nullable = false),
    StructField("file_block_start", LongType, nullable = false),
    StructField("file_block_length", LongType, nullable = false),
    StructField("file_modification_time", TimestampType, nullable = false)))

  val column: MetadataColumn = new MetadataColumn {
    override def name(): String = Name
    override def dataType(): DataType = Schema
    override def isNullable: Boolean = false
    override def comment(): String = "The data file each row was read from"
  }

  private val LeafPrefix = "__deltaflow_metadata_"

  /** The constant columns the Parquet reader appends for `fields` of `_metadata`. */
  def leaves(fields: Array[StructField]): Array[StructField] =
    fields.map(f => f.copy(name = LeafPrefix + f.name))

  /** The values of `fields` for the split [start, start + length) of `file`. */
  def values(fields: Array[StructField], file: ScanFile, start: Long, length: Long): Seq[Any] = {
    val path = SparkPath.fromPathString(file.location)
    fields.toSeq.map(_.name match {
      case "file_path" => UTF8String.fromString(path.urlEncoded)
      case "file_name" => UTF8String.fromString(path.toPath.getName)
      case "file_size" => file.size
      case "file_block_start" => start
      case "file_block_length" => length
      case "file_modification_time" => file.modificationTime * 1000L
      case other => throw new IllegalArgumentException(s"_metadata has no field $other")
    })
  }

  /** `reader`'s batches with its last `fields.length` columns made one `_metadata` column. */
  def collapse(reader: PartitionReader[ColumnarBatch], fields: Array[StructField])
      : PartitionReader[ColumnarBatch] = new PartitionReader[ColumnarBatch] {
    private val structType = StructType(fields)
    override def next(): Boolean = reader.next()
    override def get(): ColumnarBatch = {
      val batch = reader.get()
      val kept = batch.numCols() - fields.length
      val columns = (0 until kept).map(batch.column) :+
        new StructOfColumns(structType, (kept until batch.numCols()).map(batch.column).toArray)
      new ColumnarBatch(columns.toArray, batch.numRows())
    }
    override def close(): Unit = reader.close()
  }

  /** `reader`'s rows, of columns `types` (the last `fields.length` being the constant
   *  `_metadata` columns), with those made one struct. */
  def collapseRows(reader: PartitionReader[InternalRow], types: Seq[DataType],
      fields: Array[StructField]): PartitionReader[InternalRow] = new PartitionReader[InternalRow] {
    private val kept = types.length - fields.length
    private val projection = UnsafeProjection.create(
      (0 until kept).map(i => BoundReference(i, types(i), true): Expression) :+
        CreateNamedStruct(fields.toSeq.zipWithIndex.flatMap { case (f, j) =>
          Seq(Literal(f.name), BoundReference(kept + j, f.dataType, f.nullable))
        }))
    override def next(): Boolean = reader.next()
    override def get(): InternalRow = projection(reader.get())
    override def close(): Unit = reader.close()
  }
}

/** A struct column whose fields are other column vectors (all of one batch). */
class StructOfColumns(structType: StructType, children: Array[ColumnVector])
  extends ColumnVector(structType) {
  override def getChild(ordinal: Int): ColumnVector = children(ordinal)
  override def hasNull: Boolean = false
  override def numNulls(): Int = 0
  override def isNullAt(rowId: Int): Boolean = false
  override def close(): Unit = ()
  private def unsupported = throw new UnsupportedOperationException("a struct column")
  override def getBoolean(rowId: Int): Boolean = unsupported
  override def getByte(rowId: Int): Byte = unsupported
  override def getShort(rowId: Int): Short = unsupported
  override def getInt(rowId: Int): Int = unsupported
  override def getLong(rowId: Int): Long = unsupported
  override def getFloat(rowId: Int): Float = unsupported
  override def getDouble(rowId: Int): Double = unsupported
  override def getArray(rowId: Int): ColumnarArray = unsupported
  override def getMap(ordinal: Int): ColumnarMap = unsupported
  override def getDecimal(rowId: Int, precision: Int, scale: Int): Decimal = unsupported
  override def getUTF8String(rowId: Int): UTF8String = unsupported
  override def getBinary(rowId: Int): Array[Byte] = unsupported
}
