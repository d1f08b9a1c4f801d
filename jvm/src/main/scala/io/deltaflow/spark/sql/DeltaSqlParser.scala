package io.deltaflow.spark.sql

import java.lang.reflect.{InvocationHandler, InvocationTargetException, Method, Proxy}

import org.apache.spark.sql.catalyst.parser.ParserInterface
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

/**
 * Spark's SQL parser, plus Delta's statements ([[DeltaStatements]]: DESCRIBE HISTORY and
 * DETAIL, OPTIMIZE, VACUUM, RESTORE, CONVERT TO DELTA, GENERATE). A statement deltaflow
 * does not recognise goes to `delegate` (Spark's parser) unchanged.
 *
 * `ParserInterface` gains methods in every Spark minor (4.1: `parsePlanWithParameters`,
 * `parseTemporalTableIdentifier`, 4.2: `splitStatements`, ...), with types older Sparks
 * do not have, so a class that overrides each one compiles against one Spark only. The
 * parser is a dynamic proxy instead: `parsePlan` and `parsePlanWithParameters` (whatever
 * their other arguments) try Delta's statements first, and every other method, including
 * ones a later Spark adds, goes to `delegate` as it is.
 */
object DeltaSqlParser {
  private val Intercepted = Set("parsePlan", "parsePlanWithParameters")

  def apply(delegate: ParserInterface): ParserInterface = {
    val handler = new InvocationHandler {
      override def invoke(proxy: AnyRef, method: Method, args: Array[AnyRef]): AnyRef =
        method.getName match {
          case name if Intercepted(name) && args != null && args.nonEmpty =>
            val sqlText = args(0).asInstanceOf[String]
            // Delta's statements take no parameters; anything else keeps Spark's binding.
            DeltaStatements.parse(sqlText, delegate).getOrElse(
              io.deltaflow.spark.dml.SqlDml.wrap(
                forward(delegate, method, args).asInstanceOf[LogicalPlan]))
          case "equals" if method.getParameterCount == 1 =>
            java.lang.Boolean.valueOf(proxy eq args(0))
          case "hashCode" if method.getParameterCount == 0 =>
            Integer.valueOf(System.identityHashCode(proxy))
          case "toString" if method.getParameterCount == 0 => s"DeltaSqlParser($delegate)"
          case _ => forward(delegate, method, args)
        }
    }
    Proxy.newProxyInstance(
      classOf[ParserInterface].getClassLoader, Array(classOf[ParserInterface]), handler)
      .asInstanceOf[ParserInterface]
  }

  private def forward(delegate: ParserInterface, method: Method, args: Array[AnyRef]): AnyRef =
    try method.invoke(delegate, (if (args == null) Array.empty[AnyRef] else args): _*)
    catch { case e: InvocationTargetException => throw e.getCause }
}
