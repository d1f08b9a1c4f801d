"""Authentication and TLS for ``deltaflow sql-server``.

Both go through the Thrift server's own mechanisms, as Spark settings:

- **user / password**: ``hive.server2.authentication=CUSTOM`` with the connector's
  ``io.deltaflow.spark.server.PasswordFileAuthentication`` as the custom provider. The
  operator keeps users in a password file of salted PBKDF2-SHA256 hashes (written by
  ``deltaflow sql-server --add-user USER --password-file FILE``); the server reads it at every
  login and never sees or logs a clear password it does not receive from a client.
- **TLS**: ``hive.server2.use.SSL`` with a Java keystore (JKS or PKCS12) the operator
  provides; its password comes from an environment variable the operator names.

A server bound to anything but a loopback address refuses to start without
authentication (:class:`SqlServerConfigError`); without TLS it warns, since passwords then
cross the network in clear.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import secrets
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from deltaflow.spark.errors import SqlServerConfigError

PASSWORD_FILE_KEY = "spark.deltaflow.sqlServer.passwordFile"
AUTH_PROVIDER = "io.deltaflow.spark.server.PasswordFileAuthentication"
_AUTH_KEY = "spark.hive.server2.authentication"
CUSTOM_PROVIDER_KEY = "spark.hive.server2.custom.authentication.class"
# Each line records its own count, so raising this later keeps old lines valid. 100k costs
# 0.1-0.3 s of one core per login here (OWASP's 600k took 1.7 s on a busy 2-core machine):
# slow enough to make guessing expensive, paid once per JDBC connection, not per query.
_ITERATIONS = 100_000
_SCHEME = "pbkdf2-sha256"
# Authentication modes of HiveServer2 that check nothing.
_NO_AUTH = ("NONE", "NOSASL")


def password_line(user: str, password: str, *, iterations: int = _ITERATIONS) -> str:
    """The password file's line for ``user`` (no newline): a fresh random salt and the
    PBKDF2-SHA256 hash of ``password``."""
    if not user or ":" in user or any(c.isspace() for c in user):
        raise SqlServerConfigError(
            f"user name {user!r} cannot be used: give a non-empty name without ':' or spaces.",
            option="--add-user",
        )
    if not password:
        raise SqlServerConfigError("the password is empty: give one.", option="--add-user")
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    encode = base64.b64encode
    return f"{user}:{_SCHEME}:{iterations}:{encode(salt).decode()}:{encode(digest).decode()}"


def add_user(password_file: str | os.PathLike[str], user: str, password: str) -> None:
    """Add ``user`` to ``password_file`` (created readable by its owner only), replacing
    the user's previous line if there is one. The file is replaced atomically, so a
    running server reads either the old or the new one."""
    line = password_line(user, password)
    path = Path(password_file)
    kept: list[str] = []
    if path.exists():
        kept = [
            existing
            for existing in path.read_text().splitlines()
            if existing.split(":", 1)[0].strip() != user
        ]
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:  # mkstemp's file is 0600 already
        out.write("\n".join([*kept, line]) + "\n")
    os.replace(temporary, path)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches only this machine. A name counts
    only if every address it resolves to is a loopback one; the wildcard ``0.0.0.0`` /
    ``::`` / empty host (every interface) is not loopback."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def security_settings(
    *,
    password_file: str | None = None,
    tls_keystore: str | None = None,
    tls_keystore_password: str | None = None,
) -> dict[str, str]:
    """The Spark settings for the authentication and TLS asked for (checked: the files
    exist). Empty when neither is asked for."""
    settings: dict[str, str] = {}
    if password_file is not None:
        path = Path(password_file).resolve()
        if not path.is_file():
            raise SqlServerConfigError(
                f"--password-file {password_file}: no such file. Create it with"
                f" `deltaflow sql-server --add-user USER --password-file {password_file}`.",
                option="--password-file",
            )
        settings.update(
            {
                _AUTH_KEY: "CUSTOM",
                CUSTOM_PROVIDER_KEY: AUTH_PROVIDER,
                PASSWORD_FILE_KEY: str(path),
            }
        )
    if tls_keystore is not None:
        keystore = Path(tls_keystore).resolve()
        if not keystore.is_file():
            raise SqlServerConfigError(
                f"--tls-keystore {tls_keystore}: no such file. Give a JKS or PKCS12 keystore"
                " holding the server's key and certificate (docs/sql.md shows keytool's"
                " command).",
                option="--tls-keystore",
            )
        if not tls_keystore_password:
            raise SqlServerConfigError(
                "--tls-keystore needs the keystore's password: export it in a variable and"
                " name it with --tls-keystore-password-env VAR.",
                option="--tls-keystore-password-env",
            )
        settings.update(
            {
                "spark.hive.server2.use.SSL": "true",
                "spark.hive.server2.keystore.path": str(keystore),
                # Spark redacts settings whose name holds "password" in its UI and logs.
                "spark.hive.server2.keystore.password": tls_keystore_password,
            }
        )
    return settings


def check_exposure(settings: Mapping[str, str]) -> str | None:
    """Refuse (:class:`SqlServerConfigError`) a server whose final ``settings`` bind a
    non-loopback address with no authentication; a warning to show when it is reachable
    from other machines without TLS, else None."""
    host = settings.get("spark.hive.server2.thrift.bind.host", "")
    if is_loopback(host):
        return None
    if settings.get(_AUTH_KEY, "NONE").upper() in _NO_AUTH:
        raise SqlServerConfigError(
            f"--host {host or '(every interface)'} lets other machines connect, and no"
            " authentication is set: add users with `deltaflow sql-server --add-user USER"
            " --password-file FILE` and start with --password-file FILE (and --tls-keystore"
            " FILE --tls-keystore-password-env VAR for TLS), or bind 127.0.0.1 and reach it"
            " through an SSH tunnel.",
            option="--host",
        )
    if settings.get("spark.hive.server2.use.SSL", "false").lower() != "true":
        return (
            f"deltaflow sql-server: listening on {host or 'every interface'} without TLS:"
            " passwords and data cross the network in clear (add --tls-keystore FILE"
            " --tls-keystore-password-env VAR)."
        )
    return None
