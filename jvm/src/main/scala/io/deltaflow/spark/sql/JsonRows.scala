package io.deltaflow.spark.sql

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode

import org.apache.spark.sql.Row
import org.apache.spark.sql.types._

import io.deltaflow.spark.DeltaflowException

/**
 * The brain's rows (JSON) as Spark rows of a schema: a row or struct is an array in field
 * order, a map an object, an array an array; timestamps are epoch milliseconds, dates
 * `yyyy-mm-dd`; JSON null is SQL NULL.
 */
object JsonRows {
  def toRows(rows: JsonNode, schema: StructType): Seq[Row] =
    if (rows == null || rows.isNull) Nil
    else rows.elements().asScala.map(toRow(_, schema)).toSeq

  def toRow(node: JsonNode, schema: StructType): Row = {
    if (!node.isArray || node.size() != schema.length) {
      throw mismatch(s"a row of ${schema.length} values", node, schema)
    }
    Row.fromSeq(schema.fields.indices.map(i => value(node.get(i), schema(i).dataType)))
  }

  def value(node: JsonNode, dataType: DataType): Any = {
    if (node == null || node.isNull) return null
    dataType match {
      case _: StringType => if (node.isTextual) node.asText() else node.toString
      case LongType => node.asLong()
      case IntegerType => node.asInt()
      case ShortType => node.asInt().toShort
      case ByteType => node.asInt().toByte
      case DoubleType => node.asDouble()
      case FloatType => node.asDouble().toFloat
      case BooleanType => node.asBoolean()
      case _: DecimalType => new java.math.BigDecimal(node.asText())
      case TimestampType => new java.sql.Timestamp(node.asLong())
      case DateType => java.sql.Date.valueOf(node.asText())
      case ArrayType(element, _) => node.elements().asScala.map(value(_, element)).toSeq
      case MapType(_: StringType, valueType, _) =>
        node.properties().asScala.map(e => e.getKey -> value(e.getValue, valueType)).toMap
      case struct: StructType => toRow(node, struct)
      case other => throw mismatch(s"a value of a supported type", node, other)
    }
  }

  private def mismatch(expected: String, node: JsonNode, dataType: DataType) =
    DeltaflowException.of("BridgeError",
      s"deltaflow's Python side answered ${node.toString.take(200)} where $expected of " +
        s"${dataType.simpleString} was due. The connector jar and the Python package are from " +
        "different deltaflow versions: reinstall deltaflow.",
      Map("operation" -> "rows"))
}
