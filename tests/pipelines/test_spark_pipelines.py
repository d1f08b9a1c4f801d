"""Spark's own pipelines runner, ``spark-pipelines run`` (pyspark's wheel), on deltaflow's
tables: the SDP project of ``_sdp_project.py`` run twice, its settings given to the runner
the documented way (``deltaflow.spark_conf()`` in ``spark-defaults.conf`` under
``SPARK_CONF_DIR``), its streaming table and materialized views Delta tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

import deltaflow
from tests.pipelines._sdp_project import land_orders, rows, write_project

pytestmark = pytest.mark.slow

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def run_pipeline(spec: Path, conf_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_CONF_DIR": str(conf_dir),
    }
    return subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-pipelines"), "run", "--spec", str(spec)],
        cwd=cwd,  # the metastore (Derby) of the catalog both runs share
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_spark_pipelines_runs_an_sdp_project_on_delta_tables_twice(tmp_path: Path) -> None:
    orders = str(tmp_path / "landing" / "orders")
    warehouse = tmp_path / "warehouse"
    spec = write_project(
        tmp_path / "shop", orders, "default", (tmp_path / "storage").resolve().as_uri()
    )
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    settings = {
        **deltaflow.spark_conf(),
        "spark.ui.enabled": "false",
        "spark.sql.warehouse.dir": str(warehouse),
        # A catalog that outlives the run, so the second run refreshes the same tables.
        "spark.sql.catalogImplementation": "hive",
    }
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{key} {value}\n" for key, value in settings.items())
    )

    land_orders(orders, [("ann", 5.0), ("bob", 20.0)])
    first = run_pipeline(spec, conf_dir, tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    assert rows(str(warehouse / "orders"), "customer", "amount") == [("ann", 5.0), ("bob", 20.0)]
    assert rows(str(warehouse / "totals"), "customer", "total") == [("ann", 5.0), ("bob", 20.0)]
    assert rows(str(warehouse / "big_customers"), "customer") == [("bob",)]

    # The streaming table takes only the new rows; the materialized views are refreshed.
    land_orders(orders, [("ann", 7.0)])
    second = run_pipeline(spec, conf_dir, tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
    assert rows(str(warehouse / "orders"), "customer", "amount") == [
        ("ann", 5.0),
        ("ann", 7.0),
        ("bob", 20.0),
    ]
    assert rows(str(warehouse / "totals"), "customer", "total") == [("ann", 12.0), ("bob", 20.0)]
    assert rows(str(warehouse / "big_customers"), "customer") == [("ann",), ("bob",)]
