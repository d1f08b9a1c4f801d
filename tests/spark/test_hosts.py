"""The connector outside a PySpark driver: the ``spark-sql`` CLI, a Spark Connect server and
the Thrift JDBC server (with beeline), each started from the pyspark wheel with nothing
but ``deltaflow.spark_conf()``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from tests._waiting import wait_while_running

pytestmark = pytest.mark.slow

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def conf_args(extra: dict[str, str] | None = None) -> list[str]:
    settings = {**deltaflow.spark_conf(), "spark.ui.enabled": "false", **(extra or {})}
    return [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]


def spark_env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable}


def seeded(path: str) -> None:
    write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))


def test_spark_sql_cli_reads_and_writes_a_delta_table(table_path, tmp_path):
    path = table_path()
    seeded(path)
    statements = (
        f"CREATE TEMPORARY VIEW v USING delta OPTIONS (path '{path}');"
        " INSERT INTO v VALUES (3, 'c');"
        " SELECT count(*), sum(id), max(name) FROM v WHERE id > 1;"
    )
    command = [str(SPARK_HOME / "bin" / "spark-sql"), "--master", "local[1]", *conf_args()]
    result = subprocess.run(
        [*command, "-e", statements],
        cwd=tmp_path,  # the CLI's Derby metastore and warehouse go here
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2\t5\tc" in result.stdout.splitlines(), result.stdout
    table = DeltaTable(path)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, server: subprocess.Popen[str], timeout: float) -> None:
    """Probe the port until it answers, while the server runs."""

    def listens() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    wait_while_running(listens, server, timeout, f"the server listening on {port}")


def start_server(
    main_class: str,
    tmp_path: Path,
    conf: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    master: str = "local[2]",
) -> subprocess.Popen[str]:
    """``spark-submit`` a server class of the wheel (local[2], ``spark_conf()``), logging to
    ``tmp_path/server.log``; its metastore and warehouse go to ``tmp_path``."""
    return subprocess.Popen(
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            *("--class", main_class, "--master", master),
            *conf_args(conf),
            "spark-internal",
            *args,
        ],
        cwd=tmp_path,
        env=spark_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "server.log").open("w"),
        text=True,
    )


CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


def start_connect_server(
    tmp_path: Path, conf: dict[str, str] | None = None, master: str = "local[2]"
) -> tuple[subprocess.Popen[str], int]:
    """A Spark Connect server (:func:`start_server`) on a free loopback port, and the port;
    the caller waits for it (``wait_for_port``) and stops it (:func:`stop`)."""
    port = free_port()
    binding = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
    }
    return start_server(CONNECT_SERVER, tmp_path, {**binding, **(conf or {})}, master=master), port


def stop(server: subprocess.Popen[str], tmp_path: Path) -> str:
    """Stop ``server``; the tail of its log, for failure messages."""
    server.terminate()
    server.wait(timeout=60)
    return (tmp_path / "server.log").read_text()[-3000:]


CLIENT = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession

    port, path = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    spark.range(3, 6).selectExpr("id", "'x' AS name").write.format("delta").mode(
        "append"
    ).save(path)
    df = spark.read.format("delta").load(path)
    rows = sorted((r.id, r.name) for r in df.collect())
    print("ROWS", rows)
    print("COUNT", df.where("id >= 3").count())
    spark.stop()
    """
)


def run_connect_client(
    tmp_path: Path, source: str, path: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """A Spark Connect server started with only spark_conf(), and the client script
    ``source`` run against it with ``<port> <path>``; the client's result and the
    server's log."""
    server, port = start_connect_server(tmp_path)
    try:
        wait_for_port(port, server, timeout=180)
        client = tmp_path / "client.py"
        client.write_text(source)
        result = subprocess.run(
            [sys.executable, str(client), str(port), path],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        log = stop(server, tmp_path)
    return result, log


def test_spark_connect_client_reads_and_writes_a_delta_table(table_path, tmp_path):
    path = table_path()
    seeded(path)
    result, log = run_connect_client(tmp_path, CLIENT, path)
    assert result.returncode == 0, result.stderr[-3000:] + log
    assert "ROWS [(1, 'a'), (2, 'b'), (3, 'x'), (4, 'x'), (5, 'x')]" in result.stdout
    assert "COUNT 3" in result.stdout
    assert DeltaTable(path).version() == 1


def test_thrift_jdbc_server_and_beeline_read_and_write_a_delta_table(table_path, tmp_path):
    """The Thrift JDBC server (HiveThriftServer2, in the pyspark wheel) with only
    ``deltaflow.spark_conf()``, and the wheel's ``beeline`` as the JDBC client."""
    path = table_path()
    seeded(path)
    port = free_port()
    server = start_server(
        "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2",
        tmp_path,
        args=(
            *("--hiveconf", f"hive.server2.thrift.port={port}"),
            *("--hiveconf", "hive.server2.thrift.bind.host=127.0.0.1"),
        ),
    )
    statements = (
        f"CREATE TEMPORARY VIEW v USING delta OPTIONS (path '{path}');"
        " INSERT INTO v VALUES (3, 'c');"
        " SELECT count(*) AS n, sum(id) AS s FROM v WHERE id > 1;"
    )
    try:
        wait_for_port(port, server, timeout=240)
        result = subprocess.run(
            [
                str(SPARK_HOME / "bin" / "beeline"),
                *("-u", f"jdbc:hive2://127.0.0.1:{port}/default"),
                *("--outputformat=csv2", "--silent=true", "-e", statements),
            ],
            cwd=tmp_path,
            env=spark_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        log = stop(server, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:] + log
    assert "2,5" in result.stdout.splitlines(), result.stdout
    table = DeltaTable(path)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]


TO_TABLE_CLIENT = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession

    port, path = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    spark.sql("CREATE TABLE streamed (id BIGINT, name STRING) USING delta")

    def to_table(mode="append", table="streamed", frame=None):
        frame = frame if frame is not None else spark.readStream.format("delta").load(path)
        query = (
            frame.writeStream.outputMode(mode)
            .option("checkpointLocation", path + "_ck_" + table + mode)
            .trigger(availableNow=True)
            .toTable(table)
        )
        query.awaitTermination()
        return query

    query = to_table()
    print("SINK", query.lastProgress["sink"]["description"].split("[")[0])
    print("FIRST", sorted(r.id for r in spark.table("streamed").collect()))
    spark.range(3, 5).selectExpr("id", "'y' AS name").write.format("delta").mode(
        "append"
    ).save(path)
    to_table()  # restarted from its checkpoint: only the new rows
    print("SECOND", sorted(r.id for r in spark.table("streamed").collect()))
    spark.sql("CREATE TABLE counted (name STRING, n BIGINT) USING delta")
    counts = (
        spark.readStream.format("delta").load(path).groupBy("name").count()
        .withColumnRenamed("count", "n")
    )
    to_table("complete", "counted", counts)
    print("COMPLETE", sorted((r.name, r.n) for r in spark.table("counted").collect()))
    try:
        counts.writeStream.outputMode("update").option(
            "checkpointLocation", path + "_ck_update"
        ).toTable("counted")
        print("UPDATE ran")
    except Exception as exc:
        import deltaflow

        print("UPDATE", type(deltaflow.typed_error(exc)).__name__)
    spark.stop()
    """
)


def test_spark_connect_client_streams_into_a_catalog_table_by_name(table_path, tmp_path):
    """writeStream.toTable(<delta catalog table>) from a Connect client: the table's own
    streaming write on the server, restart without duplicates, complete mode, and update
    mode refused with deltaflow's typed error."""
    path = table_path()
    seeded(path)
    result, log = run_connect_client(tmp_path, TO_TABLE_CLIENT, path)
    assert result.returncode == 0, result.stderr[-3000:] + log
    lines = result.stdout.splitlines()
    assert "SINK DeltaTable" in lines
    assert "FIRST [1, 2]" in lines
    assert "SECOND [1, 2, 3, 4]" in lines
    assert "COMPLETE [('a', 1), ('b', 1), ('y', 2)]" in lines
    assert "UPDATE InvalidOptionError" in lines
