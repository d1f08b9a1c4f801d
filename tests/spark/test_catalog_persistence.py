"""The catalog persists: Spark's Hive metastore, on embedded Derby under the warehouse by
default, or on a PostgreSQL database many processes share; and a managed CREATE never
adopts data already in its folder.

The restart tests run real hosts one after another on one warehouse — ``deltaflow.session()``
(``_catalog_job.py``), ``deltaflow sql-server`` with beeline, ``spark-sql`` with
``deltaflow.spark_conf()`` — each seeing what the others registered.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

import deltaflow
from deltaflow.spark.catalog import _metastore
from deltaflow.spark.catalog._create import managed_location
from deltaflow.table._uri import normalize_uri
from tests import _postgres
from tests.spark._beeline import beeline, jdbc_url
from tests.spark.test_hosts import SPARK_HOME, free_port, spark_env, wait_for_port

JOB = str(Path(__file__).parent / "_catalog_job.py")
JVM_TIMEOUT = 900  # seconds for one host's run: a JVM and the metastore, on 2 loaded cores


# ---- settings --------------------------------------------------------------------------


def test_the_catalog_defaults_to_derby_under_the_warehouse(tmp_path):
    settings = _metastore.catalog_settings({"spark.sql.warehouse.dir": str(tmp_path / "wh")}, {})
    assert settings.conf["spark.sql.catalogImplementation"] == "hive"
    assert settings.derby_dir == str(tmp_path / "wh" / "_metastore")
    url = settings.conf[_metastore.CONNECTION_URL]
    assert url == f"jdbc:derby:;databaseName={tmp_path}/wh/_metastore/metastore_db;create=true"
    # Spark's default warehouse, relative to the host's working directory.
    default = _metastore.catalog_settings({}, {})
    assert default.derby_dir == os.path.join("spark-warehouse", "_metastore")


def test_user_settings_win_and_in_memory_opts_out(tmp_path):
    assert (
        _metastore.catalog_settings({"spark.sql.catalogImplementation": "in-memory"}, {}).conf == {}
    )
    own = {_metastore.CONNECTION_URL: "jdbc:derby:;databaseName=/elsewhere;create=true"}
    settings = _metastore.catalog_settings(own, {})
    assert _metastore.CONNECTION_URL not in settings.conf and settings.derby_dir is None


def test_the_environment_names_a_shared_metastore(tmp_path):
    jar = tmp_path / "driver.jar"
    jar.write_bytes(b"")
    environ = {
        "DELTAFLOW_METASTORE_URL": "jdbc:postgresql://db:5432/metastore",
        "DELTAFLOW_METASTORE_JARS": str(jar),
        "DELTAFLOW_METASTORE_USER": "hive",
        "DELTAFLOW_METASTORE_PASSWORD": "s3cret",
    }
    settings = _metastore.catalog_settings({}, environ)
    assert settings.conf[_metastore.CONNECTION_URL] == "jdbc:postgresql://db:5432/metastore"
    assert settings.conf[_metastore.CONNECTION_DRIVER] == "org.postgresql.Driver"
    assert settings.conf[_metastore.CONNECTION_USER] == "hive"
    assert settings.jars == (str(jar),) and settings.derby_dir is None
    shared = _metastore.shared_metastore(environ)
    assert shared is not None and "s3cret" not in repr(shared)
    with pytest.raises(deltaflow.InvalidOptionError) as missing:
        _metastore.catalog_settings({}, {**environ, "DELTAFLOW_METASTORE_JARS": "/no/such.jar"})
    assert missing.value.option == "DELTAFLOW_METASTORE_JARS"
    with pytest.raises(deltaflow.InvalidOptionError) as unknown:
        _metastore.catalog_settings({}, {"DELTAFLOW_METASTORE_URL": "jdbc:weird://x"})
    assert unknown.value.option == "DELTAFLOW_METASTORE_DRIVER"


def test_a_shared_metastore_creates_every_hive_table_as_it_opens(tmp_path):
    """Not lazily (that deadlocks a PostgreSQL metastore's first CREATE TABLE): every
    persistent class of the wheel's Hive model starts with the store; Derby stays lazy."""
    eager = "spark.hadoop.datanucleus.autoStartMechanism"
    names = "spark.hadoop.datanucleus.autoStartClassNames"
    shared = _metastore.catalog_settings({}, {"DELTAFLOW_METASTORE_URL": "jdbc:postgresql://d/m"})
    assert shared.conf[eager] == "Classes"
    own = _metastore.catalog_settings({_metastore.CONNECTION_URL: "jdbc:mysql://d/m"}, {})
    assert own.conf[eager] == "Classes" and own.conf[names] == shared.conf[names]
    derby = _metastore.catalog_settings({"spark.sql.warehouse.dir": str(tmp_path)}, {})
    assert eager not in derby.conf and names not in derby.conf
    # The list is the model of the Hive the wheel ships: every class with a table of its own.
    (jar,) = (SPARK_HOME / "jars").glob("hive-metastore-*.jar")
    with zipfile.ZipFile(jar) as archive:
        model = archive.read("package.jdo").decode()
    persistent = {
        f"{_metastore.HIVE_MODEL_PACKAGE}.{name}"
        for name, attributes in re.findall(r'<class name="(\w+)"([^>]*)>', model)
        if 'embedded-only="true"' not in attributes
    }
    assert set(shared.conf[names].split(",")) == persistent


def test_spark_conf_keeps_the_catalog_with_the_warehouse(tmp_path):
    conf = deltaflow.spark_conf(warehouse=str(tmp_path / "wh"))
    assert conf["spark.sql.catalogImplementation"] == "hive"
    assert conf["spark.sql.warehouse.dir"] == str(tmp_path / "wh")
    assert f"{tmp_path}/wh/_metastore/metastore_db" in conf[_metastore.CONNECTION_URL]


def test_the_test_session_keeps_its_catalog_in_its_warehouse(spark):
    assert spark.conf.get("spark.sql.catalogImplementation") == "hive"
    warehouse = spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")
    spark.sql("SHOW DATABASES").collect()
    assert Path(warehouse, "_metastore", "metastore_db", "service.properties").is_file()


# ---- no silent adoption ----------------------------------------------------------------


def _seed(path: str) -> None:
    write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64())}))


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE {name} (id BIGINT) USING delta",
        "CREATE TABLE IF NOT EXISTS {name} (id BIGINT) USING delta",
        "CREATE TABLE {name} USING delta AS SELECT 7L AS id",
        "CREATE OR REPLACE TABLE {name} (id BIGINT) USING delta",
    ],
    ids=["create", "if-not-exists", "ctas", "create-or-replace"],
)
def test_a_managed_create_over_a_forgotten_table_is_refused(spark, statement):
    name = "forgotten_" + str(abs(hash(statement)) % 10**8)
    folder = managed_location(spark, name)
    _seed(folder)  # a table the catalog no longer lists (an in-memory catalog's restart)
    with pytest.raises(deltaflow.LocationNotEmptyError) as refused:
        spark.sql(statement.format(name=name))
    assert normalize_uri(refused.value.table_uri) == normalize_uri(folder)
    assert isinstance(refused.value, deltaflow.TableAlreadyExistsError)
    assert not spark.catalog.tableExists(name)
    table = RsTable(folder)
    assert table.version() == 0  # untouched
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2]


def test_save_as_table_and_the_builder_refuse_a_folder_with_files(spark):
    name = "stray_files"
    folder = Path(managed_location(spark, name).removeprefix("file://"))
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"not ours")
    with pytest.raises(deltaflow.LocationNotEmptyError):
        spark.range(3).write.format("delta").saveAsTable(name)
    from deltaflow.tables import DeltaTable

    with pytest.raises(deltaflow.LocationNotEmptyError):
        DeltaTable.create(spark).tableName(name).addColumn("id", "BIGINT").execute()
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet"]
    assert not spark.catalog.tableExists(name)


def test_a_managed_create_in_an_empty_folder_and_a_registration_still_work(spark, table_path):
    name = "fresh_managed"
    Path(managed_location(spark, name).removeprefix("file://")).mkdir(parents=True)
    spark.sql(f"CREATE TABLE {name} (id BIGINT) USING delta")
    spark.sql(f"INSERT INTO {name} VALUES (1)")
    assert spark.table(name).count() == 1
    # The table that is there, named with its location: registered, not refused.
    path = table_path()
    _seed(path)
    spark.sql(f"CREATE TABLE registered_there USING delta LOCATION '{path}'")
    assert spark.table("registered_there").count() == 2


# ---- restarts and hosts ----------------------------------------------------------------


def run_session(warehouse: Path, *statements: str, env: dict[str, str] | None = None) -> list:
    """``statements`` in a fresh ``deltaflow.session()`` process; each one's rows."""
    done = subprocess.run(
        [sys.executable, JOB, str(warehouse), *statements],
        cwd=warehouse.parent,
        env={**spark_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=JVM_TIMEOUT,
        check=False,
    )
    out = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("ROWS ")]
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR ")]
    assert done.returncode == 0 and not errors, (errors, done.stderr[-3000:])
    return out


def session_error(warehouse: Path, statement: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, JOB, str(warehouse), statement],
        cwd=warehouse.parent,
        env={**spark_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=JVM_TIMEOUT,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR ")]
    assert done.returncode == 3 and errors, done.stdout + done.stderr[-3000:]
    return json.loads(errors[0][6:])  # type: ignore[no-any-return]


def spark_sql(
    warehouse: Path,
    statements: str,
    env: dict[str, str] | None = None,
    *,
    expect_failure: bool = False,
) -> str:
    """``spark-sql -e`` with only ``deltaflow.spark_conf(warehouse=...)``; its output (its
    error output when ``expect_failure``)."""
    with _environment(env or {}):
        conf = deltaflow.spark_conf(warehouse=str(warehouse))
    args = [arg for k, v in conf.items() for arg in ("--conf", f"{k}={v}")]
    done = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-sql"), "--master", "local[1]", *args, "-e", statements],
        cwd=warehouse.parent,
        env={**spark_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=JVM_TIMEOUT,
        check=False,
    )
    if expect_failure:
        assert done.returncode != 0, done.stdout
        return done.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


class SqlServer:
    """``deltaflow sql-server`` on ``warehouse``, for beeline."""

    def __init__(self, warehouse: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = warehouse.parent / f"server-{self.port}.log"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "deltaflow.cli", "sql-server"),
                *("--port", str(self.port), "--master", "local[1]"),
                *("--warehouse", str(warehouse)),
            ],
            cwd=warehouse.parent,
            env={**spark_env(), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
            text=True,
        )
        wait_for_port(self.port, self.proc, timeout=900)  # a JVM and the metastore, loaded

    def query(self, statements: str) -> list[str]:
        result = beeline(jdbc_url(self.port), statements)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        return result.stdout.splitlines()

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        return self.log.read_text()[-3000:]


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` (``spark_conf()`` reads the metastore's there)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


CREATE_IN_SESSION = (
    "CREATE SCHEMA sales COMMENT 'what we sold'",
    "CREATE TABLE sales.orders (id BIGINT COMMENT 'order id', amount DOUBLE) USING delta"
    " COMMENT 'every order' TBLPROPERTIES ('team' = 'blue')",
    "INSERT INTO sales.orders VALUES (1, 9.5), (2, 3.0)",
)


@pytest.mark.slow
def test_sql_dml_by_path_leaves_the_metastore_closed(tmp_path):
    """A MERGE, UPDATE and DELETE on tables named by path never open the metastore (a MERGE
    hands its source to the brain as a session-local view, not a global one): a fresh
    embedded Derby costs seconds to create."""
    warehouse, table = tmp_path / "warehouse", tmp_path / "by_path"
    write_deltalake(str(table), pa.table({"k": ["a"]}))
    merged, updated, deleted, rows = run_session(
        warehouse,
        f"MERGE INTO delta.`{table}` AS t USING (SELECT 'p' AS k) AS s ON t.k = s.k"
        " WHEN NOT MATCHED THEN INSERT *",
        f"UPDATE delta.`{table}` SET k = 'q' WHERE k = 'p'",
        f"DELETE FROM delta.`{table}` WHERE k = 'a'",
        f"SELECT k FROM delta.`{table}`",
    )
    assert merged == [["1", "0", "0", "1"]] and updated == [["1"]] and deleted == [["1"]]
    assert rows == [["q"]]
    assert not (warehouse / "_metastore" / "metastore_db").exists()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # six JVMs one after another: ~5 min on 2 quiet cores
def test_the_catalog_survives_restarts_and_is_shared_by_every_host(tmp_path):
    """session() -> sql-server + beeline -> spark-sql -> session(), one warehouse: each
    host sees what the others registered, after their restarts."""
    warehouse = tmp_path / "warehouse"
    external = tmp_path / "external_table"
    run_session(
        warehouse,
        *CREATE_IN_SESSION,
        f"CREATE TABLE sales.ext (k STRING) USING delta LOCATION '{external}'",
    )

    server = SqlServer(warehouse)
    try:
        # While the server holds the embedded metastore, another process is refused, typed.
        held = session_error(warehouse, "SHOW TABLES IN sales")
        assert held["type"] == "MetastoreInUseError", held
        assert held["fields"]["metastore"] == str(warehouse / "_metastore" / "metastore_db")
        assert int(held["fields"]["holder_pid"]) > 0
        # spark-sql opens the metastore as it starts: refused there, at once.
        refused = spark_sql(warehouse, "SHOW TABLES;", expect_failure=True)
        assert "MetastoreInUseError" in refused and str(warehouse / "_metastore") in refused
        lines = server.query(
            "SHOW TABLES IN sales; SELECT count(*) AS n FROM sales.orders;"
            " CREATE TABLE sales.by_jdbc (k STRING) USING delta;"
            " INSERT INTO sales.by_jdbc VALUES ('j');"
        )
        assert "sales,orders,false" in lines and "sales,ext,false" in lines, lines
        assert "2" in lines, lines
    finally:
        log = server.stop()

    out = spark_sql(
        warehouse,
        "SELECT count(*) FROM sales.by_jdbc; SHOW TBLPROPERTIES sales.orders ('team');"
        " CREATE TABLE sales.by_cli (k STRING) USING delta; INSERT INTO sales.by_cli VALUES ('c');",
    )
    assert "1" in out.splitlines() and "team\tblue" in out.splitlines(), out + log

    tables, orders, schema, detail, ext, by_cli = run_session(
        warehouse,
        "SHOW TABLES IN sales",
        "SELECT count(*) FROM sales.orders",
        "DESCRIBE SCHEMA sales",
        "DESCRIBE TABLE EXTENDED sales.orders",
        "DESCRIBE TABLE EXTENDED sales.ext",
        "SELECT k FROM sales.by_cli",
    )
    assert sorted(t[1] for t in tables) == ["by_cli", "by_jdbc", "ext", "orders"]
    assert orders == [["2"]]  # not doubled, not lost
    assert ["Comment", "what we sold"] in schema
    assert ["id", "bigint", "order id"] in detail
    assert ["Comment", "every order", ""] in detail and ["Type", "MANAGED", ""] in detail
    assert any(r[0] == "Table Properties" and "team=blue" in r[1] for r in detail)
    assert ["Type", "EXTERNAL", ""] in ext
    assert by_cli == [["c"]]


@pytest.fixture(scope="module")
def postgres() -> Iterator[_postgres.Postgres]:
    reason = _postgres.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with _postgres.start_postgres() as server:
        yield server


class SessionProcess:
    """A ``deltaflow.session()`` process running ``statements`` while the test watches its
    output: ``WAIT <name>`` statements hold it open until :meth:`resume`."""

    def __init__(self, warehouse: Path, statements: list[str], env: dict[str, str]) -> None:
        self.log_path = warehouse.parent / "session.log"
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, JOB, str(warehouse), *statements],
            cwd=warehouse.parent,
            env={**spark_env(), **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_path.open("w"),
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def rows_until_waiting(self) -> list:
        """The rows of each statement it ran until it waits (or ends)."""
        rows = []
        while True:
            line = self.lines.get(timeout=JVM_TIMEOUT)
            if line is None or line.startswith("WAITING "):
                return rows
            self.output.append(line)
            assert not line.startswith("ERROR "), [*self.output, self.log()]
            if line.startswith("ROWS "):
                rows.append(json.loads(line[5:]))

    def resume(self, name: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def finish(self) -> list:
        rows = self.rows_until_waiting()
        assert self.proc.wait(timeout=JVM_TIMEOUT) == 0, [*self.output, self.log()]
        return rows

    def log(self) -> str:
        return self.log_path.read_text()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a server, a session beside it, then spark-sql: ~4 min on 2 cores
def test_a_postgresql_metastore_is_shared_by_processes_running_together(tmp_path, postgres):
    """``deltaflow sql-server`` and a ``deltaflow.session()`` both up on one PostgreSQL
    metastore: each creates, alters and reads tables, and sees the other's at once."""
    env = {
        "DELTAFLOW_METASTORE_URL": postgres.jdbc_url,
        "DELTAFLOW_METASTORE_JARS": str(_postgres.driver_jar()),
        "DELTAFLOW_METASTORE_USER": "postgres",
    }
    warehouse = tmp_path / "warehouse"
    server = SqlServer(warehouse, env)
    session = SessionProcess(
        warehouse,
        [
            *CREATE_IN_SESSION,
            "WAIT server-wrote",
            "SELECT k FROM sales.by_jdbc",
            "SHOW TBLPROPERTIES sales.orders ('stage')",
            "ALTER TABLE sales.by_jdbc SET TBLPROPERTIES ('steward' = 'session')",
            "INSERT INTO sales.by_jdbc VALUES ('s')",
            "WAIT server-read",
            "SHOW TABLES IN sales",
        ],
        env,
    )
    try:
        # The session registered a schema and a table; the server's clients see them.
        assert len(session.rows_until_waiting()) == len(CREATE_IN_SESSION)
        lines = server.query(
            "SELECT count(*) AS n FROM sales.orders;"
            " CREATE TABLE sales.by_jdbc (k STRING) USING delta;"
            " INSERT INTO sales.by_jdbc VALUES ('j');"
            " ALTER TABLE sales.orders SET TBLPROPERTIES ('stage' = 'gold');"
        )
        assert "2" in lines, lines
        session.resume("server-wrote")
        # The session, still running, sees the server's new table and its ALTER.
        by_jdbc, stage, _, _ = session.rows_until_waiting()
        assert by_jdbc == [["j"]]
        assert stage == [["stage", "gold"]]
        lines = server.query(
            "SHOW TBLPROPERTIES sales.by_jdbc ('steward'); SELECT k FROM sales.by_jdbc ORDER BY k;"
        )
        assert "steward,session" in lines and "s" in lines and "j" in lines, lines
        session.resume("server-read")
        (tables,) = session.finish()
        assert sorted(t[1] for t in tables) == ["by_jdbc", "orders"]
    finally:
        session.kill()
        server.stop()
    assert not (warehouse / "_metastore").exists()  # nothing went to Derby
    out = spark_sql(
        warehouse, "SHOW TABLES IN sales; SHOW TBLPROPERTIES sales.orders ('stage');", env
    )
    lines = out.splitlines()  # a third process, after both: the same catalog
    assert "by_jdbc" in lines and "orders" in lines and "stage\tgold" in lines, out
