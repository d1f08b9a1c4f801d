"""`deltaflow pipelines run` on a spec with Lakeflow's ``continuous: true`` and real-time
mode enabled: the command keeps a real-time flow running, rows appended upstream reach the
sink within the epoch, and SIGTERM stops the update cleanly (exit 0, nothing twice), as a
service manager would stop it (issue 28 part 4, from the command line)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.spark._compat import PYSPARK_MINOR
from tests._waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

SPEC = """name: rt_cli
storage: storage
continuous: true
configuration:
  spark.databricks.streaming.realTimeMode.enabled: 'true'
  rt.source: '{source}'
  rt.sink: '{sink}'
libraries:
  - glob:
      include: transformations/**
"""

FLOWS = """from deltaflow import pipelines as dp

dp.create_sink("alerts", "delta", {"path": spark.conf.get("rt.sink")})


@dp.update_flow(target="alerts", spark_conf={"pipelines.trigger": "RealTime"})
def to_alerts():
    source = spark.conf.get("rt.source")
    return spark.readStream.format("delta").load(source).selectExpr("id", "id * 2 AS twice")
"""


def _append(path: Path, ids: range) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array(list(ids), pa.int64())}), mode="append")


def _rows(path: Path) -> list[tuple[int, int]]:
    if not (path / "_delta_log").exists():
        return []
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted((r["id"], r["twice"]) for r in rows)


def test_a_continuous_real_time_spec_runs_until_sigterm(tmp_path: Path) -> None:
    run_until_sigterm(tmp_path)


def run_until_sigterm(tmp_path: Path, *options: str) -> None:
    """Run the spec's continuous update with ``deltaflow pipelines run [options]`` in a
    child process; check rows on the way and a clean stop on SIGTERM."""
    source, sink = tmp_path / "source", tmp_path / "alerts"
    _append(source, range(3))
    project = tmp_path / "project"
    (project / "transformations").mkdir(parents=True)
    (project / "spark-pipeline.yml").write_text(SPEC.format(source=source, sink=sink))
    (project / "transformations" / "flows.py").write_text(FLOWS)

    # Its own working directory: the child session's warehouse and Derby stay in it.
    command = [sys.executable, "-m", "deltaflow.cli", "pipelines", "run", *options]
    proc = subprocess.Popen(
        command,
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()

    def running(expected: list[tuple[int, int]]) -> bool:
        assert proc.poll() is None, "".join(out)[-4000:]
        return _rows(sink) == expected

    try:
        wait_until(lambda: running([(i, 2 * i) for i in range(3)]), 300, "the first rows")
        _append(source, range(3, 6))
        wait_until(lambda: running([(i, 2 * i) for i in range(6)]), 120, "appended rows")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(180)
        finally:
            proc.kill()
            reader.join(10)
    text = "".join(out)
    assert code == 0, text[-4000:]
    assert "to_alerts: RUNNING (real-time)" in text, text[-4000:]
    assert "to_alerts: STOPPED" in text, text[-4000:]
    # The update's last word (the brain's log lines may follow it on the same stream).
    assert any(
        line.startswith("update ") and line.endswith(" CANCELED") for line in text.splitlines()
    ), text[-4000:]
    assert _rows(sink) == [(i, 2 * i) for i in range(6)]
