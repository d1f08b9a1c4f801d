"""``deltaflow sql-server``: Spark's Thrift JDBC server on a deltaflow session, driven by
the wheel's ``beeline`` while a stream writes the same table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests._waiting import wait_while_running
from tests.spark._beeline import beeline, jdbc_url
from tests.spark.test_hosts import free_port, spark_env, wait_for_port

pytestmark = pytest.mark.slow


def test_beeline_runs_ddl_dml_and_queries_while_a_stream_writes(table_path, tmp_path):
    path = table_path("served")
    write_deltalake(
        path,
        pa.table(
            {
                "id": pa.array([0], pa.int64()),
                "v": pa.array(["seed"]),
                "src": pa.array(["seed"]),
            }
        ),
        partition_by=["src"],
    )
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            *("-m", "deltaflow.cli", "sql-server"),
            *("--port", str(port), "--master", "local[2]"),
            *("--warehouse", str(tmp_path / "warehouse")),
        ],
        cwd=tmp_path,
        env=spark_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "server.log").open("w"),
        text=True,
    )
    stream = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "_stream_writer_job.py"),
            path,
            str(tmp_path / "checkpoint"),
        ],
        cwd=tmp_path,
        env=spark_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stream.log").open("w"),
        text=True,
    )
    try:
        wait_for_port(port, server, timeout=300)
        wait_while_running(
            lambda: DeltaTable(path).version() >= 2, stream, 300, "two stream commits"
        )
        statements = (
            f"CREATE TABLE served USING delta LOCATION '{path}';"
            " INSERT INTO served VALUES (1, 'a', 'sql'), (2, 'b', 'sql');"
            " MERGE INTO served t"
            " USING (SELECT 2 AS id, 'B' AS v, 'sql' AS src UNION ALL SELECT 3, 'c', 'sql') s"
            " ON t.src = 'sql' AND t.id = s.id"
            " WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *;"
            " SELECT id, v FROM served WHERE src = 'sql' ORDER BY id;"
            " SELECT count(*) > 0 AS streamed FROM served WHERE src = 'stream';"
        )
        result = beeline(jdbc_url(port), statements)
        assert stream.poll() is None, (tmp_path / "stream.log").read_text()[-3000:]
    finally:
        stream.kill()
        stream.wait(timeout=60)
        server.terminate()
        server.wait(timeout=120)
    log = (tmp_path / "server.log").read_text()[-3000:]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:] + log
    lines = result.stdout.splitlines()
    merge_result = lines.index(
        "num_affected_rows,num_updated_rows,num_deleted_rows,num_inserted_rows"
    )
    assert lines[merge_result + 1] == "2,1,0,1"
    selected = lines.index("id,v")
    assert lines[selected + 1 : selected + 4] == ["1,a", "2,B", "3,c"]
    assert lines[lines.index("streamed") + 1] == "true"
    table = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["v"]) for r in table if r["src"] == "sql") == [
        (1, "a"),
        (2, "B"),
        (3, "c"),
    ]
    assert any(r["src"] == "stream" for r in table)
