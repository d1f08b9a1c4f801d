package io.deltaflow.spark

import org.apache.spark.sql.sources._

/**
 * A V1 data source filter as a SQL predicate the brain's `replaceWhere` parses: what
 * `INSERT OVERWRITE t PARTITION (p = v)` becomes on its way to a Delta table.
 */
object FilterSql {
  def of(filter: Filter): String = filter match {
    case EqualTo(a, v) => s"${column(a)} = ${literal(v)}"
    case EqualNullSafe(a, null) => s"${column(a)} IS NULL"
    case EqualNullSafe(a, v) => s"${column(a)} = ${literal(v)}"
    case IsNull(a) => s"${column(a)} IS NULL"
    case IsNotNull(a) => s"${column(a)} IS NOT NULL"
    case In(a, values) => s"${column(a)} IN (${values.map(literal).mkString(", ")})"
    case GreaterThan(a, v) => s"${column(a)} > ${literal(v)}"
    case GreaterThanOrEqual(a, v) => s"${column(a)} >= ${literal(v)}"
    case LessThan(a, v) => s"${column(a)} < ${literal(v)}"
    case LessThanOrEqual(a, v) => s"${column(a)} <= ${literal(v)}"
    case And(l, r) => s"(${of(l)}) AND (${of(r)})"
    case Or(l, r) => s"(${of(l)}) OR (${of(r)})"
    case Not(c) => s"NOT (${of(c)})"
    case other =>
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"Overwriting the rows where $other is not supported; use " +
          "df.write.format('delta').mode('overwrite').option('replaceWhere', '<predicate>').",
        Map("feature" -> "overwriteByFilter"))
  }

  private def column(name: String): String =
    name.split('.').map(p => "`" + p.replace("`", "``") + "`").mkString(".")

  private def literal(value: Any): String = value match {
    case null => "NULL"
    case s: String => "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
    case d: java.sql.Date => s"DATE '$d'"
    case d: java.time.LocalDate => s"DATE '$d'"
    case t: java.sql.Timestamp => s"TIMESTAMP '$t'"
    case t: java.time.Instant => s"TIMESTAMP '${java.sql.Timestamp.from(t)}'"
    case b: Boolean => if (b) "TRUE" else "FALSE"
    case d: java.math.BigDecimal => d.toPlainString
    case n: Number => n.toString
    case other => "'" + other.toString.replace("'", "\\'") + "'"
  }
}
