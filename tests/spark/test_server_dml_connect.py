"""Delta DML, the change feed, partition overwrites and Delta's SQL commands from a Spark
Connect client: a separate process, in a folder of its own, that never opens the tables'
storage. The server is started from the wheel with nothing but ``deltaflow.spark_conf()``
(one per module); its brain runs the DML in the client's own session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow._session import _check_connect_server
from deltaflow.spark.errors import SessionNotConfiguredError
from tests._waiting import wait_until
from tests.spark import _server_dml as scenario
from tests.spark.test_hosts import free_port, start_server, stop, wait_for_port

pytestmark = pytest.mark.slow

CONNECT = "org.apache.spark.sql.connect.service.SparkConnectServer"


@pytest.fixture(scope="module")
def connect_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    home = tmp_path_factory.mktemp("connect_server")
    port = free_port()
    server = start_server(
        CONNECT,
        home,
        {
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.grpc.binding.address": "127.0.0.1",
        },
    )
    try:
        wait_for_port(port, server, timeout=300)
        yield port, server
    finally:
        log = stop(server, home)
        print(log[-2000:])


@pytest.fixture
def connect_port(connect_server: tuple[int, subprocess.Popen[str]]) -> int:
    return connect_server[0]


def run_client(tmp_path: Path, port: int, body: str, *args: str) -> dict[str, object]:
    """Run ``body`` in a Connect client process (cwd: a folder of its own), with
    ``spark`` from ``deltaflow.session(remote=...)`` and ``args`` in ``ARGS``; the JSON
    it printed after ``RESULT``."""
    home = tmp_path / "client"
    home.mkdir(exist_ok=True)
    source = (
        textwrap.dedent(
            """
        import json, sys
        import deltaflow
        ARGS = sys.argv[2:]
        spark = deltaflow.session(remote=f"sc://127.0.0.1:{sys.argv[1]}")
        out = {}
        """
        )
        + textwrap.dedent(body)
        + '\nprint("RESULT " + json.dumps(out, default=str))\n'
    )
    script = home / "client.py"
    script.write_text(source)
    result = subprocess.run(
        [sys.executable, str(script), str(port), *args],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    # The error's own lines, not the JVM stack trace Connect appends.
    said = [x for x in result.stderr.splitlines() if not x.lstrip().startswith("at ")]
    assert result.returncode == 0, result.stdout[-3000:] + "\n".join(said)[-6000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


SQL_SCENARIO = """
    statements, bad = json.loads(ARGS[0]), json.loads(ARGS[1])
    for statement in statements:
        rows = [list(r) for r in spark.sql(statement).collect()]
        out.setdefault("rows", []).append(rows)
    out["errors"] = []
    for statement in bad:
        try:
            spark.sql(statement).collect()
            out["errors"].append(None)
        except Exception as exc:
            typed = deltaflow.typed_error(exc)
            out["errors"].append([type(typed).__name__ if typed else None, str(exc)[:2000]])
"""


def test_sql_dml_cdf_overwrites_and_commands_from_a_connect_client(
    connect_port: int, tmp_path: Path
) -> None:
    tables = scenario.Tables.under(tmp_path / "tables")
    statements = scenario.script(tables)
    out = run_client(
        tmp_path,
        connect_port,
        SQL_SCENARIO,
        json.dumps(statements),
        json.dumps(scenario.bad(tables)),
    )
    results = dict(zip(statements, out["rows"], strict=True))  # type: ignore[call-overload]
    update, delete, merge = (results[s] for s in scenario.dml(tables.cdf))
    assert (update, delete, merge) == ([[1]], [[1]], [[3, 1, 1, 1]])
    assert results[scenario.changes_query(tables.cdf)] == [["CDF", scenario.CHANGES]]
    history = results[f"DESCRIBE HISTORY delta.`{tables.cdf}`"]
    assert [row[4] for row in history] == scenario.HISTORY  # (version, timestamp, ...)
    detail = results[f"DESCRIBE DETAIL delta.`{tables.cdf}`"]
    assert detail[0][0] == "delta" and tables.cdf in str(detail[0])
    scenario.check_tables(tables)
    # A bad statement reaches the client as a typed deltaflow error, changing nothing.
    (missing_type, missing), (ambiguous_type, ambiguous) = out["errors"]  # type: ignore[misc]
    assert missing_type == "SchemaMismatchError", missing
    assert "nosuch" in missing
    assert ambiguous_type == "BridgeError", ambiguous
    assert "AMBIGUOUS_REFERENCE" in ambiguous
    scenario.check_unchanged_by_bad(tables)


DATAFRAMES = """
    cdf, parts = ARGS
    batch = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", 2).option("endingVersion", 4).load(cdf)
    )
    out["batch"] = sorted(f"{r._change_type}:{r.id}" for r in batch.collect())
    stream = (
        spark.readStream.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", 2).load(cdf)
        .selectExpr("concat(_change_type, ':', CAST(id AS STRING)) AS change")
        .writeStream.format("memory").queryName("changes").trigger(availableNow=True).start()
    )
    stream.awaitTermination(600)
    out["stream"] = sorted(r.change for r in spark.table("changes").collect())
    frame = spark.createDataFrame([(10, 1)], "id long, p int")
    frame.write.format("delta").mode("overwrite").option("replaceWhere", "p = 1").save(parts)
    dynamic = spark.createDataFrame([(20, 2), (30, 3)], "id long, p int")
    (
        dynamic.write.format("delta").mode("overwrite")
        .option("partitionOverwriteMode", "dynamic").save(parts)
    )
    out["parts"] = sorted(tuple(r) for r in spark.read.format("delta").load(parts).collect())
"""


def test_change_feed_reads_and_replace_where_from_a_connect_client(
    connect_port: int, tmp_path: Path
) -> None:
    tables = scenario.Tables.under(tmp_path / "tables")
    statements = [*scenario.setup(tables), *scenario.dml(tables.cdf)]
    run_client(tmp_path, connect_port, SQL_SCENARIO, json.dumps(statements), "[]")

    out = run_client(tmp_path, connect_port, DATAFRAMES, tables.cdf, tables.parts)
    assert out["batch"] == scenario.CHANGES.split(" ")
    assert out["stream"] == scenario.CHANGES.split(" ")  # versions 2-4, the last ones
    assert [tuple(r) for r in out["parts"]] == scenario.PARTITIONS_AFTER_DYNAMIC  # type: ignore[attr-defined]
    assert scenario.rows(tables.parts, version=2) == scenario.PARTITIONS_AFTER_STATIC


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


def test_register_on_a_connect_server_without_the_connector_is_refused_typed() -> None:
    with pytest.raises(SessionNotConfiguredError) as caught:
        _check_connect_server(_Session({}))  # type: ignore[arg-type]
    assert caught.value.missing == ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
    _check_connect_server(  # the settings spark_conf() gives pass
        _Session(  # type: ignore[arg-type]
            {
                "spark.sql.extensions": "io.deltaflow.spark.DeltaSparkSessionExtension",
                "spark.sql.catalog.spark_catalog": "io.deltaflow.spark.DeltaCatalog",
            }
        )
    )


CONCURRENT = """
    import threading
    from pyspark.sql import SparkSession

    url = f"sc://127.0.0.1:{sys.argv[1]}"
    results, failures = {}, []

    def merge(name, path, key):
        try:
            own = SparkSession.builder.remote(url).create()  # a session of its own
            own.sql(
                f"CREATE OR REPLACE TEMPORARY VIEW src AS SELECT {key}L AS id, '{name}' AS v"
            )
            for i in range(2):
                own.sql(
                    f"MERGE INTO delta.`{path}` AS t USING src AS s ON t.id = s.id"
                    " WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
                ).collect()
            results[name] = sorted(tuple(r) for r in own.read.format("delta").load(path).collect())
        except Exception as exc:
            failures.append(repr(exc)[:2000])

    threads = [
        threading.Thread(target=merge, args=(name, path, key))
        for name, path, key in (("left", ARGS[0], 1), ("right", ARGS[1], 7))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["results"], out["failures"] = results, failures
"""


def test_concurrent_merges_in_two_sessions_each_see_their_own_temp_view(
    connect_port: int, tmp_path: Path
) -> None:
    """Two sessions of one server MERGE at once, each from its own temp view named
    ``src``: the brain runs each statement in its own session."""
    left, right = str(tmp_path / "left"), str(tmp_path / "right")
    for path in (left, right):
        write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    out = run_client(tmp_path, connect_port, CONCURRENT, left, right)
    assert out["failures"] == []
    assert scenario.rows(left) == [(1, "left"), (2, "b")]
    assert scenario.rows(right) == [(1, "a"), (2, "b"), (7, "right")]
    assert [h["operation"] for h in DeltaTable(right).history()][:2] == ["MERGE", "MERGE"]


def brain_processes(server: subprocess.Popen[str]) -> list[int]:
    """The brain processes the server's JVM started (its children running the bridge)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0
        )
        if parent == server.pid and "deltaflow.spark.bridge._server" in command:
            found.append(int(entry.name))
    return found


UPDATE = """
    spark.sql(f"UPDATE delta.`{ARGS[0]}` SET v = 'after' WHERE id = 2").collect()
"""


def test_dml_after_the_brain_restarts(
    connect_server: tuple[int, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """A brain that died is started again at the next call, and reaches the JVM through
    the same gateway."""
    port, server = connect_server
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    run_client(tmp_path, port, UPDATE, path)  # the brain has a session now
    brains = brain_processes(server)
    assert len(brains) == 1, brains
    os.kill(brains[0], signal.SIGKILL)
    wait_until(lambda: brains[0] not in brain_processes(server), 60, "the brain to exit")

    run_client(tmp_path, port, UPDATE.replace("'after'", "'again'"), path)
    assert scenario.rows(path) == [(1, "a"), (2, "again")]
    assert brain_processes(server) not in ([], brains)
