"""One side of a reference benchmark: a Spark session of one engine running a list of jobs.

Run by ``run.py`` in a process of its own: ``python _side.py ENGINE SPEC_JSON`` where ENGINE
is ``deltaflow`` (the benchmark's venv, this checkout's ``src/`` on ``PYTHONPATH``) or
``delta-spark`` (the reference venv of ``tests/reference/_env.py``: pyspark and delta-spark
only, so this file imports nothing else from the project). Both sides run the same jobs,
written once here against the API both engines share (``spark.read/write`` with
``format("delta")``, SQL on ``delta.`path```, ``DeltaTable.forPath(...).merge(...)``).

Output, one line each on stdout: ``PHASE <name>`` when a job starts (the parent samples the
process tree's memory per phase) and ``RESULT <json>`` at the end. Everything else (Spark's
log) goes to stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()


def phase(name: str) -> None:
    print(f"PHASE {name}", flush=True)


def session(engine: str, conf: dict[str, str]) -> tuple[Any, Any]:
    """The engine's SparkSession (local[2], the same settings both sides) and DeltaTable."""
    if engine == "deltaflow":
        import deltaflow

        spark = deltaflow.session(app_name="bench-reference", master="local[2]", conf=conf)
        return spark, deltaflow.DeltaTable
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("bench-reference")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate(), DeltaTable


def fresh_copy(source: str, target: str) -> str:
    """A private copy of a prepared table (outside the clock): a DML job changes its table."""
    if os.path.exists(target):
        shutil.rmtree(target)
    shutil.copytree(source, target)
    return target


def timed(action: Any) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def tree_cpu() -> float:
    """CPU seconds (user + system) this process and its descendants have used so far: the
    driver's Python, its JVM, deltaflow's brain, Spark's Python workers (Linux ``/proc``;
    reaped children through their parents' ``cutime``/``cstime``). Other jobs on the machine
    stretch wall time far more than CPU time, so the two engines' CPU seconds compare even
    when the load moved between their runs."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = sum(int(v) for v in fields[11:15])
    total, stack = 0, [os.getpid()]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def measured(action: Any) -> tuple[float, float]:
    """``action``'s wall seconds and the CPU seconds of the process tree (:func:`tree_cpu`)."""
    cpu = tree_cpu()
    seconds = timed(action)
    return seconds, tree_cpu() - cpu


def noop(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def job_scan(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    path = job["table"]
    runs = [measured(lambda: noop(spark.read.format("delta").load(path)))
            for _ in range(job["reps"] + 1)]  # fmt: skip
    return {"seconds": [s for s, _ in runs[1:]], "cpu_seconds": [c for _, c in runs[1:]]}


def job_skipping(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    path, low, high = job["table"], job["low"], job["high"]

    def run() -> None:
        noop(spark.read.format("delta").load(path).where(f"id >= {low} AND id < {high}"))

    runs = [measured(run) for _ in range(job["reps"] + 1)]
    return {"seconds": [s for s, _ in runs[1:]], "cpu_seconds": [c for _, c in runs[1:]]}


def job_write(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    source, work = job["table"], job["work"]
    seconds = []
    for rep in range(job["reps"] + 1):
        target = os.path.join(work, f"write_{rep}")
        df = spark.read.format("delta").load(source)
        writer = df.write.format("delta").mode("overwrite")
        seconds.append(timed(lambda w=writer, t=target: w.save(t)))
        shutil.rmtree(target, ignore_errors=True)
    return {"seconds": seconds[1:]}


def job_sql(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    """A statement (``{path}`` = a fresh copy of ``table`` per repetition), e.g. UPDATE."""
    seconds = []
    for rep in range(job["reps"]):
        path = fresh_copy(job["table"], os.path.join(job["work"], f"sql_{rep}"))
        text = job["sql"].format(path=path)
        seconds.append(timed(lambda t=text: spark.sql(t).collect()))
        # The data files left on disk: both engines must have done the same work (VACUUM).
        files = sum(1 for _, _, names in os.walk(path) for n in names if n.endswith(".parquet"))
        shutil.rmtree(path, ignore_errors=True)
    return {"seconds": seconds, "parquet_files_after": files}


def job_one_row(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    """One-row statements on one small table, order rotated, the first round dropped."""
    path = fresh_copy(job["table"], os.path.join(job["work"], "one_row"))
    texts: dict[str, str] = job["statements"]
    names = list(texts)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    counter = 0
    for rep in range(job["reps"] + 1):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            counter += 1
            text = texts[name].format(path=path, k=counter, k2=job["rows"] * 20 + counter)
            elapsed = timed(lambda t=text: spark.sql(t).collect())
            if rep:
                seconds[name].append(elapsed)
    return {"seconds": seconds}


def job_merge(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    path = fresh_copy(job["table"], os.path.join(job["work"], "merge"))
    phase("merge")

    def run() -> None:
        src = spark.read.parquet(job["source"])
        (
            dt.forPath(spark, path)
            .alias("t")
            .merge(src.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    seconds = timed(run)
    phase("after-merge")
    metrics = dt.forPath(spark, path).history(1).collect()[0]["operationMetrics"]
    shutil.rmtree(path, ignore_errors=True)
    return {"seconds": [seconds], "metrics": dict(metrics or {})}


def job_stream(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Delta -> Delta, ``availableNow``: the whole source table through one query."""
    seconds = []
    for rep in range(job["reps"]):
        sink = os.path.join(job["work"], f"stream_{rep}")
        checkpoint = sink + "_checkpoint"

        def run(sink: str = sink, checkpoint: str = checkpoint) -> None:
            query = (
                spark.readStream.format("delta")
                .load(job["table"])
                .writeStream.format("delta")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start(sink)
            )
            query.awaitTermination()

        seconds.append(timed(run))
        count = spark.read.format("delta").load(sink).count()
        if count != job["rows"]:
            raise AssertionError(f"the stream wrote {count} rows, not {job['rows']}")
        shutil.rmtree(sink, ignore_errors=True)
        shutil.rmtree(checkpoint, ignore_errors=True)
    return {"seconds": seconds}


def _data_commits(log: Path) -> list[float]:
    """The modification times of the commits in ``log`` that add files, oldest first."""
    times = []
    for entry in os.listdir(log):
        if entry.endswith(".json") and entry[:-5].isdigit():
            try:
                if '"add"' in (log / entry).read_text():
                    times.append((log / entry).stat().st_mtime)
            except OSError:
                continue
    return sorted(times)


def job_latency(spark: Any, dt: Any, job: dict[str, Any]) -> dict[str, Any]:
    """A running Delta -> Delta query; one-row appends to the source, one at a time: the
    latency of each is from the source's commit file to the sink's commit file holding it
    (their modification times, one clock: an engine's append may return well after its
    commit file exists, post-commit work, and the stream can finish before that)."""
    work = Path(job["work"])
    source, sink = str(work / "lat_source"), work / "lat_sink"
    for path in (source, str(sink), str(work / "lat_checkpoint")):
        shutil.rmtree(path, ignore_errors=True)
    row = "SELECT CAST({k} AS BIGINT) AS id, 'latency' AS kind"
    spark.sql(row.format(k=0)).write.format("delta").save(source)
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", str(work / "lat_checkpoint"))
        .trigger(processingTime="0 seconds")
        .start(str(sink))
    )
    log = sink / "_delta_log"
    latencies = []
    try:
        deadline = time.monotonic() + 300
        while not (log.exists() and len(_data_commits(log)) >= 1):
            if time.monotonic() > deadline or query.exception() is not None:
                raise AssertionError(f"the stream did not start: {query.exception()}")
            time.sleep(0.05)
        for k in range(1, job["appends"] + 1):
            seen = len(_data_commits(log))
            spark.sql(row.format(k=k)).write.format("delta").mode("append").save(source)
            committed = (Path(source) / "_delta_log" / f"{k:020d}.json").stat().st_mtime
            deadline = time.monotonic() + 120
            while len(commits := _data_commits(log)) <= seen:
                if time.monotonic() > deadline or query.exception() is not None:
                    raise AssertionError(f"append {k} never reached the sink: {query.exception()}")
                time.sleep(0.002)
            if k > job["warmup"]:
                latencies.append(commits[seen] - committed)
            time.sleep(0.2)
    finally:
        query.stop()
    return {"seconds": latencies}


JOBS = {
    "scan": job_scan,
    "skipping": job_skipping,
    "write": job_write,
    "sql": job_sql,
    "one_row": job_one_row,
    "merge": job_merge,
    "stream": job_stream,
    "latency": job_latency,
}


def main() -> None:
    engine, spec = sys.argv[1], json.loads(sys.argv[2])
    # The protocol owns stdout; Spark's and the jobs' own output goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = protocol
    phase("session")
    spark, dt = session(engine, spec["conf"])
    # Session start, as a user waits for it: until the first Delta read has answered.
    first_count = spark.read.format("delta").load(spec["first_table"]).count()
    results: dict[str, Any] = {
        "session_seconds": time.perf_counter() - STARTED,
        "first_count": first_count,
        "spark": spark.version,
    }
    for job in spec["jobs"]:
        phase(job["name"])
        started = time.perf_counter()
        out = JOBS[job["kind"]](spark, dt, job)
        out["wall_seconds"] = time.perf_counter() - started
        out["load"] = Path("/proc/loadavg").read_text().strip()
        results[job["name"]] = out
        print(f"job {job['name']}: {out['seconds']}", file=sys.stderr, flush=True)
    phase("stop")
    spark.stop()
    protocol.write("RESULT " + json.dumps(results) + "\n")
    protocol.flush()


if __name__ == "__main__":
    main()
