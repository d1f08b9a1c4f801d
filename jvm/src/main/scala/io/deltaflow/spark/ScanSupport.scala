package io.deltaflow.spark

import java.util.Locale

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode
import org.apache.hadoop.conf.Configuration

import org.apache.spark.sql.catalyst.parser.CatalystSqlParser
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.sources._
import org.apache.spark.sql.types._

/**
 * Pushed filters in the brain's JSON form (`deltaflow/spark/bridge/_server.py` reads them):
 * `{"op": "=", "column": ["a", "b"], "value": v}` with `op` one of = <=> > >= < <= in
 * is_null is_not_null starts_with, and `{"op": "not", "child": {...}}`. Values that JSON
 * `{"op": "or" | "and", "children": [...]}`. Values that JSON
 * cannot carry as themselves are tagged: `{"date": "2024-01-31"}`,
 * `{"timestamp_us": 1706659200000000}`, `{"decimal": "12.50"}`.
 */
object FilterJson {
  def convertible(f: Filter): Boolean = toJson(f).nonEmpty

  def toJson(f: Filter): Option[JsonNode] = {
    def cmp(op: String, attr: String, value: Any): Option[JsonNode] =
      column(attr).flatMap(c => encode(value).map { v =>
        val n = node(op, c)
        n.set[JsonNode]("value", v)
        n
      })
    f match {
      case EqualTo(a, v) => cmp("=", a, v)
      case EqualNullSafe(a, v) => cmp("<=>", a, v)
      case GreaterThan(a, v) => cmp(">", a, v)
      case GreaterThanOrEqual(a, v) => cmp(">=", a, v)
      case LessThan(a, v) => cmp("<", a, v)
      case LessThanOrEqual(a, v) => cmp("<=", a, v)
      case StringStartsWith(a, v) => cmp("starts_with", a, v)
      case IsNull(a) => column(a).map(node("is_null", _))
      case IsNotNull(a) => column(a).map(node("is_not_null", _))
      case In(a, values) =>
        val encoded = values.toSeq.map(encode)
        if (encoded.exists(_.isEmpty)) None
        else column(a).map { c =>
          val n = node("in", c)
          val arr = n.putArray("value")
          encoded.flatten.foreach(arr.add)
          n
        }
      case Or(left, right) =>
        for (l <- toJson(left); r <- toJson(right)) yield group("or", Seq(l, r))
      case And(left, right) =>
        // Under an OR: the convertible side alone is a weaker, still safe condition.
        (toJson(left), toJson(right)) match {
          case (Some(l), Some(r)) => Some(group("and", Seq(l, r)))
          case (l, r) => l.orElse(r)
        }
      case Not(child @ (_: EqualTo | _: EqualNullSafe | _: GreaterThan | _: GreaterThanOrEqual |
          _: LessThan | _: LessThanOrEqual | _: In | _: IsNull | _: IsNotNull |
          _: StringStartsWith)) =>
        toJson(child).map { c =>
          val n = Brain.json.createObjectNode()
          n.put("op", "not")
          n.set[JsonNode]("child", c)
          n
        }
      case _ => None
    }
  }

  private def group(op: String, children: Seq[JsonNode]): JsonNode = {
    val n = Brain.json.createObjectNode()
    n.put("op", op)
    val arr = n.putArray("children")
    children.foreach(arr.add)
    n
  }

  private def node(op: String, column: Seq[String]): ObjectNode = {
    val n = Brain.json.createObjectNode()
    n.put("op", op)
    val arr = n.putArray("column")
    column.foreach(arr.add)
    n
  }

  private def column(attribute: String): Option[Seq[String]] =
    try Some(CatalystSqlParser.parseMultipartIdentifier(attribute))
    catch { case _: Exception => None }

  private def encode(value: Any): Option[JsonNode] = {
    val f = Brain.json.getNodeFactory
    value match {
      case null => Some(f.nullNode())
      case b: Boolean => Some(f.booleanNode(b))
      case i: Byte => Some(f.numberNode(i.toInt))
      case i: Short => Some(f.numberNode(i.toInt))
      case i: Int => Some(f.numberNode(i))
      case l: Long => Some(f.numberNode(l))
      case d: Float if !d.isNaN && !d.isInfinite => Some(f.numberNode(d.toDouble))
      case d: Double if !d.isNaN && !d.isInfinite => Some(f.numberNode(d))
      case s: String => Some(f.textNode(s))
      case d: java.math.BigDecimal => Some(tagged("decimal", f.textNode(d.toPlainString)))
      case d: java.sql.Date => Some(tagged("date", f.textNode(d.toLocalDate.toString)))
      case d: java.time.LocalDate => Some(tagged("date", f.textNode(d.toString)))
      case t: java.sql.Timestamp => Some(tagged("timestamp_us", f.numberNode(micros(t.toInstant))))
      case t: java.time.Instant => Some(tagged("timestamp_us", f.numberNode(micros(t))))
      case _ => None
    }
  }

  private def micros(i: java.time.Instant): Long =
    Math.addExact(Math.multiplyExact(i.getEpochSecond, 1000000L), i.getNano / 1000L)

  private def tagged(tag: String, value: JsonNode): JsonNode = {
    val n = Brain.json.createObjectNode()
    n.set[JsonNode](tag, value)
    n
  }
}

/** Logical (what users name) to physical (what files store) schemas of column mapping. */
object SchemaMapping {
  /** The physical form of `required`, a pruned subset of `logical` (same shape as `physical`). */
  def physical(required: StructType, logical: StructType, physical: StructType): StructType =
    struct(required, logical, physical)

  private def struct(required: StructType, logical: StructType, physical: StructType) =
    StructType(required.fields.map { f =>
      val i = logical.fields.indexWhere(_.name.equalsIgnoreCase(f.name))
      if (i < 0) f
      else {
        val p = physical.fields(i)
        p.copy(dataType = mapType(f.dataType, logical.fields(i).dataType, p.dataType),
          nullable = f.nullable)
      }
    })

  private def mapType(required: DataType, logical: DataType, physical: DataType): DataType =
    (required, logical, physical) match {
      case (r: StructType, l: StructType, p: StructType) => struct(r, l, p)
      case (r: ArrayType, l: ArrayType, p: ArrayType) =>
        r.copy(elementType = mapType(r.elementType, l.elementType, p.elementType))
      case (r: MapType, l: MapType, p: MapType) =>
        r.copy(keyType = mapType(r.keyType, l.keyType, p.keyType),
          valueType = mapType(r.valueType, l.valueType, p.valueType))
      case (r, _, _) => r
    }
}

/** The Hadoop settings Spark's Parquet scan puts in place before its reader runs. */
object ParquetConf {
  def prepare(conf: Configuration, sqlConf: SQLConf, readSchema: StructType): Unit = {
    conf.set("parquet.read.support.class",
      "org.apache.spark.sql.execution.datasources.parquet.ParquetReadSupport")
    conf.set("org.apache.spark.sql.parquet.row.requested_schema", readSchema.json)
    conf.set("org.apache.spark.sql.parquet.row.attributes", readSchema.json)
    conf.set(SQLConf.SESSION_LOCAL_TIMEZONE.key, sqlConf.sessionLocalTimeZone)
    for ((key, default) <- Seq(
        SQLConf.NESTED_SCHEMA_PRUNING_ENABLED.key -> "true",
        SQLConf.CASE_SENSITIVE.key -> "false",
        SQLConf.PARQUET_BINARY_AS_STRING.key -> "false",
        SQLConf.PARQUET_INT96_AS_TIMESTAMP.key -> "true",
        SQLConf.PARQUET_INFER_TIMESTAMP_NTZ_ENABLED.key -> "true",
        SQLConf.LEGACY_PARQUET_NANOS_AS_LONG.key -> "false",
        SQLConf.PARQUET_FIELD_ID_READ_ENABLED.key -> "false")) {
      conf.set(key, sqlConf.getConfString(key, default).toLowerCase(Locale.ROOT))
    }
  }
}
