"""What opening one ~50-row Parquet file costs on the real-time source's path (issue 28,
rtmopen; docs/notes/rtm-open.md).

A delta-rs append of ``--rows`` rows (default 50, the bench's commit at 1,000 events/s:
``id`` bigint, ``kind`` string, ``ts`` bigint) is read whole, again and again, inside one
Spark task on a warm JVM (:file:`_jvm/ParquetOpens.scala`), by reader factories built as
the real-time source builds its own, under these session settings:

* ``old``: the source's reader before rtmopen (Spark's row reader for each file, its
  Hadoop configuration copied per file);
* ``base``: the source's reader now (``FileReads.readerFactory``: each file opened as
  batches under a shared ``JobConf``, one ``UnsafeRow`` projection per thread);
* ``novio`` / ``oldnovio``: the same with ``parquet.hadoop.vectored.io.enabled=false``
  (parquet-mr reads column chunks with plain positioned reads, not Hadoop's vectored IO);
* ``row``: ``spark.sql.parquet.enableVectorizedReader=false`` (parquet-mr's row reader);
* ``v1``: Spark's own batch reader (``ParquetFileFormat``), batches returned.

The variants take turns file by file, so they share the load. Prints p50 / p90 / p99 /
mean in µs of ``open`` (the reader created and its first row read: the source's timing
line's step) and ``rest`` (the other rows, the close), then the steps of one open timed
alone, and the load average. ``--only jfr`` records 20 seconds of ``base`` opens with
Java Flight Recorder and prints the top frames of the task's samples.

``--only rtm``: the real thing, side by side. A delta-rs writer appends 1,000 events/s
(a commit of 50 rows every 50 ms, as ``bench_realtime.py``) to one source table, which one
Delta -> Delta real-time query per code tree reads at the same time (so at the same
load), each in a Spark of its own: ``RTM_OPEN_TREES=name=/path/src,name=/path/src``
(e.g. main's and a branch's), ``RTM_OPEN_SECONDS`` (default 60). Prints each query's
per-epoch ``open`` count / p50 / p99 / max (the first epoch, the warm-up, left out) and
the load average.

    .venv/bin/python bench/bench_rtm_open.py [--reps 2000] [--rows 50] [--only jfr|rtm]
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _common import DATA_DIR, fresh_dir, loadavg, parse_args, spark_session  # noqa: E402

VARIANTS = {
    "old": "",
    "base": "",
    "novio": "parquet.hadoop.vectored.io.enabled=false",
    "oldnovio": "parquet.hadoop.vectored.io.enabled=false",
    "row": "spark.sql.parquet.enableVectorizedReader=false",
    "v1": "",
}


RTM_EPOCH = "10 seconds"
TIMING_LOGGER = "org.apache.spark.sql.deltaflow"
READER_LINE = re.compile(
    r"deltaflow real-time reader e(\d+) of (\S+): (\d+) files, (\d+) rows[^;]*; .*"
    r"open (\d+)x p50 ([\d.]+) p99 ([\d.]+) max ([\d.]+) ms"
)


def harness_jar() -> Path:
    """:file:`_jvm/ParquetOpens.scala` against pyspark's jars and deltaflow's connector."""
    from deltaflow.spark._jar import jar_path, pyspark_jars_dir, scalac

    source = HERE / "_jvm" / "ParquetOpens.scala"
    connector = jar_path()
    jar = DATA_DIR / f"parquet-opens-{int(source.stat().st_mtime)}-{connector.stem}.jar"
    if not jar.exists():
        jar.parent.mkdir(parents=True, exist_ok=True)
        classpath = f"{pyspark_jars_dir() / '*'}:{connector}"
        scalac([str(source)], classpath, jar)
    return jar


def small_file(root: Path, rows: int) -> str:
    """A delta-rs append of ``rows`` rows, as the real-time bench's writer makes them."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "kind": pa.array(["click"] * rows),
            "ts": pa.array([time.time_ns()] * rows, pa.int64()),
        }
    )
    write_deltalake(str(root), table)
    (file,) = root.glob("*.parquet")
    return str(file)


SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "kind", "type": "string", "nullable": True, "metadata": {}},
        {"name": "ts", "type": "long", "nullable": True, "metadata": {}},
    ],
}


def top_frames(recording: Path, thread_part: str, depth: int = 1, top: int = 25) -> list[str]:
    """The most sampled frames (``depth`` innermost of each stack) of the threads whose name
    holds ``thread_part``, from a JFR recording's ``jdk.ExecutionSample`` events."""
    printed = subprocess.run(
        [
            "jfr",
            "print",
            "--json",
            "--stack-depth",
            "512",
            "--events",
            "jdk.ExecutionSample",
            str(recording),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    events = json.loads(printed)["recording"]["events"]
    inner: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for event in events:
        values = event["values"]
        if thread_part not in (values["sampledThread"] or {}).get("javaName", ""):
            continue
        frames = values["stackTrace"]["frames"]
        names = [f"{f['method']['type']['name']}.{f['method']['name']}" for f in frames]
        total += 1
        inner[" < ".join(names[:depth])] += 1
        for name in set(names):
            anywhere[name] += 1
    lines = [f"{total} samples of threads named *{thread_part}*; innermost frames:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in inner.most_common(top)]
    lines += ["on the stack (inclusive):"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in anywhere.most_common(top * 2)]
    return lines


def rtm_side_by_side(trees: dict[str, str], seconds: float) -> None:
    """One child process (a Spark of its own) per code tree, each running a Delta -> Delta
    real-time query over one source table, which this process writes while all run."""
    from deltalake import DeltaTable

    from _realtime_probes import SOURCE_SCHEMA, DeltaWriter

    root = fresh_dir(DATA_DIR / "rtm_open_rtm")
    source = root / "src"
    DeltaTable.create(str(source), schema=SOURCE_SCHEMA)
    children = {}
    for name, tree in trees.items():
        link = root / f"src-{name}"
        link.symlink_to(source)
        env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE.parent}"}
        command = [sys.executable, str(Path(__file__).resolve()), "--only", "rtm-query"]
        command += [str(link), str(root / name), str(seconds)]
        # A working directory each: Spark's embedded metastore (Derby) admits one process.
        (root / name).mkdir()
        children[name] = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, text=True, cwd=root / name
        )
    for name, child in children.items():  # each says READY once its query runs
        assert child.stdout is not None
        while (line := child.stdout.readline()) and line.strip() != "READY":
            pass
        assert line, f"{name}: the query process ended before its query started"
    writer = DeltaWriter(str(source), 1000)
    print(f"load before: {loadavg()}", flush=True)
    writer.start()
    time.sleep(seconds)
    writer.stop_event.set()
    writer.join()
    print(f"load after: {loadavg()}; {writer.sent} events in {writer.version} commits")
    if writer.error is not None:
        raise writer.error
    for name, child in children.items():
        out, _ = child.communicate(timeout=300)
        print(f"{name} ({trees[name]}):\n{out}", end="")


def rtm_query(link: str, work: str, seconds: float) -> None:
    """The child of ``rtm_side_by_side``: the query, then its epochs' ``open`` figures."""
    from tests.spark._jvm_log import jvm_log_lines

    import deltaflow

    spark = spark_session()
    spark.conf.set("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
    spark.conf.set("spark.sql.streaming.realTimeMode.minBatchDuration", "1000")
    table = f"rtm_open_{time.time_ns()}"
    spark.sql(
        f"CREATE TABLE {table} (id BIGINT, kind STRING, ts BIGINT) USING delta"
        f" LOCATION '{work}/dst'"
    )
    with jvm_log_lines(spark, TIMING_LOGGER, Path(work + ".log")) as logged:
        query = (
            spark.readStream.format("delta")
            .load(link)
            .writeStream.format("delta")
            .outputMode("update")
            .option("checkpointLocation", f"{work}/chk")
            .trigger(realTime=RTM_EPOCH)
            .toTable(table)
        )
        print("READY", flush=True)
        time.sleep(seconds + 15)  # the writer's run and the epoch it ends in
        query.stop()
        lines = [m for m in logged() if READER_LINE.match(m) and f"{link}:" in m]
    spark.stop()
    print(f"  deltaflow from {Path(deltaflow.__file__).parent}")
    for m in lines[1:]:  # the first epoch warms the JVM up
        epoch, _, files, _, opens, p50, p99, most = READER_LINE.match(m).groups()  # type: ignore[union-attr]
        print(f"  e{epoch}: {files} files; open {opens}x p50 {p50} p99 {p99} max {most} ms")


def main() -> None:
    if sys.argv[1:3] == ["--only", "rtm-query"]:  # a child of `--only rtm`
        link, work, seconds = sys.argv[3:6]
        rtm_query(link, work, float(seconds))
        return
    args = parse_args(__doc__ or "")
    if args.only == "rtm":
        trees = dict(t.split("=", 1) for t in os.environ["RTM_OPEN_TREES"].split(","))
        rtm_side_by_side(trees, float(os.environ.get("RTM_OPEN_SECONDS", "60")))
        return
    reps = args.reps if args.reps and args.reps > 5 else 2000
    rows = args.rows or 50
    spark = spark_session({"spark.jars": str(harness_jar())})
    jvm: Any = spark.sparkContext._jvm
    location = small_file(fresh_dir(DATA_DIR / "rtm_open") / "table", rows)
    opens = jvm.deltaflow.bench.ParquetOpens
    session = spark._jsparkSession  # type: ignore[attr-defined]
    schema = json.dumps(SCHEMA)
    print(f"file: {location} ({Path(location).stat().st_size} bytes, {rows} rows)")
    if args.only == "jfr":
        jfr_top_frames(spark, opens, session, location, schema, 20.0)
    else:
        opens.run(session, location, schema, 300, VARIANTS)  # warm every variant's code
        print(f"load before: {loadavg()}")
        print(opens.run(session, location, schema, reps, VARIANTS))
        print(opens.steps(session, location, schema, reps))
        print(f"load after: {loadavg()}")
    spark.stop()


def jfr_top_frames(
    spark: Any, opens: Any, session: Any, location: str, schema: str, seconds: float
) -> None:
    """``seconds`` of ``base`` opens under Java Flight Recorder; prints the top frames."""
    jvm: Any = spark.sparkContext._jvm
    opens.run(session, location, schema, 500, {"base": ""})  # warm
    pid = str(jvm.java.lang.ProcessHandle.current().pid())
    recording = Path(tempfile.mkdtemp(prefix="rtm-open-jfr-")) / "opens.jfr"
    # Java's `profile` settings with a sample every millisecond, and stacks deep enough to
    # hold a Spark task's frames (64 by default cuts them before the reader's own).
    java_home = Path(subprocess.check_output(["readlink", "-f", shutil.which("java") or "java"],
                                             text=True).strip()).parent.parent  # fmt: skip
    settings = recording.with_suffix(".jfc")
    profile = (java_home / "lib" / "jfr" / "profile.jfc").read_text()
    settings.write_text(
        profile.replace(
            '"method-sampling-java-interval">10 ms', '"method-sampling-java-interval">1 ms'
        )
    )
    configure = ["jcmd", pid, "JFR.configure", "stackdepth=512"]
    subprocess.run(configure, check=True, capture_output=True)
    start = ["jcmd", pid, "JFR.start", "name=rtmopen", f"settings={settings}"]
    subprocess.run(start, check=True, capture_output=True)
    started, count = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        opens.run(session, location, schema, 1000, {"base": ""})
        count += 1000
    stop = ["jcmd", pid, "JFR.stop", "name=rtmopen", f"filename={recording}"]
    subprocess.run(stop, check=True, capture_output=True)
    print(f"{count} opens in {time.monotonic() - started:.1f} s; load {loadavg()}")
    print(f"recording: {recording}")
    for line in top_frames(recording, "Executor task"):
        print(line)


if __name__ == "__main__":
    main()
