"""A private PostgreSQL cluster for the shared-metastore tests, and its JDBC driver.

PostgreSQL comes from Debian's packages (``make test`` installs them when run as root:
the Makefile's ``postgres`` target); the cluster is made with ``initdb`` under a temporary
directory, trusts loopback connections and listens on a free port, and is removed when
the tests end. ``initdb`` refuses to run as root, so as root the cluster runs as the
``postgres`` user the package creates. The JDBC driver is fetched once from Maven Central
into ``~/.cache/deltaflow/jars`` (tests only: deltaflow itself never downloads it; its users
name their driver jar in ``DELTAFLOW_METASTORE_JARS``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DRIVER_VERSION = "42.7.4"
_DRIVER_URL = (
    "https://repo1.maven.org/maven2/org/postgresql/postgresql/"
    f"{DRIVER_VERSION}/postgresql-{DRIVER_VERSION}.jar"
)
START_TIMEOUT = 120  # seconds, for pg_ctl's wait on a loaded machine


@dataclass(frozen=True)
class Postgres:
    port: int
    database: str

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{self.database}"


def driver_jar() -> Path:
    """PostgreSQL's JDBC driver, from the cache or Maven Central (checked by its SHA-1)."""
    cache = Path(os.path.expanduser("~/.cache/deltaflow/jars"))
    jar = cache / f"postgresql-{DRIVER_VERSION}.jar"
    if jar.is_file():
        return jar
    cache.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(_DRIVER_URL, timeout=60) as response:
        body = response.read()
    with urllib.request.urlopen(_DRIVER_URL + ".sha1", timeout=60) as response:
        expected = response.read().decode().split()[0].strip()
    if hashlib.sha1(body).hexdigest() != expected:
        raise RuntimeError(f"{_DRIVER_URL}: SHA-1 mismatch; not cached")
    fd, staging = tempfile.mkstemp(dir=cache, suffix=".part")
    with os.fdopen(fd, "wb") as out:
        out.write(body)
    os.replace(staging, jar)
    return jar


def server_binaries() -> Path | None:
    """The directory of Debian's PostgreSQL server programs (``initdb``, ``pg_ctl``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def unavailable_reason() -> str | None:
    """Why no cluster can be started here, or None."""
    if server_binaries() is None:
        return (
            "PostgreSQL's server programs are not installed (run `make test` as root, or"
            " `sudo apt-get install -y postgresql`)"
        )
    if os.geteuid() == 0 and not _has_user("postgres"):
        return "running as root and there is no `postgres` user to run initdb as"
    return None


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start_postgres(database: str = "metastore") -> Iterator[Postgres]:
    """A private cluster on 127.0.0.1 with ``database`` created; stopped and deleted after."""
    binaries = server_binaries()
    assert binaries is not None, unavailable_reason()
    as_root = os.geteuid() == 0
    # Under /tmp (not pytest's 0700 temp root): the postgres user must reach it.
    base = Path(tempfile.mkdtemp(prefix="deltaflow-pg-"))
    prefix: list[str] = []
    if as_root:
        shutil.chown(base, user="postgres", group="postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", _free_port()

    # pg_ctl -w waits up to PGCTLTIMEOUT seconds; createdb connects as PGUSER.
    env = {**os.environ, "PGUSER": "postgres", "PGCTLTIMEOUT": str(START_TIMEOUT)}

    def run(*command: str) -> None:
        subprocess.run(
            [*prefix, *command], check=True, capture_output=True, timeout=START_TIMEOUT, env=env
        )

    try:
        run(
            str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"
        )
        options = f"-p {port} -h 127.0.0.1 -k {base} -c fsync=off"
        log = str(base / "server.log")
        run(str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", log, "-w", "start")
        try:
            run(str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), database)
            yield Postgres(port=port, database=database)
        finally:
            run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(base, ignore_errors=True)
