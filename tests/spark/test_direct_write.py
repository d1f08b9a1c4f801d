"""Direct writes on local disk (``deltaflow.write.directWrite=true``): what ``test_s3a_direct.py``
checks on S3A, cheaply, so CI covers the protocol without an S3 server.

A watcher walks the table directory while each test writes: no staged write's directory
(``_delta_staging/<job>-<uuid>``) or Hadoop ``_temporary`` may ever appear.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltaflow import InvalidOptionError
from deltaflow.spark.write import _direct

CONF = _direct.DIRECT_WRITE_CONF
DIRECT_FILE = re.compile(
    r"(?:^|/)part-(\d{5})-([0-9a-f]{8})-s(\d+)-[0-9a-f-]{36}-c\d{3}\.snappy\.parquet$"
)
STAGED = re.compile(r"_delta_staging/[0-9a-f]{8}-[0-9a-f]{32}|(^|/)_temporary(/|$)")


class Watcher:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: set[str] = set()
        self.walks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.walk()
            self._stop.wait(0.005)

    def walk(self) -> None:
        for directory, _, _ in os.walk(self.root):
            relative = os.path.relpath(directory, self.root)
            if STAGED.search(relative):
                self.seen.add(relative)
        self.walks += 1

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(timeout=30)
        self.walk()
        return self.seen


@pytest.fixture
def direct(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """``directWrite=true`` for the test; its tables go under the yielded directory, which
    a watcher walks until the test ends (then: nothing staged was seen)."""
    spark.conf.set(CONF, "true")
    root = tmp_path / "tables"
    root.mkdir()
    watcher = Watcher(root)
    try:
        yield root
    finally:
        spark.conf.unset(CONF)
        seen = watcher.stop()
    assert watcher.walks > 1
    assert not seen, f"staged directories appeared: {sorted(seen)[:5]}"


def log_files(path: str) -> list[str]:
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    # The log's paths are percent-encoded (Delta protocol); the stored names are not.
    return [unquote(str(p)) for p in actions.column("path").to_pylist()]


def job_ids(path: str) -> set[str]:
    matches = [DIRECT_FILE.search(f) for f in log_files(path)]
    assert matches and all(matches), log_files(path)
    return {m.group(2) for m in matches if m}


def data_files(path: str) -> set[str]:
    root = Path(path)
    return {
        str(p.relative_to(root))
        for p in root.rglob("*.parquet")
        if "_delta_log" not in p.parts and "_delta_staging" not in p.parts
    }


def rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())


def test_batch_partitioned_and_overwrite_write_final_names(spark, direct):
    path = str(direct / "t")
    df = spark.range(0, 90).selectExpr("id", "cast(id % 3 as string) AS k")
    df.write.format("delta").partitionBy("k").save(path)
    (job,) = job_ids(path)
    df.where("id < 10").write.format("delta").mode("append").save(path)
    assert len(job_ids(path)) == 2
    assert sorted(r[0] for r in rows(spark, path)) == sorted([*range(90), *range(10)])
    assert data_files(path) == set(log_files(path))
    spark.range(5).selectExpr("id", "'x' AS k").write.format("delta").mode("overwrite").save(path)
    assert rows(spark, path) == [(i, "x") for i in range(5)]
    assert job not in job_ids(path)


def test_ambiguous_partition_values_read_back_as_a_staged_write_does(spark, direct):
    """Values Spark cannot tell apart in a directory name keep the connector's mark in
    their directory names; the log and the rows are those of a staged write."""
    values = ["", None, "__HIVE_DEFAULT_PARTITION__", "\x01lead", "a/b=c", "per%cent"]
    data = spark.createDataFrame(list(enumerate(values)), "id long, k string")
    written = {}
    for mode in ("true", "false"):
        spark.conf.set(CONF, mode)
        # The staged write's table outside the watched directory.
        path = str((direct if mode == "true" else direct.parent) / f"special-{mode}")
        data.write.format("delta").partitionBy("k").save(path)
        logged = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
        written[mode] = (rows(spark, path), sorted(str(a["partition.k"]) for a in logged))
    spark.conf.set(CONF, "true")
    assert written["true"] == written["false"]
    assert ("\x01lead" in {r[1] for r in written["true"][0]}) and len(written["true"][0]) == 6
    path = str(direct / "special-true")
    job_ids(path)
    assert data_files(path) == set(log_files(path))


def test_save_as_table_and_a_stream_write_final_names(spark, direct):
    path = str(direct / "managed")
    name = f"direct_{os.getpid()}"
    spark.range(7).write.format("delta").option("path", path).saveAsTable(name)
    try:
        assert spark.table(name).count() == 7
        job_ids(path)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
    source, sink = str(direct / "src"), str(direct / "dst")
    spark.range(20).write.format("delta").save(source)

    def run() -> None:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", str(direct.parent / "ckpt"))
            .trigger(availableNow=True)
            .start(sink)
        )
        assert query.awaitTermination(300)

    run()
    version = DeltaTable(sink).version()
    run()
    assert DeltaTable(sink).version() == version
    spark.range(20, 25).write.format("delta").mode("append").save(source)
    run()
    assert [r[0] for r in rows(spark, sink)] == list(range(25))
    assert len(job_ids(sink)) == 2
    assert data_files(sink) == set(log_files(sink))


def test_dml_rewrites_write_final_names(spark, direct):
    path = str(direct / "dml")
    spark.range(30).selectExpr("id", "cast(id % 3 as string) AS k").write.format("delta").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 10")
    spark.sql(f"UPDATE delta.`{path}` SET k = 'u' WHERE id >= 25")
    got = dict(rows(spark, path))
    assert sorted(got) == list(range(10, 30))
    assert {got[i] for i in range(25, 30)} == {"u"}


def test_dml_native_rewrite_writes_final_names(spark, direct):
    """DML's JVM rewrite (``stage_native``, when the rows qualify) writes direct too."""
    from deltaflow.spark._options import parse_write_options
    from deltaflow.spark.write import _native
    from deltaflow.spark.write._plan import plan_write

    path = str(direct / "staged-by-dml")
    spark.range(3).write.format("delta").save(path)
    rows_in = spark.range(10, 15).selectExpr("id")
    uri = Path(path).as_uri()
    plan = plan_write(uri, rows_in.schema.jsonValue(), "append", parse_write_options({"path": uri}))
    native = _native.plan_native_write(plan, rows_in.schema.jsonValue(), spark.conf.get)
    assert isinstance(native, _native.NativeWrite), native
    adds = _native.stage_native(rows_in, plan, native)
    assert _native.rows_in(adds) == 5
    assert all(DIRECT_FILE.search(a.path) for a in adds)
    # In place: nothing was moved, each file is where the add says.
    assert all((Path(path) / a.path).is_file() for a in adds)
    assert not (Path(path) / "_delta_staging").exists()


def test_a_bad_setting_is_a_typed_error(spark, tmp_path):
    spark.conf.set(CONF, "sometimes")
    try:
        with pytest.raises(Exception, match="directWrite") as caught:
            spark.range(3).write.format("delta").save(str(tmp_path / "bad"))
        assert "auto, true, false" in str(caught.value)
    finally:
        spark.conf.unset(CONF)
    with pytest.raises(InvalidOptionError) as local:
        _direct.direct_write_mode("sometimes")
    assert local.value.option == CONF  # type: ignore[attr-defined]


@pytest.fixture
def s3a_on_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from deltaflow.spark.read import _native

    monkeypatch.setenv(_native.HADOOP_SCHEMES_VARIABLE, "s3a,s3")
    _native.hadoop_object_stores.cache_clear()
    yield
    monkeypatch.undo()
    _native.hadoop_object_stores.cache_clear()


def test_auto_writes_direct_only_on_object_stores(s3a_on_driver):
    assert _direct.writes_direct("s3a://b/t", {})
    assert _direct.writes_direct("s3://b/t", {CONF: "auto"})
    assert not _direct.writes_direct("s3a://b/t", {CONF: "false"})
    assert not _direct.writes_direct("file:///tmp/t", {})
    assert _direct.writes_direct("file:///tmp/t", {CONF: "true"})
    assert not _direct.writes_direct("gs://b/t", {CONF: "true"})  # Hadoop cannot open it
