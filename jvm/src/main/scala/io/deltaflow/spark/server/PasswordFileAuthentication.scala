package io.deltaflow.spark.server

import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Paths}
import java.security.MessageDigest
import java.util.Base64
import javax.crypto.SecretKeyFactory
import javax.crypto.spec.PBEKeySpec
import javax.security.sasl.AuthenticationException

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hive.service.auth.PasswdAuthenticationProvider
import org.apache.spark.SparkEnv

/**
 * User/password authentication for the Thrift JDBC server (`deltaflow sql-server`), plugged
 * in through the server's own pluggable authentication:
 * `hive.server2.authentication=CUSTOM` and `hive.server2.custom.authentication.class` =
 * this class. The server runs it once per connection, before any session exists; a
 * refusal fails the connection's SASL handshake, so no session is ever opened for it.
 *
 * Credentials come from one place: the password file named by the Spark setting
 * `spark.deltaflow.sqlServer.passwordFile`, one `user:pbkdf2-sha256:<iterations>:<salt
 * base64>:<hash base64>` line per user (written by `deltaflow sql-server --add-user`;
 * blank lines and `#` comments ignored). The file is read at every login, so users added
 * or removed take effect without a restart. Passwords are never logged.
 */
class PasswordFileAuthentication extends PasswdAuthenticationProvider {
  import PasswordFileAuthentication._

  override def Authenticate(user: String, password: String): Unit = {
    val path = Option(SparkEnv.get).flatMap(_.conf.getOption(PasswordFileKey)).getOrElse(
      throw new AuthenticationException(s"no password file: $PasswordFileKey is not set"))
    val entries =
      try Files.readAllLines(Paths.get(path), StandardCharsets.UTF_8).asScala
      catch {
        case NonFatal(e) =>
          throw new AuthenticationException(s"cannot read the password file $path", e)
      }
    val accepted = entries.iterator
      .map(_.trim)
      .filter(line => line.nonEmpty && !line.startsWith("#"))
      .map(_.split(":", -1))
      .exists(fields => fields.length == 5 && fields(0) == user && matches(fields, password))
    if (user == null || password == null || !accepted) {
      throw new AuthenticationException(s"wrong user name or password for user '$user'")
    }
  }
}

object PasswordFileAuthentication {
  val PasswordFileKey = "spark.deltaflow.sqlServer.passwordFile"

  private def matches(fields: Array[String], password: String): Boolean =
    fields(1) == "pbkdf2-sha256" && (try {
      val iterations = fields(2).toInt
      val salt = Base64.getDecoder.decode(fields(3))
      val expected = Base64.getDecoder.decode(fields(4))
      val spec = new PBEKeySpec(password.toCharArray, salt, iterations, expected.length * 8)
      val actual =
        SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256").generateSecret(spec).getEncoded
      MessageDigest.isEqual(actual, expected) // constant time
    } catch { case NonFatal(_) => false })
}
