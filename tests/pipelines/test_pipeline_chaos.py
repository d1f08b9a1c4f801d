"""A pipeline update killed with SIGKILL mid-run, then re-run: nothing lost or doubled.

The update runs in a child process group (driver, JVM, Python workers die together). It
is killed at random moments after its flows started, several times; a last update then
runs to completion, and every dataset is checked against what the landed files say it
must hold. Set DELTAFLOW_CHAOS_SEED to replay a run.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests._waiting import wait_while_running

JOB = str(Path(__file__).parent / "_pipeline_job.py")
FILES = 16
ROWS_PER_FILE = 40
KEYS = 5
KILLS = 3
START_TIMEOUT = 240


def _child(args: list[str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, JOB, *args],
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=log.parent,  # the job's warehouse and catalog (metastore) go here
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)


@pytest.mark.slow
@pytest.mark.chaos
def test_update_killed_mid_run_loses_and_doubles_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("DELTAFLOW_CHAOS_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    landing = tmp_path / "landing"
    landing.mkdir()
    events = []
    for f in range(FILES):
        lines = []
        for r in range(ROWS_PER_FILE):
            event = f * ROWS_PER_FILE + r
            row = (event, event % KEYS, event * 7 % 11)
            events.append(row)
            lines.append(f'{{"event_id": {row[0]}, "key": {row[1]}, "value": {row[2]}}}')
        (landing / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    storage = tmp_path / "storage"
    args = [str(landing), str(storage), f"chaos_{uuid.uuid4().hex[:8]}"]
    log = tmp_path / "job.log"

    def log_text() -> str:
        return f"seed {seed}\n" + log.read_text()[-6000:]

    for kill in range(KILLS):
        proc = _child(args, log)
        try:
            start = log.read_text().count("EVENT bronze RUNNING") if log.exists() else 0
            wait_while_running(
                lambda start=start: log.read_text().count("EVENT bronze RUNNING") > start,
                proc,
                START_TIMEOUT,
                f"kill {kill}: the update's flows to start",
                log_text,
            )
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(rng.uniform(0.5, 6.0))
        finally:
            _kill(proc)
    final = _child(args, log)
    try:
        assert final.wait(600) == 0, log_text()
    finally:
        _kill(final)
    assert log.read_text().rstrip().endswith("UPDATE COMPLETED"), log_text()
    # At least one kill landed mid-update (else this tested nothing).
    assert log.read_text().count("UPDATE COMPLETED") <= KILLS, log_text()

    def rows(name: str) -> list[dict[str, int]]:
        return DeltaTable(str(storage / "tables" / name)).to_pyarrow_table().to_pylist()

    bronze = sorted(r["event_id"] for r in rows("bronze"))
    assert bronze == [e[0] for e in events], f"bronze lost or doubled rows (seed {seed})"
    valid = [e for e in events if e[2] % 3 != 0]
    silver = sorted(r["event_id"] for r in rows("silver"))
    assert silver == [e[0] for e in valid], f"silver lost or doubled rows (seed {seed})"
    newest: dict[int, int] = {}
    for event_id, key, _ in valid:
        newest[key] = max(newest.get(key, -1), event_id)
    latest = {r["key"]: r["event_id"] for r in rows("latest")}
    assert latest == newest, f"AUTO CDC target wrong (seed {seed})"
    expected_counts = collections.Counter(e[1] for e in valid)
    counts = {r["key"]: r["count"] for r in rows("counts")}
    assert counts == dict(expected_counts), f"materialized view wrong (seed {seed})"
