package io.deltaflow.spark

import java.util.Locale

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.analysis.{Resolver, UnresolvedRelation}
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference}
import org.apache.spark.sql.catalyst.plans.logical.{AppendData, InsertIntoStatement, LogicalPlan,
  OverwriteByExpression, OverwritePartitionsDynamic, V2WriteCommand}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.connector.catalog.Table
import org.apache.spark.sql.deltaflow.CatalogAccess
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation
import org.apache.spark.sql.util.CaseInsensitiveStringMap
import org.apache.spark.sql.types.{ArrayType, DataType, MapType, StructType}

/**
 * Writes into a catalog Delta table that bring columns it lacks, with schema evolution on:
 * `saveAsTable(t)` / `writeTo(t).append()` with the write option `mergeSchema=true`, and
 * those, `insertInto(t)` (which ignores write options, as delta-spark's does) or SQL
 * `INSERT INTO t` while the session sets delta-spark's
 * `spark.databricks.delta.schema.autoMerge.enabled=true`. By path
 * (`save(path)`) these already evolve: the brain's write plan adds the new columns by name.
 *
 * Spark checks a V2 write's columns against the table's (`ResolveOutputRelation`) in the
 * first pass of its Resolution batch, before any extension rule, and a column the table
 * lacks fails there (`INSERT_COLUMN_ARITY_MISMATCH`, `EXTRA_STRUCT_FIELDS`). delta-spark
 * avoids the check by declaring `ACCEPT_ANY_SCHEMA` and resolving every write itself. This
 * rule changes nothing for a write that needs no evolution: for one that does, it widens the
 * relation the write targets by the new columns (appended, nullable) and nested struct
 * fields, before Spark's check runs. Spark then resolves the write as usual (casts, names,
 * defaults) against the widened columns, and the brain evolves the table's schema.
 *
 *  - A write the DataFrame API builds (`AppendData`, `OverwriteByExpression`, ...) arrives
 *    with its query resolved: this runs with the hint rules, before Resolution. Its table
 *    is resolved too (`saveAsTable`), or named (`writeTo`), and then loaded here.
 *  - SQL `INSERT INTO t` (and `insertInto`) resolves its table in the Resolution batch and
 *    becomes an `AppendData` one pass later: this runs at the end of the pass in between.
 *
 * Spark 4.3's `INSERT WITH SCHEMA EVOLUTION INTO t` asks for the same, statement by statement.
 *
 * New columns are matched by name for by-name writes (nested fields too) and are the
 * query's trailing columns for by-position ones (top level only), as delta-spark does.
 */
class WriteSchemaEvolution(session: SparkSession) extends Rule[LogicalPlan] {
  import WriteSchemaEvolution._

  override def apply(plan: LogicalPlan): LogicalPlan = plan.resolveOperatorsDown {
    case write: V2WriteCommand if write.query.resolved &&
        (declared(write) || evolves(writeOptions(write))) =>
      relationOf(write.table) match {
        case Some(relation) =>
          val wide = widened(relation, write.query.output, write.isByName)
            .map(write.withNewTable).getOrElse(write)
          // The statement's request reaches the brain as the write option it honours.
          if (declared(write)) withMergeSchema(wide) else wide
        case _ => write
      }

    case insert: InsertIntoStatement if insert.query.resolved && insert.partitionSpec.isEmpty &&
        insert.userSpecifiedCols.isEmpty =>
      deltaRelation(insert.table) match {
        case Some(relation) if declared(insert) || evolves(Map.empty) =>
          widened(relation, insert.query.output, insert.byName)
            .map(r => insert.copy(table = r)).getOrElse(insert)
        case _ => insert
      }
  }

  /** Spark 4.3's `INSERT WITH SCHEMA EVOLUTION INTO t ...` (a field older minors lack). */
  private def declared(plan: Product): Boolean =
    plan.productElementNames.zip(plan.productIterator).exists {
      case (name, value) => name == "withSchemaEvolution" && value == true
    }

  private def evolves(options: Map[String, String]): Boolean =
    options.collectFirst { case (k, v) if k.equalsIgnoreCase(MergeSchemaOption) => v } match {
      // An explicit option wins; a value that is neither true nor false goes on to the
      // brain, which refuses it naming the option.
      case Some(value) => value.trim.toLowerCase(Locale.ROOT) != "false"
      case None => session.conf.getOption(AutoMergeConf).exists(_.trim.equalsIgnoreCase("true"))
    }

  /** The write's Delta table. `writeTo(t)` names it unresolved, and Spark resolves it and
   *  checks the write's columns in the same pass: it is loaded here, as Spark would. */
  private def relationOf(table: LogicalPlan): Option[DataSourceV2Relation] = table match {
    case u: UnresolvedRelation if !u.isStreaming =>
      val classic = session.asInstanceOf[org.apache.spark.sql.classic.SparkSession]
      CatalogAccess.loadWriteTarget(classic, u.multipartIdentifier).collect {
        case (catalog, ident, table) if isDelta(table) =>
          // The write's options ride on the command alone, as Spark resolves `writeTo`'s.
          DataSourceV2Relation.create(table, Some(catalog), Some(ident), CaseInsensitiveStringMap.empty())
      }
    case other => deltaRelation(other)
  }

  private def resolver: Resolver = session.sessionState.conf.resolver

  /** The relation with the query's new columns and fields added, or None when it has
   *  every column the query brings. */
  private def widened(relation: DataSourceV2Relation, data: Seq[Attribute],
      byName: Boolean): Option[DataSourceV2Relation] = {
    val existing = relation.output
    val output: Seq[AttributeReference] = if (byName) {
      val kept = existing.map { attr =>
        data.find(d => resolver(d.name, attr.name)) match {
          case Some(d) => attr.withDataType(merged(attr.dataType, d.dataType))
          case None => attr
        }
      }
      kept ++ data.filterNot(d => existing.exists(a => resolver(a.name, d.name))).map(added)
    } else {
      existing ++ data.drop(existing.size).map(added)
    }
    val changed = output.size != existing.size ||
      output.zip(existing).exists { case (a, b) => a.dataType != b.dataType }
    if (changed) Some(relation.copy(output = output)) else None
  }

  private def added(data: Attribute): AttributeReference =
    AttributeReference(data.name, data.dataType, nullable = true)()

  /** The table's type with the data's new struct fields appended, at any depth. */
  private def merged(table: DataType, data: DataType): DataType = (table, data) match {
    case (t: StructType, d: StructType) =>
      val kept = t.fields.map { f =>
        d.fields.find(x => resolver(x.name, f.name))
          .map(x => f.copy(dataType = merged(f.dataType, x.dataType))).getOrElse(f)
      }
      val extra = d.fields.filterNot(x => t.fields.exists(f => resolver(f.name, x.name)))
      StructType(kept ++ extra.map(_.copy(nullable = true)))
    case (t: ArrayType, d: ArrayType) => t.copy(elementType = merged(t.elementType, d.elementType))
    case (t: MapType, d: MapType) =>
      t.copy(keyType = merged(t.keyType, d.keyType), valueType = merged(t.valueType, d.valueType))
    case _ => table
  }
}

object WriteSchemaEvolution {
  private val MergeSchemaOption = "mergeSchema"
  private val AutoMergeConf = "spark.databricks.delta.schema.autoMerge.enabled"

  // A table the brain routes `python` (an object store Hadoop cannot open) is the Python
  // data source's, located; its writes go through the same write plan.
  private def isDelta(table: Table): Boolean =
    table.isInstanceOf[DeltaTable] || table.isInstanceOf[LocatedPythonTable]

  private def deltaRelation(plan: LogicalPlan): Option[DataSourceV2Relation] = plan match {
    case r: DataSourceV2Relation if isDelta(r.table) => Some(r)
    case _ => None
  }

  private def withMergeSchema(write: V2WriteCommand): V2WriteCommand = {
    val options = writeOptions(write)
    if (options.keys.exists(_.equalsIgnoreCase(MergeSchemaOption))) return write
    val more = options + (MergeSchemaOption -> "true")
    write match {
      case a: AppendData => a.copy(writeOptions = more)
      case o: OverwriteByExpression => o.copy(writeOptions = more)
      case o: OverwritePartitionsDynamic => o.copy(writeOptions = more)
      case other => other
    }
  }

  private def writeOptions(write: V2WriteCommand): Map[String, String] = write match {
    case a: AppendData => a.writeOptions
    case o: OverwriteByExpression => o.writeOptions
    case o: OverwritePartitionsDynamic => o.writeOptions
    case _ => Map.empty
  }
}
