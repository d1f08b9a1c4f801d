"""``deltaflow sql-server`` beyond localhost: the refusal to listen off loopback without
authentication, user/password logins checked by the connector's provider plugged into the
Thrift server, and TLS — driven with the wheel's ``beeline``. One server (password file +
TLS, bound to a non-loopback address of this machine when it has one) serves the module."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deltaflow.cli import main as cli_main
from deltaflow.spark import _sql_server, _sql_server_security
from deltaflow.spark.errors import SqlServerConfigError
from tests._waiting import wait_until, wait_while_running
from tests.spark._beeline import beeline
from tests.spark.test_hosts import SPARK_HOME, free_port, spark_env

USER, PASSWORD = "analyst", "correct-horse-battery-staple"  # beeline splits on spaces
KEYSTORE_PASSWORD = "keystore-secret"
TRUSTSTORE_PASSWORD = "truststore-secret"


# -- refusal: no server is started, nothing is bound ------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", ""])
def test_a_non_loopback_address_without_authentication_is_refused(host):
    with pytest.raises(SqlServerConfigError) as refused:
        _sql_server.start(host=host, port=free_port())
    assert refused.value.option == "--host"
    assert "--password-file" in str(refused.value)


def test_the_cli_refuses_too_and_names_the_options(capsys):
    assert cli_main(["sql-server", "--host", "192.0.2.10", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "--password-file" in err and "--add-user" in err and "--tls-keystore" in err


def test_loopback_names_and_addresses_are_loopback():
    assert _sql_server_security.is_loopback("127.0.0.1")
    assert _sql_server_security.is_loopback("::1")
    assert _sql_server_security.is_loopback("localhost")
    assert not _sql_server_security.is_loopback("192.0.2.10")
    assert not _sql_server_security.is_loopback("0.0.0.0")


def test_authentication_set_by_conf_counts_and_plaintext_warns():
    settings = {
        "spark.hive.server2.thrift.bind.host": "192.0.2.10",
        "spark.hive.server2.authentication": "LDAP",
    }
    warning = _sql_server_security.check_exposure(settings)
    assert warning is not None and "without TLS" in warning
    tls = {**settings, "spark.hive.server2.use.SSL": "true"}
    assert _sql_server_security.check_exposure(tls) is None


def test_missing_files_and_passwords_are_refused(tmp_path):
    with pytest.raises(SqlServerConfigError) as no_file:
        _sql_server_security.security_settings(password_file=str(tmp_path / "nope"))
    assert no_file.value.option == "--password-file"
    keystore = tmp_path / "ks.p12"
    keystore.write_bytes(b"x")
    with pytest.raises(SqlServerConfigError) as no_password:
        _sql_server_security.security_settings(tls_keystore=str(keystore))
    assert no_password.value.option == "--tls-keystore-password-env"


def test_add_user_keeps_one_salted_line_per_user(tmp_path):
    path = tmp_path / "users"
    _sql_server_security.add_user(path, "a", "first-secret")
    _sql_server_security.add_user(path, "b", "second-secret")
    _sql_server_security.add_user(path, "a", "third-secret")
    lines = path.read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["b", "a"]
    assert all("secret" not in line for line in lines)
    assert path.stat().st_mode & 0o077 == 0
    with pytest.raises(SqlServerConfigError):
        _sql_server_security.add_user(path, "bad:name", "pw")


def test_the_cli_adds_a_user_from_stdin(tmp_path):
    path = tmp_path / "users"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltaflow.cli",
            "sql-server",
            "--add-user",
            "u",
            "--password-file",
            str(path),
        ],
        input="s3cret\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout + result.stderr + path.read_text()
    assert path.read_text().startswith("u:pbkdf2-sha256:")


# -- a real server with a password file and TLS ------------------------------------------


def local_non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback (traffic to it stays here)."""
    try:
        found = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.split()
    except OSError:
        return None
    for address in found:
        if ":" in address or address.startswith("127."):
            continue
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))  # only an address of this machine binds
            except OSError:
                continue
        return address
    return None


def keytool(*args: str) -> None:
    subprocess.run(["keytool", *args], check=True, capture_output=True, timeout=120)


def make_keystores(directory: Path, host: str) -> tuple[Path, Path]:
    """A server keystore with a self-signed certificate for ``host`` and 127.0.0.1, and a
    client truststore holding that certificate."""
    keystore, truststore = directory / "server.p12", directory / "trust.p12"
    keytool(
        *("-genkeypair", "-alias", "server", "-keyalg", "RSA", "-keysize", "2048"),
        *("-dname", "CN=deltaflow-test", "-ext", f"SAN=ip:127.0.0.1,ip:{host}"),
        *("-validity", "2", "-storetype", "PKCS12", "-keystore", str(keystore)),
        *("-storepass", KEYSTORE_PASSWORD, "-keypass", KEYSTORE_PASSWORD),
    )
    keytool(
        *("-exportcert", "-rfc", "-alias", "server", "-keystore", str(keystore)),
        *("-storepass", KEYSTORE_PASSWORD, "-file", str(directory / "server.pem")),
    )
    keytool(
        *("-importcert", "-noprompt", "-alias", "server", "-file", str(directory / "server.pem")),
        *("-storetype", "PKCS12", "-keystore", str(truststore)),
        *("-storepass", TRUSTSTORE_PASSWORD),
    )
    return keystore, truststore


@dataclass
class Server:
    process: subprocess.Popen[str]
    lines: queue.Queue[str]
    host: str
    port: int
    truststore: Path
    log: Path

    def url(self, *, tls: bool = True) -> str:
        base = f"jdbc:hive2://{self.host}:{self.port}/default"
        if not tls:
            return base
        trust = f"sslTrustStore={self.truststore};trustStorePassword={TRUSTSTORE_PASSWORD}"
        return f"{base};ssl=true;{trust}"

    def sessions(self) -> tuple[int, int]:
        """(open now, opened in all), from the server's own status store."""
        assert self.process.stdin is not None
        self.process.stdin.write("sessions\n")
        self.process.stdin.flush()
        line = self.lines.get(timeout=60)
        assert line.startswith("SESSIONS "), line
        _, online, total = line.split()
        return int(online), int(total)


def pump(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line.rstrip("\n"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("sql-server-auth")
    host = local_non_loopback_address() or "127.0.0.1"
    keystore, truststore = make_keystores(directory, host)
    users = directory / "users"
    _sql_server_security.add_user(users, USER, PASSWORD)
    port = free_port()
    keywords = {
        "host": host,
        "port": port,
        "master": "local[2]",
        "warehouse": str(directory / "warehouse"),
        "conf": {"spark.ui.enabled": "false"},
        "password_file": str(users),
        "tls_keystore": str(keystore),
        "tls_keystore_password_env": "TEST_KEYSTORE_PASSWORD",
    }
    log = directory / "server.log"
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_sql_server_job.py"), json.dumps(keywords)],
        cwd=directory,
        env={**spark_env(), "TEST_KEYSTORE_PASSWORD": KEYSTORE_PASSWORD},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=pump, args=(process.stdout, lines), daemon=True).start()
    ready: list[str] = []
    wait_while_running(
        lambda: lines.qsize() > 0 and ready.append(lines.get()) is None,
        process,
        300,
        "the sql-server to listen",
        lambda: log.read_text()[-3000:],
    )
    assert ready == ["READY"], ready
    try:
        yield Server(process, lines, host, port, truststore, log)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=60)


@pytest.mark.slow
def test_a_user_with_the_right_password_runs_queries_over_tls(server, tmp_path):
    path = tmp_path / "t"
    statements = (
        f"CREATE TABLE authed USING delta LOCATION '{path}' AS SELECT 1 AS id;"
        " INSERT INTO authed VALUES (2);"
        " SELECT sum(id) AS total, current_user() AS who FROM authed;"
    )
    result = beeline(server.url(), statements, "-n", USER, "-p", PASSWORD, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[lines.index("total,who") + 1] == f"3,{USER}"


def logged_in_and_out(server: Server) -> None:
    result = beeline(server.url(), "SELECT 1 AS one;", "-n", USER, "-p", PASSWORD, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(("user", "password"), [(USER, "wrong-password"), ("nobody", PASSWORD)])
def test_wrong_credentials_get_a_clear_error_and_leave_no_session(server, user, password):
    wait_until(lambda: server.sessions()[0] == 0, 60, "no open session")
    before = server.sessions()[1]
    result = beeline(server.url(), "SELECT 1;", "-n", user, "-p", password, timeout=300)
    assert result.returncode != 0
    assert "Error validating the login" in result.stdout + result.stderr, result.stderr[-2000:]
    # A good login after the refused one: once the store has its session (events arrive in
    # order), a session opened for the refused login would have been counted too.
    logged_in_and_out(server)
    wait_until(lambda: server.sessions() == (0, before + 1), 60, "one more session, closed")
    log = server.log.read_text()
    assert PASSWORD not in log and "wrong-password" not in log


@pytest.mark.slow
def test_a_plaintext_client_is_not_served(server):
    before = server.sessions()[1]
    result = beeline(server.url(tls=False), "SELECT 1;", "-n", USER, "-p", PASSWORD, timeout=300)
    assert result.returncode != 0
    logged_in_and_out(server)
    wait_until(lambda: server.sessions() == (0, before + 1), 60, "one more session, closed")


@pytest.mark.slow
def test_the_session_count_sees_an_open_session_and_its_end(server):
    """The count the wrong-credentials test relies on is live: a logged-in beeline that
    stays connected counts 1, and 0 again once it quits."""
    client = subprocess.Popen(
        [str(SPARK_HOME / "bin" / "beeline"), "-u", server.url(), "-n", USER, "-p", PASSWORD],
        env=spark_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: queue.Queue[str] = queue.Queue()
    threading.Thread(target=pump, args=(client.stdout, output), daemon=True).start()
    try:
        assert client.stdin is not None
        client.stdin.write("SELECT 40 + 2 AS answer;\n")
        client.stdin.flush()
        seen: list[str] = []

        def answered() -> bool:
            while not output.empty():
                seen.append(output.get())
            return any("42" in line for line in seen)

        wait_while_running(answered, client, 300, "beeline's answer", lambda: "\n".join(seen))
        wait_until(lambda: server.sessions()[0] == 1, 60, "the session in the status store")
        client.stdin.write("!quit\n")
        client.stdin.flush()
        client.wait(timeout=120)
        wait_until(lambda: server.sessions()[0] == 0, 60, "the session to close")
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_dbt_logs_in_over_tls_and_a_wrong_password_is_refused(server, tmp_path):
    """dbt-spark's ``thrift`` method with ``auth: CUSTOM`` and ``use_ssl`` (``dbt debug``
    runs its connection test: a query on a new session)."""
    from tests.dbt import _dbt
    from tests.dbt.test_dbt import write_profile

    def debug(password: str, name: str) -> subprocess.CompletedProcess[str]:
        profiles = write_profile(
            tmp_path / name,
            {
                "type": "spark",
                "method": "thrift",
                "host": server.host,
                "port": server.port,
                "schema": "default",
                "auth": "CUSTOM",
                "user": USER,
                "password": password,
                "use_ssl": True,
                "connect_retries": 0,
            },
        )
        return _dbt.run(["debug"], profiles, cwd=tmp_path)

    good = debug(PASSWORD, "good")
    assert good.returncode == 0, good.stdout[-4000:]
    assert "Connection test: [OK connection ok]" in good.stdout, good.stdout[-4000:]
    bad = debug("wrong-password", "bad")
    assert bad.returncode != 0
    assert "Error validating the login" in bad.stdout, bad.stdout[-4000:]
