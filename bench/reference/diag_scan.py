"""Diagnostic (not a benchmark row): where run.py's two scans spend their time, per engine.

``python diag_scan.py ENGINE TABLE REPS [conf=value ...]`` with ENGINE ``deltaflow`` (run
with deltaflow's venv and ``PYTHONPATH=src``) or ``delta-spark`` (the reference venv of
``tests/reference/_env.py``; ``REF_CONF`` = JSON of extra settings, e.g. run.py's
``snapshotPartitions``): times ``format("delta")`` and ``spark.read.parquet(<folder>)``, whole
and with run.py's 1% id range, into the noop sink, order rotated, and splits each run's wall
time into the Spark jobs' span (the REST API of Spark's UI) and the rest (the driver's
planning: for deltaflow the brain's ``table.load`` and ``scan.plan``), with the tasks' run,
CPU and GC times. Task CPU time is what compares across loads; wall time does not.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

# run.py's BASE_CONF (not imported: the reference venv lacks run.py's imports)
BASE_CONF = {
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
}


def main() -> None:
    engine, table, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    extra = dict(a.split("=", 1) for a in sys.argv[4:])
    conf = {**BASE_CONF, "spark.ui.enabled": "true", "spark.ui.port": "4190", **extra}
    if engine == "deltaflow":
        import deltaflow

        spark = deltaflow.session(app_name="diag", master="local[2]", conf=conf)
    else:
        from pyspark.sql import SparkSession

        sys.path.insert(0, str(Path(__file__).parents[2]))
        from tests.reference import _env

        b = SparkSession.builder.master("local[2]").appName("diag")
        for k, v in {
            **conf,
            **_env.reference_spark_conf(),
            **json.loads(os.environ.get("REF_CONF", "{}")),
        }.items():
            b = b.config(k, v)
        spark = b.getOrCreate()
    sc = spark.sparkContext
    ui = sc.uiWebUrl
    app = sc.applicationId
    print("spark", spark.version, "ui", ui, flush=True)

    def rest(path: str):
        with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/{path}") as r:
            return json.loads(r.read())

    spark.read.format("delta").load(table).count()
    # run.py's selective scan at 10M rows: one file's id range of the 20.
    WHERE = "id >= 5000000 AND id < 5100000"
    variants = {
        "delta": lambda: spark.read.format("delta").load(table),
        "parquet": lambda: spark.read.parquet(table),
        "delta-1%": lambda: spark.read.format("delta").load(table).where(WHERE),
        "parquet-1%": lambda: spark.read.parquet(table).where(WHERE),
    }
    spark.read.format("delta").load(table).explain("formatted")
    rows = []
    for rep in range(reps + 1):
        names = list(variants)
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            group = f"{name}-{rep}"
            sc.setJobGroup(group, group)
            t0 = time.perf_counter()
            variants[name]().write.format("noop").mode("overwrite").save()
            wall = time.perf_counter() - t0
            ids = sc.statusTracker().getJobIdsForGroup(group)
            time.sleep(0.3)  # the listener bus delivers job ends asynchronously
            span = run = cpu = gc = 0.0
            tasks = 0
            first = last = None
            for i in ids:
                job = rest(f"jobs/{i}")
                for s in job["stageIds"]:
                    for st in rest(f"stages/{s}"):
                        run += st["executorRunTime"] / 1000
                        cpu += st["executorCpuTime"] / 1e9
                        gc += st.get("jvmGcTime", 0) / 1000
                        tasks += st["numCompleteTasks"]
                sub, done = job.get("submissionTime"), job.get("completionTime")
                first = sub if first is None or sub < first else first
                last = done if last is None or done > last else last

            def ts(s):
                return datetime.strptime(s.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")

            span = (ts(last) - ts(first)).total_seconds() if first and last else 0.0
            row = (rep, name, wall, span, wall - span, run, cpu, gc, tasks, len(ids))
            rows.append(row)
            print(
                f"rep {rep} {name:10s} wall {wall:6.2f} jobs {span:6.2f} outside {wall - span:5.2f}"
                f" taskrun {run:6.2f} taskcpu {cpu:6.2f} gc {gc:5.2f} tasks {tasks} jobs {len(ids)}"
                f" load {Path('/proc/loadavg').read_text().split()[0]}",
                flush=True,
            )
    for name in variants:
        warm = [r for r in rows if r[1] == name and r[0] > 0]
        print(
            f"MEDIAN {engine} {name}: wall {statistics.median(r[2] for r in warm):.2f}"
            f" jobs {statistics.median(r[3] for r in warm):.2f}"
            f" taskrun {statistics.median(r[5] for r in warm):.2f}"
            f" taskcpu {statistics.median(r[6] for r in warm):.2f}",
            flush=True,
        )
    spark.stop()


if __name__ == "__main__":
    main()
