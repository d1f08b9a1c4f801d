"""Crash safety of the landing-zone stream: ``cloudFiles`` -> Delta, SIGKILLed at random.

A producer thread keeps dropping NDJSON files (written under a hidden name, then renamed
into place) with unique ids while the stream runs in a child process
(tests/ingest/_cloudfiles_chaos_job.py) with its own Spark driver. SIGKILL goes to the
child's whole process group (driver, JVM, Python workers) at random moments: while a
batch reads files, writes Parquet, commits, or while the query plans. After the last kill
an availableNow run drains the zone; the table must then hold every produced id exactly
once. Set DELTAFLOW_CHAOS_SEED to replay a run (the seed is printed and appears in every
assertion message).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import sqlite3
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.spark.test_chaos import (
    Child,
    Feeder,
    assert_exactly_once_commits,
    assert_versions_load,
    chaos_seed,
    kill_at_random_moments,
    versions,
)

JOB = str(Path(__file__).parent / "_cloudfiles_chaos_job.py")

KILLS = 4
FILE_INTERVAL = 0.25  # seconds between dropped files
MAX_FILES = 1500  # bounds the landing zone even if the kills are slow
START_TIMEOUT = 180  # JVM start-up plus a first batch, on a busy 2-core machine


class LandingChild(Child):
    """The cloudFiles stream job in its own process group (see :class:`Child`)."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        super().__init__(args, log_path, job=JOB)


def file_rows(number: int) -> list[dict[str, object]]:
    """File ``number``'s records: 20..119 rows, ids unique across all files."""
    count = 20 + (number * 37) % 100
    return [
        {"id": number * 1000 + i, "file": number, "payload": f"p{number}-{i}-\u00e9"}
        for i in range(count)
    ]


class Producer(Feeder):
    """Drops file after file into the landing zone by atomic rename until stopped; every
    fourth file goes to a subdirectory, so the listing is recursive too."""

    def __init__(self, landing: Path) -> None:
        super().__init__(FILE_INTERVAL, MAX_FILES)
        self.landing = landing
        self.files: list[Path] = []

    def step(self, number: int) -> None:
        folder = self.landing / f"day{number // 100}" if number % 4 == 0 else self.landing
        folder.mkdir(exist_ok=True)
        staging = folder / f".staging-{number:05d}.json"
        text = "".join(json.dumps(r) + "\n" for r in file_rows(number))
        staging.write_text(text, encoding="utf-8")
        final = folder / f"events-{number:05d}.json"
        os.replace(staging, final)
        self.files.append(final)

    def wait_for_files(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.files) < count:
            assert self.is_alive() and time.monotonic() < deadline, self.error
            self.stopped.wait(0.05)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_landing_stream_killed_at_random_moments_reads_every_file_once(tmp_path):
    seed = chaos_seed()
    rng = random.Random(seed)
    context = f"seed {seed}"
    landing = tmp_path / "landing"
    landing.mkdir()
    schemas, checkpoint, target = (str(tmp_path / n) for n in ("schemas", "ck", "bronze"))
    args = [str(landing), schemas, checkpoint, target]
    log = tmp_path / "child.log"
    started = time.monotonic()

    producer = Producer(landing)
    producer.start()
    try:
        producer.wait_for_files(5, 30)
        kill_at_random_moments(
            lambda: LandingChild([*args, "loop"], log),
            KILLS,
            rng,
            after_progress=1.5,
            after_start=8.0,
            timeout=START_TIMEOUT,
            describe=lambda: f" {len(producer.files)} files dropped;",
        )
    finally:
        producer.stop()
    progressed = os.path.isdir(os.path.join(target, "_delta_log")) and len(versions(target)) > 0
    print(f"{len(producer.files)} files dropped; {time.monotonic() - started:.0f}s to here")

    final = LandingChild([*args, "once"], log)
    final.wait_for("DONE", START_TIMEOUT)
    final.finish(60)
    print(f"total {time.monotonic() - started:.0f}s")

    assert progressed, f"{context}: the looping stream never committed a batch"
    expected = collections.Counter(
        (r["id"], r["file"], r["payload"]) for n in range(len(producer.files)) for r in file_rows(n)
    )
    rows = DeltaTable(target).to_pyarrow_table().to_pylist()
    got = collections.Counter((r["id"], r["file"], r["payload"]) for r in rows)
    lost, duplicated = expected - got, got - expected
    assert not lost and not duplicated, (
        f"{context}: {len(lost)} lost, {len(duplicated)} duplicated or wrong rows,"
        f" e.g. {sorted(lost)[:5]} {sorted(duplicated)[:5]}"
    )
    assert all(r["_rescued_data"] is None for r in rows), context

    # The seen-file store recorded each file once, numbered 1..n without gaps.
    with contextlib.closing(sqlite3.connect(Path(schemas, "_cloudfiles", "files.db"))) as db:
        recorded = db.execute("SELECT seq, path FROM files ORDER BY seq").fetchall()
    assert [seq for seq, _ in recorded] == list(range(1, len(producer.files) + 1)), context
    assert sorted(path for _, path in recorded) == sorted(f"file://{p}" for p in producer.files)

    assert_exactly_once_commits(target, checkpoint, context)
    assert_versions_load(target, context)
