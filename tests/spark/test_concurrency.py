"""Two Spark applications appending to one table at the same time lose nothing."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.spark._append_job import append_batches

HERE = Path(__file__).parent
COMMITS = 12
ROWS = 50


@pytest.mark.slow
def test_two_processes_append_concurrently(spark, table_path):
    path = table_path("concurrent")
    write_deltalake(
        path,
        pa.table(
            {
                "writer": pa.array([], pa.string()),
                "batch": pa.array([], pa.int32()),
                "row": pa.array([], pa.int64()),
            }
        ),
    )
    child = subprocess.Popen(
        [sys.executable, str(HERE / "_append_job.py"), path, "child", str(COMMITS), str(ROWS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(path).parent,  # the job's warehouse and catalog (metastore) go here
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY", (
            child.stderr.read() if child.stderr else ""
        )
        child.stdin.write("GO\n")
        child.stdin.flush()
        append_batches(spark, path, "parent", COMMITS, ROWS)
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0 and "DONE" in out, err[-4000:]
    finally:
        if child.poll() is None:
            child.kill()

    table = DeltaTable(path)
    assert table.version() == 2 * COMMITS  # one commit per append, none lost or merged
    rows = table.to_pyarrow_table().to_pylist()
    counts = collections.Counter((r["writer"], r["batch"]) for r in rows)
    expected = {(w, b): ROWS for w in ("child", "parent") for b in range(COMMITS)}
    assert dict(counts) == expected
    # Every append recorded its own commit; retries (if any) show in the commit info.
    operations = [h for h in table.history() if h.get("operation") == "WRITE" and h["version"] > 0]
    assert len(operations) == 2 * COMMITS
