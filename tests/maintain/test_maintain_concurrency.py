"""Issue 14's "done when": maintenance next to a streaming MERGE and an appender.

Three real writers at once, on two tables with auto compaction on:

* an appender process (`deltaflow serve`, group commits, background auto compaction)
  appending events to the bronze table;
* a stream reading bronze and upserting the latest event per key into the silver table
  with a MERGE in foreachBatch (the test's Spark session; auto compaction after each MERGE);
* `deltaflow maintain` looping every second over both tables (a subprocess).

No writer may fail a commit, and at the end bronze holds exactly the acknowledged events
and silver exactly the newest event per key, both read by delta-rs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow import maintain
from tests._waiting import wait_until
from tests.maintain.test_maintain import MAINTAIN, SRC
from tests.serve.conftest import SCHEMA
from tests.serve.test_sigkill import free_port, post, start, wait_healthy

KEYS = 40
COLD_FILES = 12
POSTERS = 2
POSTS_PER_POSTER = 60  # 10 events each, paced: ~15-30 s of appends


@pytest.mark.slow
def test_maintenance_next_to_a_streaming_merge_and_an_appender(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from deltaflow.tables import DeltaTable

    lake = tmp_path / "lake"
    bronze, silver = lake / "bronze", lake / "silver"
    # Both tables get auto compaction by their property, set before any writer starts
    # (a metadata change under a running writer is a conflict, in delta-spark too).
    for table, columns in ((bronze, SCHEMA), (silver, "kind STRING, id BIGINT")):
        spark.sql(
            f"CREATE TABLE delta.`{table}` ({columns}) USING delta"
            " TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'true')"
        )
    # Cold rows the stream never touches, one small file each: maintenance compacts them
    # while the stream runs.
    for n in range(COLD_FILES):
        write_deltalake(str(silver), pa.table({"kind": [f"cold{n}"], "id": [-n]}), mode="append")
    port = free_port()
    server = start(bronze, port)
    maintainer: subprocess.Popen[bytes] | None = None
    query = None
    log = tmp_path / "maintain.log"
    statuses: list[int | None] = []
    acknowledged: set[int] = set()
    lock = threading.Lock()
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "5")
    try:
        wait_healthy(port)

        def upsert(batch, batch_id: int) -> None:
            latest = batch.groupBy("kind").agg(F.max("id").alias("id"))
            (
                DeltaTable.forPath(spark, str(silver))
                .alias("t")
                .merge(latest.alias("s"), "t.kind = s.kind")
                .whenMatchedUpdate(condition="s.id > t.id", set={"id": "s.id"})
                .whenNotMatchedInsertAll()
                .execute()
            )

        query = (
            spark.readStream.format("delta")
            .load(str(bronze))
            .select("kind", "id")
            .writeStream.foreachBatch(upsert)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="2 seconds")
            .start()
        )

        def poster(number: int) -> None:
            pace = threading.Event()
            for sent in range(POSTS_PER_POSTER):
                ids = [number * 1_000_000 + sent * 10 + i for i in range(10)]
                body = "\n".join(
                    json.dumps({"id": i, "kind": f"k{i % KEYS}"}) for i in ids
                ).encode()
                status = post(port, body, uuid.uuid4().hex)
                with lock:
                    statuses.append(status)
                    if status == 200:
                        acknowledged.update(ids)
                pace.wait(0.1)

        posters = [threading.Thread(target=poster, args=(n,)) for n in range(POSTERS)]
        for thread in posters:
            thread.start()
        # Maintenance starts while the first MERGE runs (it holds its DML lease), so its
        # first look at silver finds a DML in flight and its 12 small files.
        staging = silver / "_delta_staging"
        wait_until(
            lambda: staging.is_dir() and any(p.name.startswith("_dml-") for p in staging.iterdir()),
            120,
            "the first MERGE",
        )
        with open(log, "w") as err:
            maintainer = subprocess.Popen(
                [*MAINTAIN, "--interval", "1", "--min-small-files", "8", str(lake)],
                stderr=err,
                env={**os.environ, "PYTHONPATH": SRC},
            )

        for thread in posters:
            thread.join(timeout=240)
        assert query.isActive, f"the streaming MERGE failed: {query.exception()}"
        query.processAllAvailable()
        # Silver's small files are compacted between the MERGEs (by auto compaction after
        # one, or by maintenance, which leaves the table alone while a MERGE runs).
        wait_until(lambda: silver_compacted(silver), 120, "silver compacted")
        assert query.isActive and query.exception() is None
    finally:
        spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
        if query is not None:
            query.stop()
        for process in (maintainer, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=120) for p in (maintainer, server) if p is not None]

    assert codes == [0, 0]
    # Zero failed commits: every append was acknowledged, the stream never failed.
    assert statuses == [200] * (POSTERS * POSTS_PER_POSTER)
    text = log.read_text()
    assert " failed" not in text and "Traceback" not in text, text[-3000:]
    # Zero lost or duplicated rows, read by delta-rs.
    ids = RsTable(str(bronze)).to_pyarrow_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)) and set(ids) == acknowledged
    expected: dict[str, int] = {}
    for i in acknowledged:
        expected[f"k{i % KEYS}"] = max(i, expected.get(f"k{i % KEYS}", -1))
    expected.update({f"cold{n}": -n for n in range(COLD_FILES)})
    rows = RsTable(str(silver)).to_pyarrow_table().to_pylist()
    assert len(rows) == KEYS + COLD_FILES
    assert {r["kind"]: r["id"] for r in rows} == expected
    # Maintenance did work on the live tables, and the history says so.
    assert f"{bronze} OPTIMIZE ran" in text
    marked = [h for h in RsTable(str(bronze)).history() if maintain.MARKER_KEY in h]
    assert marked and all(h["operation"] == "OPTIMIZE" for h in marked)
    assert all(h["operationParameters"]["auto"] == "true" for h in marked)
    assert f"{silver} OPTIMIZE" in text  # examined all along


def silver_compacted(path: Path) -> bool:
    return any(
        h["operation"] == "OPTIMIZE" and h["operationParameters"].get("auto") == "true"
        for h in RsTable(str(path)).history()
    )
