"""dbt (dbt-spark 1.11) on deltaflow: the project under ``tests/dbt/project`` — a seed, a
``table`` model, ``incremental`` models with the ``merge``, ``append`` and
``insert_overwrite`` strategies and ``on_schema_change``, a snapshot, data tests, ``docs
generate`` and ``persist_docs`` — run twice (load 1, then load 2, seeding again), with the
``thrift`` method against ``deltaflow sql-server`` and with the ``session`` method (PySpark
in dbt's process, ``deltaflow.spark_conf()`` as its ``server_side_parameters``). Results
are read back from the Delta logs with delta-rs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import deltalake
import pytest
import yaml

import deltaflow
from tests.dbt import _dbt
from tests.spark.test_hosts import free_port, spark_env, wait_for_port

# dbt starts in ~20 s per command and runs each model as several statements: the two
# loads take minutes (about 10 on a busy 2-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

SCHEMA = "analytics"


@dataclass
class Project:
    """A finished two-load run: the warehouse its tables are in, dbt's target folder."""

    warehouse: Path
    target: Path

    def table(self, name: str) -> deltalake.DeltaTable:
        return deltalake.DeltaTable(str(self.warehouse / f"{SCHEMA}.db" / name))

    def rows(self, name: str, *columns: str) -> list[tuple]:
        table = self.table(name).to_pyarrow_table()
        return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def write_profile(directory: Path, output: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    profile = {"deltaflow": {"target": "dev", "outputs": {"dev": output}}}
    (directory / "profiles.yml").write_text(yaml.safe_dump(profile))
    return directory


def run_both_loads(
    profiles: Path, work: Path, *, in_process_spark: bool = False
) -> list[tuple[str, subprocess.CompletedProcess[str]]]:
    """``dbt build`` (seed, models, snapshot, tests) for load 1, ``docs generate``, then
    ``dbt build`` for load 2 — which seeds again: the seed's rows must not double."""
    steps = [["build"], ["docs", "generate"], ["build", "--vars", "{load: 2}"]]
    env = {"DBT_TARGET_PATH": str(work / "target"), "DBT_LOG_PATH": str(work / "logs")}
    done = []
    for step in steps:
        result = _dbt.run(step, profiles, cwd=work, in_process_spark=in_process_spark, env=env)
        done.append((" ".join(step), result))
        if result.returncode != 0:
            break
    return done


def failure(done: list[tuple[str, subprocess.CompletedProcess[str]]], log: Path | None) -> str:
    step, result = done[-1]
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    return f"dbt {step} failed:\n{result.stdout[-5000:]}\n{result.stderr[-2000:]}\n{tail}"


@contextmanager
def sql_server(work: Path, warehouse: Path) -> Iterator[int]:
    """``deltaflow sql-server`` on a free port, managed tables under ``warehouse``, its log
    appended to ``work/server.log``; the port."""
    port = free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "deltaflow.cli", "sql-server", "--port", str(port)),
            *("--master", "local[2]", "--warehouse", str(warehouse)),
            *("--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"),
        ],
        cwd=work,
        env=spark_env(),
        stdout=subprocess.DEVNULL,
        stderr=(work / "server.log").open("a"),
        text=True,
    )
    try:
        _dbt.environment()  # while the server starts
        wait_for_port(port, server, timeout=300)
        yield port
    finally:
        server.terminate()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=60)


def thrift_profile(directory: Path, port: int) -> Path:
    return write_profile(
        directory,
        {
            "type": "spark",
            "method": "thrift",
            "host": "127.0.0.1",
            "port": port,
            "schema": SCHEMA,
            "threads": 1,
            "connect_retries": 3,
            "connect_timeout": 10,
        },
    )


@pytest.fixture(scope="module")
def thrift_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    work = tmp_path_factory.mktemp("dbt-thrift")
    warehouse = work / "warehouse"
    with sql_server(work, warehouse) as port:
        done = run_both_loads(thrift_profile(work / "profiles", port), work)
        assert done[-1][1].returncode == 0, failure(done, work / "server.log")
        yield Project(warehouse, work / "target")


def check_results(project: Project) -> None:
    # Seeded twice: the seed's four rows, once.
    assert project.rows("people", "id", "name") == [(1, "ada"), (2, "bob"), (3, "cy"), (4, "dee")]
    assert project.rows("people_table", "id", "city") == [
        (1, "paris"),
        (2, "lima"),
        (3, "paris"),
        (4, "oslo"),
    ]
    # merge: load 2 updated ids 3 and 4, inserted 5, and added the new column.
    assert project.rows("events_merge", "id", "name", "city_code") == [
        (1, "ada-1", None),
        (2, "bob-1", None),
        (3, "cy-2", "PARIS"),
        (4, "dee-2", "OSLO"),
        (5, "eve-2", "ROME"),
    ]
    # append: every load's rows.
    assert project.rows("events_append", "load", "id") == [
        *((1, i) for i in range(1, 5)),
        *((2, i) for i in range(1, 5)),
    ]
    # insert_overwrite: load 2 rewrote the paris partition only.
    assert project.rows("cities_overwrite", "city", "n") == [("lima", 1), ("oslo", 1), ("paris", 4)]
    # snapshot: bob's change closed his first row and opened a new one.
    snapshot = project.table("people_snapshot").to_pyarrow_table().to_pylist()
    assert len(snapshot) == 5
    current = sorted((r["id"], r["name"]) for r in snapshot if r["dbt_valid_to"] is None)
    assert current == [(1, "ada"), (2, "bobby"), (3, "cy"), (4, "dee")]
    closed = [(r["id"], r["name"]) for r in snapshot if r["dbt_valid_to"] is not None]
    assert closed == [(2, "bob")]


def check_docs(project: Project) -> None:
    # persist_docs: the model's description and column descriptions are in the Delta log.
    table = project.table("people_table")
    assert table.metadata().description == "Everyone, as a table."
    fields = {f.name: f for f in table.schema().fields}
    assert fields["id"].metadata.get("comment") == "The person's id."
    # docs generate: the catalog lists the models with their columns.
    catalog = json.loads((project.target / "catalog.json").read_text())
    nodes = {key.split(".")[-1]: node for key, node in catalog["nodes"].items()}
    assert set(nodes["people_table"]["columns"]) >= {"id", "name", "city"}
    assert {"events_merge", "events_append", "cities_overwrite"} <= set(nodes)


def test_thrift_runs_every_materialization_with_correct_results(thrift_project):
    check_results(thrift_project)


def test_thrift_persists_docs_and_generates_the_catalog(thrift_project):
    check_docs(thrift_project)


def test_session_method_runs_the_project_in_process(tmp_path):
    """dbt's ``session`` method: PySpark in dbt's own process, configured only by
    ``server_side_parameters`` (``deltaflow.spark_conf()``) — no ``register()`` call."""
    warehouse = tmp_path / "warehouse"
    parameters = {
        **deltaflow.spark_conf(),
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={tmp_path / 'metastore_db'};create=true"
        ),
    }
    profiles = write_profile(
        tmp_path / "profiles",
        {
            "type": "spark",
            "method": "session",
            "host": "NA",
            "schema": SCHEMA,
            "threads": 1,
            "server_side_parameters": parameters,
        },
    )
    done = run_both_loads(profiles, tmp_path, in_process_spark=True)
    assert done[-1][1].returncode == 0, failure(done, None)
    project = Project(warehouse, tmp_path / "target")
    check_results(project)
    check_docs(project)


DOUBLED_AFTER_RESTART = (
    "needs the persistent catalog and the refusal of a managed CREATE over a folder that"
    " holds a table (branch `catalog`, issue 26 parts 6 and 8): with the in-memory catalog"
    " the restarted server forgets the schema, and the seed's CREATE adopts the old table,"
    " doubling its rows"
)


def test_a_second_seed_after_a_server_restart_does_not_double_rows(tmp_path):
    warehouse = tmp_path / "warehouse"
    env = {"DBT_TARGET_PATH": str(tmp_path / "target"), "DBT_LOG_PATH": str(tmp_path / "logs")}
    for attempt in (1, 2):
        with sql_server(tmp_path, warehouse) as port:
            profiles = thrift_profile(tmp_path / f"profiles{attempt}", port)
            result = _dbt.run(["seed"], profiles, cwd=tmp_path, env=env)
            assert result.returncode == 0, result.stdout[-5000:]
    rows = Project(warehouse, tmp_path / "target").rows("people", "id")
    if rows == sorted([(1,), (2,), (3,), (4,)] * 2):
        pytest.xfail(DOUBLED_AFTER_RESTART)  # only this known failure; anything else fails
    assert rows == [(1,), (2,), (3,), (4,)]
