package io.deltaflow.spark.sql

import scala.collection.mutable.ArrayBuffer

/** One token of a SQL text: `value` is the unquoted text, `start`/`end` its offsets. */
private[sql] case class Token(kind: Token.Kind, value: String, start: Int, end: Int) {
  def isWord(word: String): Boolean = kind == Token.Word && value.equalsIgnoreCase(word)
  def isSymbol(symbol: String): Boolean = kind == Token.Symbol && value == symbol
  def isName: Boolean = kind == Token.Word || kind == Token.Quoted
}

private[sql] object Token {
  sealed trait Kind
  /** An unquoted word: a keyword or an identifier. */
  case object Word extends Kind
  /** A `backquoted` identifier. */
  case object Quoted extends Kind
  /** A 'string' or "string" literal. */
  case object Str extends Kind
  case object Number extends Kind
  case object Symbol extends Kind
}

/**
 * Splits a SQL text into tokens, enough to recognise Delta's statements: words, quoted
 * identifiers, string literals (backslash escapes, as Spark's default), numbers and single
 * symbols; whitespace and comments (`--`, `/* */`) are skipped. `None` for a text it cannot
 * split (an unterminated quote): such a text is Spark's parser's to report.
 */
private[sql] object SqlTokens {
  def tokenize(sql: String): Option[IndexedSeq[Token]] = {
    val tokens = ArrayBuffer.empty[Token]
    var i = 0
    val n = sql.length
    while (i < n) {
      val c = sql.charAt(i)
      if (c.isWhitespace) {
        i += 1
      } else if (sql.startsWith("--", i)) {
        while (i < n && sql.charAt(i) != '\n') i += 1
      } else if (sql.startsWith("/*", i)) {
        val close = sql.indexOf("*/", i + 2)
        if (close < 0) return None
        i = close + 2
      } else if (c.isLetter || c == '_') {
        val start = i
        while (i < n && (sql.charAt(i).isLetterOrDigit || sql.charAt(i) == '_')) i += 1
        tokens += Token(Token.Word, sql.substring(start, i), start, i)
      } else if (c.isDigit) {
        val start = i
        while (i < n && (sql.charAt(i).isDigit || sql.charAt(i) == '.')) i += 1
        tokens += Token(Token.Number, sql.substring(start, i), start, i)
      } else if (c == '`') {
        val start = i
        val text = new StringBuilder
        i += 1
        var closed = false
        while (i < n && !closed) {
          if (sql.charAt(i) == '`') {
            if (i + 1 < n && sql.charAt(i + 1) == '`') { text += '`'; i += 2 }
            else { closed = true; i += 1 }
          } else { text += sql.charAt(i); i += 1 }
        }
        if (!closed) return None
        tokens += Token(Token.Quoted, text.toString, start, i)
      } else if (c == '\'' || c == '"') {
        val start = i
        val text = new StringBuilder
        i += 1
        var closed = false
        while (i < n && !closed) {
          val d = sql.charAt(i)
          if (d == '\\' && i + 1 < n) {
            text += unescape(sql.charAt(i + 1)); i += 2
          } else if (d == c) { closed = true; i += 1 }
          else { text += d; i += 1 }
        }
        if (!closed) return None
        tokens += Token(Token.Str, text.toString, start, i)
      } else {
        tokens += Token(Token.Symbol, c.toString, i, i + 1)
        i += 1
      }
    }
    Some(tokens.toIndexedSeq)
  }

  private def unescape(c: Char): Char = c match {
    case 'n' => '\n'
    case 't' => '\t'
    case 'r' => '\r'
    case '0' => '\u0000'
    case other => other
  }
}
