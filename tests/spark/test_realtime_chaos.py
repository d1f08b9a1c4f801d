"""Crash safety of the real-time mode Delta sink: the driver killed with SIGKILL at random
moments mid-epoch (its JVM and the brain with it), restarted from the checkpoint; at the
end the table holds each row exactly once. The job is tests/spark/_realtime_chaos_job.py;
the kills follow test_chaos.py (its ``Child``, a seeded RNG: DELTAFLOW_CHAOS_SEED replays).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow.spark._compat import PYSPARK_MINOR
from tests.spark.test_chaos import START_TIMEOUT, Child, chaos_seed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

JOB = str(Path(__file__).parent / "_realtime_chaos_job.py")
ROWS = 3000
KILLS = 2


def test_sigkill_of_the_driver_mid_epoch_keeps_each_row_once(tmp_path) -> None:
    rng = random.Random(chaos_seed())
    location, checkpoint = str(tmp_path / "table"), str(tmp_path / "ck")
    args = [location, checkpoint, str(ROWS)]
    for kill in range(KILLS):
        child = Child(args, tmp_path / f"run{kill}.log", job=JOB)
        try:
            while True:  # until some rows of this run's epoch are in the table
                line = child.wait_for("ROWS", START_TIMEOUT)
                if int(line.split()[1]) > 0:
                    break
            child.run_for(rng.uniform(0.0, 1.5))
        finally:
            child.kill()
    final = Child(args, tmp_path / "final.log", job=JOB)
    try:
        final.wait_for("DONE", START_TIMEOUT + 120)
    finally:
        final.kill()
    ids = DeltaTable(location).to_pyarrow_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)), f"duplicates: {len(ids) - len(set(ids))}"
    assert sorted(ids) == list(range(ROWS))
