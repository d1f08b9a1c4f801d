package io.deltaflow.spark.sql

import org.apache.spark.sql.catalyst.parser.ParserInterface
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

import io.deltaflow.spark.DeltaflowException

/**
 * The recogniser of Delta's own statements (delta-spark's `DeltaSqlBase.g4`, the parts
 * deltaflow runs), written by hand over [[SqlTokens]]:
 *
 * {{{
 *   (DESC | DESCRIBE) HISTORY table [LIMIT n]
 *   (DESC | DESCRIBE) DETAIL table
 *   OPTIMIZE table [FULL] [WHERE partitionPredicate] [ZORDER BY (col, ...)]
 *   REORG TABLE table [WHERE partitionPredicate] APPLY (PURGE)
 *   VACUUM table [RETAIN n HOURS] [DRY RUN]
 *   RESTORE [TABLE] table [TO] VERSION AS OF n | TIMESTAMP AS OF timestamp
 *   CONVERT TO DELTA table [NO STATISTICS] [PARTITIONED BY (col type, ...)]
 *   GENERATE mode FOR TABLE table
 *   CREATE [OR REPLACE] TABLE [IF NOT EXISTS] table SHALLOW CLONE table
 *     [VERSION AS OF n | TIMESTAMP AS OF timestamp] [TBLPROPERTIES (k = v, ...)] [LOCATION path]
 *   table := name[.name...] | delta.`/path` | '/path'
 * }}}
 *
 * `parse` answers `None` for any other text, which then goes to Spark's parser unchanged.
 * A text that starts like one of these statements (`VACUUM`, `OPTIMIZE`, `RESTORE`,
 * `CONVERT TO DELTA`, `GENERATE ... FOR TABLE`, `DESCRIBE HISTORY|DETAIL <table>`,
 * `CREATE TABLE <table> [SHALLOW] CLONE`) but
 * does not follow it fails with a `SqlSyntaxError` saying where and what was expected.
 */
private[sql] object DeltaStatements {
  def parse(sql: String, delegate: ParserInterface): Option[LogicalPlan] = {
    val tokens = SqlTokens.tokenize(sql).getOrElse(return None)
    if (tokens.isEmpty || tokens.head.kind != Token.Word) return None
    val c = new Cursor(sql, tokens)
    tokens.head.value.toUpperCase(java.util.Locale.ROOT) match {
      case "DESC" | "DESCRIBE" => describe(c)
      case "OPTIMIZE" if startsStatement(tokens) => Some(optimize(c))
      case "REORG" if tokens.length > 1 && tokens(1).isWord("TABLE") => Some(reorg(c))
      case "VACUUM" if startsStatement(tokens) => Some(vacuum(c))
      case "RESTORE" if startsStatement(tokens) => Some(restore(c))
      case "CONVERT" if tokens.length > 2 && tokens(1).isWord("TO") && tokens(2).isWord("DELTA") =>
        Some(convert(c, delegate))
      case "GENERATE" if tokens.length > 2 && tokens(2).isWord("FOR") => Some(generate(c))
      case "CREATE" | "REPLACE" => cloneHead(new Cursor(sql, tokens)).map(_ => clone(c))
      case _ => None
    }
  }

  // `VACUUM` alone, or followed by `(` or `=`, is not the statement (a column, a function).
  private def startsStatement(tokens: IndexedSeq[Token]): Boolean =
    tokens.length > 1 && (tokens(1).isName || tokens(1).kind == Token.Str)

  private def describe(c: Cursor): Option[LogicalPlan] = {
    c.next()
    val which = c.peek.filter(t => t.isWord("HISTORY") || t.isWord("DETAIL"))
      .getOrElse(return None)
    c.next()
    // `DESCRIBE history` alone describes a table named `history`: Spark's.
    if (!c.peek.exists(t => t.isName || t.kind == Token.Str)) return None
    val table = c.table()
    if (which.isWord("DETAIL")) {
      c.end("the end of the statement", "DESCRIBE DETAIL <table>")
      Some(DescribeDetailCommand(table))
    } else {
      val limit = if (c.accept("LIMIT")) Some(c.integer("a number of commits")) else None
      c.end("LIMIT <n> or the end of the statement", "DESCRIBE HISTORY <table> [LIMIT <n>]")
      Some(DescribeHistoryCommand(table, limit))
    }
  }

  private val OptimizeSyntax =
    "OPTIMIZE <table> [FULL] [WHERE <partition predicate>] [ZORDER BY (<col>, ...)]"

  private def optimize(c: Cursor): LogicalPlan = {
    c.next()
    val table = c.table()
    val full = c.accept("FULL")
    val where = if (c.accept("WHERE")) {
      val text = c.textUntil(t => t.isWord("ZORDER"))
      if (text.isEmpty) c.fail("a partition predicate", OptimizeSyntax)
      Some(text)
    } else None
    val zorder = if (c.accept("ZORDER")) {
      c.expect("BY", OptimizeSyntax)
      val parenthesised = c.acceptSymbol("(")
      val columns = c.names("a column name", OptimizeSyntax)
      if (parenthesised) c.expectSymbol(")", OptimizeSyntax)
      columns
    } else Nil
    c.end("FULL, WHERE, ZORDER BY or the end of the statement", OptimizeSyntax)
    OptimizeCommand(table, where, zorder, full)
  }

  private val ReorgSyntax = "REORG TABLE <table> [WHERE <partition predicate>] APPLY (PURGE)"

  private def reorg(c: Cursor): LogicalPlan = {
    c.next()
    c.expect("TABLE", ReorgSyntax)
    val table = c.table()
    val where = if (c.accept("WHERE")) {
      val text = c.textUntil(t => t.isWord("APPLY"))
      if (text.isEmpty) c.fail("a partition predicate", ReorgSyntax)
      Some(text)
    } else None
    c.expect("APPLY", ReorgSyntax)
    c.expectSymbol("(", ReorgSyntax)
    c.expect("PURGE", ReorgSyntax)
    c.expectSymbol(")", ReorgSyntax)
    c.end("the end of the statement", ReorgSyntax)
    ReorgPurgeCommand(table, where)
  }

  private val VacuumSyntax = "VACUUM <table> [RETAIN <hours> HOURS] [DRY RUN]"

  private def vacuum(c: Cursor): LogicalPlan = {
    c.next()
    val table = c.table()
    val hours = if (c.accept("RETAIN")) {
      val value = c.number("a number of hours", VacuumSyntax)
      c.expect("HOURS", VacuumSyntax)
      Some(value)
    } else None
    val dryRun = if (c.accept("DRY")) { c.expect("RUN", VacuumSyntax); true } else false
    c.end("RETAIN <hours> HOURS, DRY RUN or the end of the statement", VacuumSyntax)
    VacuumCommand(table, hours, dryRun)
  }

  private val RestoreSyntax =
    "RESTORE [TABLE] <table> [TO] VERSION AS OF <version> | TIMESTAMP AS OF '<timestamp>'"

  private def restore(c: Cursor): LogicalPlan = {
    c.next()
    c.accept("TABLE")
    val table = c.table()
    c.accept("TO")
    c.accept("FOR")
    if (c.accept("VERSION") || c.accept("SYSTEM_VERSION")) {
      c.expect("AS", RestoreSyntax)
      c.expect("OF", RestoreSyntax)
      val version = c.peek match {
        case Some(t) if t.kind == Token.Str && t.value.forall(_.isDigit) && t.value.nonEmpty =>
          c.next(); t.value.toLong
        case _ => c.integer("a version number")
      }
      c.end("the end of the statement", RestoreSyntax)
      RestoreCommand(table, Some(version), None)
    } else if (c.accept("TIMESTAMP") || c.accept("SYSTEM_TIME")) {
      c.expect("AS", RestoreSyntax)
      c.expect("OF", RestoreSyntax)
      val text = c.textUntil(_ => false)
      if (text.isEmpty) c.fail("a timestamp", RestoreSyntax)
      RestoreCommand(table, None, Some(text))
    } else {
      c.fail("VERSION AS OF or TIMESTAMP AS OF", RestoreSyntax)
    }
  }

  private val ConvertSyntax =
    "CONVERT TO DELTA parquet.`<path>` | <table> [NO STATISTICS] [PARTITIONED BY (<col> <type>, ...)]"

  private def convert(c: Cursor, delegate: ParserInterface): LogicalPlan = {
    c.next(); c.next(); c.next()
    val table = c.table()
    if (c.accept("NO")) c.expect("STATISTICS", ConvertSyntax)
    val partitionSchema = if (c.accept("PARTITIONED")) {
      c.expect("BY", ConvertSyntax)
      c.expectSymbol("(", ConvertSyntax)
      val start = c.position
      val text = c.textUntilClosingParen()
      if (text.isEmpty) c.fail("partition columns", ConvertSyntax)
      val schema = try delegate.parseTableSchema(text)
      catch {
        case e: Exception =>
          throw c.error(start, "<col> <type>, ...", ConvertSyntax, Option(e.getMessage))
      }
      c.expectSymbol(")", ConvertSyntax)
      Some(schema)
    } else None
    c.end("NO STATISTICS, PARTITIONED BY or the end of the statement", ConvertSyntax)
    ConvertCommand(table, partitionSchema)
  }

  private val CloneSyntax =
    "CREATE [OR REPLACE] TABLE [IF NOT EXISTS] <table> SHALLOW CLONE <source> " +
      "[VERSION AS OF <version> | TIMESTAMP AS OF '<timestamp>'] " +
      "[TBLPROPERTIES (<key> = <value>, ...)] [LOCATION '<path>']"

  /** `CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t` / `REPLACE TABLE t` followed by
   *  `[SHALLOW | DEEP] CLONE`: (replace, ifNotExists, target), the cursor at the clone's
   *  kind. None for any other CREATE / REPLACE, which is Spark's. */
  private def cloneHead(c: Cursor): Option[(Boolean, Boolean, TableRef)] = {
    val replace = if (c.accept("REPLACE")) true
      else { c.next(); c.accept("OR") && c.accept("REPLACE") }
    if (!c.accept("TABLE")) return None
    val ifNotExists = c.accept("IF") && c.accept("NOT") && c.accept("EXISTS")
    if (!c.peek.exists(_.isName)) return None
    val target = c.table()
    if (c.peek.exists(t => t.isWord("SHALLOW") || t.isWord("DEEP") || t.isWord("CLONE"))) {
      Some((replace, ifNotExists, target))
    } else None
  }

  private def clone(c: Cursor): LogicalPlan = {
    val (replace, ifNotExists, target) = cloneHead(c).get
    if (!c.accept("SHALLOW")) {
      val deep = c.accept("DEEP")
      throw DeltaflowException.of("UnsupportedFeatureError",
        s"${if (deep) "DEEP CLONE" else "CLONE"} copies a table's data files, which deltaflow " +
          "does not do (nor does delta-spark). Write SHALLOW CLONE to reference the source's " +
          "files, or copy the data with CREATE TABLE ... AS SELECT * FROM <source>.",
        Map("feature" -> "deepClone"))
    }
    c.expect("CLONE", CloneSyntax)
    val source = c.table()
    var version: Option[Long] = None
    var timestamp: Option[String] = None
    if (c.accept("VERSION")) {
      c.expect("AS", CloneSyntax); c.expect("OF", CloneSyntax)
      version = Some(c.integer("a version number"))
    } else if (c.accept("TIMESTAMP")) {
      c.expect("AS", CloneSyntax); c.expect("OF", CloneSyntax)
      val text = c.textUntil(t => t.isWord("TBLPROPERTIES") || t.isWord("LOCATION"))
      if (text.isEmpty) c.fail("a timestamp", CloneSyntax)
      timestamp = Some(text)
    }
    val properties = if (c.accept("TBLPROPERTIES")) c.properties(CloneSyntax) else Map.empty[String, String]
    val location = if (c.accept("LOCATION")) Some(c.string("a location", CloneSyntax)) else None
    c.end("TBLPROPERTIES, LOCATION or the end of the statement", CloneSyntax)
    CloneCommand(target, source, replace, ifNotExists, version, timestamp, properties, location)
  }

  private val GenerateSyntax = "GENERATE symlink_format_manifest FOR TABLE <table>"

  private def generate(c: Cursor): LogicalPlan = {
    c.next()
    val mode = c.names("a mode", GenerateSyntax).mkString(".")
    c.expect("FOR", GenerateSyntax)
    c.expect("TABLE", GenerateSyntax)
    val table = c.table()
    c.end("the end of the statement", GenerateSyntax)
    GenerateCommand(table, mode)
  }

  /** A position in the tokens, with the statement's text for errors. */
  private class Cursor(sql: String, tokens: IndexedSeq[Token]) {
    private var i = 0
    private lazy val statementName = {
      val words = tokens.take(3).map(_.value.toUpperCase(java.util.Locale.ROOT))
      words.head match {
        case "DESC" | "DESCRIBE" => words.take(2).mkString(" ")
        case "CONVERT" => "CONVERT TO DELTA"
        case "CREATE" | "REPLACE" => "SHALLOW CLONE"
        case first => first
      }
    }

    def peek: Option[Token] = tokens.lift(i)
    def next(): Token = { val t = tokens(i); i += 1; t }
    def position: Int = peek.map(_.start).getOrElse(sql.length)

    def accept(word: String): Boolean =
      if (peek.exists(_.isWord(word))) { i += 1; true } else false

    def acceptSymbol(symbol: String): Boolean =
      if (peek.exists(_.isSymbol(symbol))) { i += 1; true } else false

    def expect(word: String, syntax: String): Unit =
      if (!accept(word)) fail(word, syntax)

    def expectSymbol(symbol: String, syntax: String): Unit =
      if (!acceptSymbol(symbol)) fail(s"'$symbol'", syntax)

    /** `'/path'`, or a qualified name (`db.t`, `delta.\`/path\``). */
    def table(): TableRef = peek match {
      case Some(t) if t.kind == Token.Str => next(); PathRef(t.value)
      case Some(t) if t.isName => NameRef(names1())
      case _ => fail("a table name, delta.`<path>` or '<path>'", s"$statementName <table> ...")
    }

    private def names1(): Seq[String] = {
      val parts = Seq.newBuilder[String]
      parts += next().value
      while (peek.exists(_.isSymbol(".")) && tokens.lift(i + 1).exists(_.isName)) {
        i += 1
        parts += next().value
      }
      parts.result()
    }

    /** `name[, name...]`, each possibly qualified (`a.b`). */
    def names(what: String, syntax: String): Seq[String] = {
      val out = Seq.newBuilder[String]
      do {
        if (!peek.exists(_.isName)) fail(what, syntax)
        out += names1().mkString(".")
      } while (acceptSymbol(","))
      out.result()
    }

    def integer(what: String): Long = peek match {
      case Some(t) if t.kind == Token.Number && t.value.forall(_.isDigit) =>
        next(); t.value.toLong
      case _ => fail(what, s"$statementName ...")
    }

    def string(what: String, syntax: String): String = peek match {
      case Some(t) if t.kind == Token.Str => next(); t.value
      case _ => fail(what, syntax)
    }

    /** `(key = value, ...)`: keys quoted or dotted names, values literals; `=` optional. */
    def properties(syntax: String): Map[String, String] = {
      expectSymbol("(", syntax)
      val out = Map.newBuilder[String, String]
      do {
        val key = peek match {
          case Some(t) if t.kind == Token.Str => next(); t.value
          case Some(t) if t.isName => names1().mkString(".")
          case _ => fail("a property key", syntax)
        }
        acceptSymbol("=")
        val value = peek match {
          case Some(t) if t.kind == Token.Str || t.kind == Token.Number || t.kind == Token.Word =>
            next(); t.value
          case _ => fail(s"a value for $key", syntax)
        }
        out += key -> value
      } while (acceptSymbol(","))
      expectSymbol(")", syntax)
      out.result()
    }

    def number(what: String, syntax: String): Double = peek match {
      case Some(t) if t.kind == Token.Number && t.value.toDoubleOption.isDefined =>
        next(); t.value.toDouble
      case _ => fail(what, syntax)
    }

    /** The text from here to a token `stop` matches outside parentheses, or the end. */
    def textUntil(stop: Token => Boolean): String = {
      val first = i
      var depth = 0
      while (peek.exists(t => depth > 0 || !(stop(t) || t.isSymbol(";")))) {
        val t = next()
        if (t.isSymbol("(")) depth += 1
        if (t.isSymbol(")")) depth = math.max(0, depth - 1)
      }
      if (i == first) "" else sql.substring(tokens(first).start, tokens(i - 1).end).trim
    }

    /** The text up to the `)` that closes the one just read (not consumed). */
    def textUntilClosingParen(): String = {
      val first = i
      var depth = 0
      while (peek.exists(t => depth > 0 || !t.isSymbol(")"))) {
        val t = next()
        if (t.isSymbol("(")) depth += 1
        if (t.isSymbol(")")) depth -= 1
      }
      if (i == first) "" else sql.substring(tokens(first).start, tokens(i - 1).end).trim
    }

    /** Only `;` may follow. */
    def end(expected: String, syntax: String): Unit = {
      while (acceptSymbol(";")) ()
      if (peek.isDefined) fail(expected, syntax)
    }

    def fail(expected: String, syntax: String): Nothing =
      throw error(position, expected, syntax, None)

    def error(at: Int, expected: String, syntax: String, detail: Option[String])
        : DeltaflowException = {
      val near = if (at >= sql.length) "the end of the statement"
        else s"'${sql.substring(at, math.min(sql.length, at + 30)).takeWhile(_ != '\n')}'"
      DeltaflowException.of("SqlSyntaxError",
        s"$statementName: expected $expected at position $at, found $near" +
          detail.map(d => s" (${d.linesIterator.next()})").getOrElse("") +
          s". Syntax: $syntax.",
        Map("statement" -> sql, "position" -> at.toString, "expected" -> expected))
    }
  }
}
