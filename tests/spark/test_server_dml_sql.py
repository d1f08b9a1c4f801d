"""Delta DML, the change feed, partition overwrites and Delta's SQL commands from the SQL
hosts in the pyspark wheel, started with nothing but ``deltaflow.spark_conf()``: the
``spark-sql`` CLI (``-e``) and the Thrift JDBC server (one per module) with beeline. No
Python driver runs: the connector's brain runs the DML in the host's own session."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark import _server_dml as scenario
from tests.spark._beeline import beeline, jdbc_url
from tests.spark.test_hosts import (
    SPARK_HOME,
    conf_args,
    free_port,
    spark_env,
    start_server,
    stop,
    wait_for_port,
)

pytestmark = pytest.mark.slow

THRIFT = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


def check_output(tables: scenario.Tables, stdout: str, errors: str) -> None:
    """What a SQL host printed for the scenario and its two bad statements."""
    assert scenario.result_line(stdout, "CDF") == scenario.CHANGES, stdout[-3000:]
    for operation in scenario.HISTORY:
        assert operation in stdout, operation
    assert tables.cdf in stdout  # DESCRIBE DETAIL's location
    scenario.check_tables(tables)
    # Each bad statement failed typed, its deltaflow error carried to the client.
    found = set(scenario.typed_errors(errors))
    assert "SchemaMismatchError" in found, errors[-4000:]
    # The ambiguous MERGE's BridgeError: spark-sql prints its marker; beeline (2026-11-28)
    # showed Spark's message without it, so the message is what is checked on both.
    error_lines = [line[:600] for line in errors.splitlines() if "Error" in line[:40]]
    assert "AMBIGUOUS_REFERENCE" in errors, error_lines
    scenario.check_unchanged_by_bad(tables)


@pytest.mark.timeout(1800)  # some 35 statements; minutes on a loaded 2-core machine
def test_sql_dml_cdf_overwrites_and_commands_from_spark_sql(tmp_path: Path) -> None:
    tables = scenario.Tables.under(tmp_path / "tables")
    statements = [*scenario.script(tables), *scenario.bad(tables)]
    home = tmp_path / "cli"
    home.mkdir()
    result = subprocess.run(
        [
            str(SPARK_HOME / "bin" / "spark-sql"),
            *("--master", "local[2]"),
            *conf_args(),
            # Go on after the bad statements' errors (the CLI stops at the first one).
            *("--hiveconf", "hive.cli.errors.ignore=true"),
            *("-e", ";\n".join(statements) + ";"),
        ],
        cwd=home,  # the CLI's Derby metastore and warehouse go here
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    check_output(tables, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def thrift_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    home = tmp_path_factory.mktemp("thrift_server")
    port = free_port()
    server = start_server(
        THRIFT,
        home,
        args=(
            *("--hiveconf", f"hive.server2.thrift.port={port}"),
            *("--hiveconf", "hive.server2.thrift.bind.host=127.0.0.1"),
        ),
    )
    try:
        # Its Derby metastore's first start: minutes on a loaded 2-core machine.
        wait_for_port(port, server, timeout=600)
        yield port
    finally:
        print(stop(server, home)[-2000:])


@pytest.mark.timeout(1800)
def test_sql_dml_cdf_overwrites_and_commands_from_beeline(thrift_port: int, tmp_path: Path) -> None:
    tables = scenario.Tables.under(tmp_path / "tables")
    statements = [*scenario.script(tables), *scenario.bad(tables)]
    result = beeline(jdbc_url(thrift_port), statements, force=True, timeout=1200)
    check_output(tables, result.stdout, result.stdout + result.stderr)
