"""deltaflow next to delta-spark: the same jobs on the same files, each engine in its own process.

``make bench-reference`` (= ``.venv/bin/python bench/reference/run.py``) prepares the data once
(pyarrow + delta-rs, cached in ``bench/.data/``), then runs every group of jobs on deltaflow and
on delta-spark, alternately, each group a fresh process of its own (``_side.py``):

* ``batch``: full scan, selective scan (one id range: data skipping), write, UPDATE, DELETE,
  one-row INSERT/UPDATE/DELETE/MERGE, OPTIMIZE of 1,000 small files, VACUUM;
* ``merge``: MERGE 100k rows into the big table, alone, so its process's peak memory is its own;
* ``stream``: Delta -> Delta throughput (``availableNow``), end-to-end latency.

delta-spark runs in the reference environment ``tests/reference/_env.py`` builds and caches
(``~/.cache/deltaflow/reference/``: delta-spark and the newest pyspark it supports, jars from
Maven Central); deltaflow in this venv (or ``--deltaflow-python``: e.g. a side venv on the
reference's Spark version), with this checkout's ``src/``. Both get ``local[2]``, a 2 GiB
driver, 2 shuffle partitions, UTC; delta-spark also ``snapshotPartitions=2`` (its default 50
costs it seconds per table read on 2 cores; the setting favours the reference).

``--scale small`` (default: 1M-row tables, MERGE into 1M, streams of 1M and 4M rows) or
``--scale large`` (10M, 10M, 4M and 16M). ``--groups batch,merge`` runs some groups. The
table (ratio = delta-spark's time / deltaflow's: above 1.0 deltaflow is faster) is printed
and saved with every raw figure in ``bench/results/reference_<scale>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE.parent), str(ROOT)]

from tests.reference import _env  # noqa: E402

from _common import DATA_DIR, fresh_dir, loadavg, machine, save_result  # noqa: E402
from _data import events, events_table  # noqa: E402
from bench_hosts_dml import make_table as make_small_table  # noqa: E402
from bench_merge import make_data as make_merge_data  # noqa: E402
from bench_merge import tree_rss  # noqa: E402

ENGINES = ("deltaflow", "delta-spark")
SCALES = {
    "tiny": {"rows": 200_000, "merge_rows": 200_000, "streams": (200_000,)},  # a smoke test
    "small": {"rows": 1_000_000, "merge_rows": 1_000_000, "streams": (1_000_000, 4_000_000)},
    "large": {"rows": 10_000_000, "merge_rows": 10_000_000, "streams": (4_000_000, 16_000_000)},
}
BASE_CONF = {
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
}
REFERENCE_CONF = {"spark.databricks.delta.snapshotPartitions": "2"}
ONE_ROW = {
    "INSERT": "INSERT INTO delta.`{path}` VALUES ({k2}, 'device-new', 1.5, 3)",
    "UPDATE": "UPDATE delta.`{path}` SET value = value + 1 WHERE id = {k}",
    "DELETE": "DELETE FROM delta.`{path}` WHERE id = 9999 - {k}",
    "MERGE": (
        "MERGE INTO delta.`{path}` AS t USING (SELECT * FROM VALUES ({k} + 100, 'device-m', 2.5D,"
        " 4), ({k2} + 1000000, 'device-m', 2.5D, 4) AS v(id, device, value, qty)) AS s"
        " ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    ),
}


# Warm repetitions of the two scans, after one dropped: a JVM's first few scans run while
# the JIT compiles Parquet's decoding (2-3 times slower on a loaded 2-core machine), and the
# two engines' processes run minutes apart, so two repetitions left the ratio to the load.
SCAN_REPS = 5


def small_files_table(name: str, files: int, rows_per_file: int, *, removed: int = 0) -> Path:
    """``files`` Parquet files of ``rows_per_file`` events in one commit (delta-rs's convert);
    with ``removed``, a delete then drops that many whole files (VACUUM's work)."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, convert_to_deltalake

    path = DATA_DIR / f"{name}_{files}_{rows_per_file}_{removed}"
    if (path / "_SUCCESS").exists():
        return path
    fresh_dir(path).mkdir()
    for i in range(files):
        part = events(i * rows_per_file, rows_per_file, seed=i)
        pq.write_table(part, path / f"part-{i:05d}.parquet")
    convert_to_deltalake(str(path))
    if removed:
        DeltaTable(str(path)).delete(f"id < {removed * rows_per_file}")
    (path / "_SUCCESS").write_text("")
    return path


def merge_data(rows: int) -> tuple[Path, Path]:
    """bench_merge.py's MERGE data (target of ``rows`` in 40 files, 100k source rows spread
    over it), moved to a folder per size so bench_merge.py's own runs do not replace it."""
    home = DATA_DIR / f"reference_merge_{rows}"
    if not (home / "_SUCCESS").exists():
        target, source = make_merge_data(rows, 100_000, range_keys=False)
        fresh_dir(home).mkdir()
        shutil.move(str(target), home / "target")
        shutil.move(str(source), home / "source.parquet")
        (home / "_SUCCESS").write_text("")
    return home / "target", home / "source.parquet"


def prepare(scale: dict[str, Any], groups: list[str]) -> dict[str, Any]:
    """The tables the groups asked for, generated once and cached in bench/.data/."""
    started = time.perf_counter()
    small = DATA_DIR / "reference_small_10k"
    if not (small / "_delta_log").exists():
        make_small_table(small)
    data: dict[str, Any] = {"small": str(small)}
    if "batch" in groups:
        data["events"] = str(events_table("events", scale["rows"], 20))
        data["optimize"] = str(small_files_table("small_files", 1000, 1000))
        data["vacuum"] = str(small_files_table("vacuum_files", 2000, 1000, removed=1000))
    if "stream" in groups:
        data["streams"] = {
            n: str(events_table("events", n, max(4, n // 250_000))) for n in scale["streams"]
        }
    if "merge" in groups:
        target, source = merge_data(scale["merge_rows"])
        data["merge_target"], data["merge_source"] = str(target), str(source)
    print(f"data ready in {time.perf_counter() - started:.0f} s", flush=True)
    return data


def jobs(group: str, scale: dict[str, Any], data: dict[str, Any], work: str) -> list[dict]:
    rows = scale["rows"]
    if group == "batch":
        table = {"table": data["events"], "work": work}
        return [
            {"name": "scan", "kind": "scan", "reps": SCAN_REPS, **table},
            # One file's id range of the 20: the others are skipped on min/max stats.
            {"name": "skipping", "kind": "skipping", "reps": SCAN_REPS, "low": rows // 2,
             "high": rows // 2 + rows // 100, **table},
            {"name": "write", "kind": "write", "reps": 1, **table},
            {"name": "update", "kind": "sql", "reps": 1, **table,
             "sql": "UPDATE delta.`{path}` SET qty = qty + 1 WHERE category = 'category_07'"},
            {"name": "delete", "kind": "sql", "reps": 1, **table,
             "sql": "DELETE FROM delta.`{path}` WHERE qty < 10"},
            {"name": "one_row", "kind": "one_row", "reps": 3, "rows": 10_000,
             "table": data["small"], "work": work, "statements": ONE_ROW},
            {"name": "optimize", "kind": "sql", "reps": 1, "table": data["optimize"],
             "work": work, "sql": "OPTIMIZE delta.`{path}`"},
            {"name": "vacuum", "kind": "sql", "reps": 1, "table": data["vacuum"],
             "work": work, "sql": "VACUUM delta.`{path}` RETAIN 0 HOURS"},
        ]  # fmt: skip
    if group == "merge":
        return [{"name": "merge", "kind": "merge", "table": data["merge_target"],
                 "source": data["merge_source"], "work": work}]  # fmt: skip
    streams = [
        {"name": f"stream_{n}", "kind": "stream", "reps": 1, "rows": n, "table": path, "work": work}
        for n, path in data["streams"].items()
    ]
    return [*streams, {"name": "latency", "kind": "latency", "appends": 12, "warmup": 2,
                       "work": work}]  # fmt: skip


def deltaflow_side(args: argparse.Namespace) -> tuple[str, Path]:
    """deltaflow's interpreter and sources: this venv and checkout, or with ``--same-spark``
    a side venv on the reference's pyspark (``tests/spark_versions.py`` makes and caches it),
    with the connector jar built there for that Spark."""
    src = Path(args.deltaflow_src).resolve()
    if not args.same_spark:
        return args.deltaflow_python, src
    from tests.spark_versions import ensure_venv

    python = str(ensure_venv(_env.PYSPARK_VERSION))
    env = {**os.environ, "PYTHONPATH": str(src)}
    built = subprocess.run([python, "-m", "deltaflow.spark._jar"], env=env, cwd=src.parent)
    if built.returncode != 0:
        # The table names each side's Spark version, so the mismatch is visible there too.
        print(
            f"deltaflow's connector does not compile on pyspark {_env.PYSPARK_VERSION}:"
            " deltaflow runs on this venv's pyspark instead",
            flush=True,
        )
        return args.deltaflow_python, src
    return python, src


def side_command(engine: str, deltaflow: tuple[str, Path]) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if engine == "deltaflow":
        python = deltaflow[0]
        env["PYTHONPATH"] = str(deltaflow[1])
    else:
        python = str(_env.reference_python())
        env.pop("PYTHONPATH", None)
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    return [python, str(HERE / "_side.py")], env


def run_side(engine: str, group: str, spec: dict[str, Any], deltaflow: tuple[str, Path]) -> dict:
    """One process of one engine: its results, the peak resident set of its process tree per
    phase (MiB), and that tree's resident set when each phase began."""
    command, env = side_command(engine, deltaflow)
    log = (RESULTS_LOG / f"{engine}_{group}.log").open("w")
    process = subprocess.Popen(
        [*command, engine, json.dumps(spec)],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=spec["work"],
    )  # fmt: skip
    current = ["start"]
    peaks: dict[str, int] = {}
    at_start: dict[str, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss = tree_rss(process.pid)
            peaks[current[0]] = max(peaks.get(current[0], 0), rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result: dict[str, Any] = {}
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("PHASE "):
            name = line.split(" ", 1)[1].strip()
            at_start[name] = tree_rss(process.pid)
            current[0] = name
            print(f"  {engine} {group}: {name} (load {loadavg()})", flush=True)
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
    process.wait()
    done.set()
    sampler.join()
    log.close()
    if process.returncode != 0 or not result:
        tail = (RESULTS_LOG / f"{engine}_{group}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{engine} {group} failed (exit {process.returncode}):\n{tail}")
    mib = 2**20
    result["peak_rss_mib"] = {k: round(v / mib) for k, v in peaks.items()}
    result["rss_at_start_mib"] = {k: round(v / mib) for k, v in at_start.items()}
    return result


RESULTS_LOG = DATA_DIR / "reference_logs"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rows_of_table(results: dict[str, dict[str, dict]], scale: dict[str, Any]) -> list[list[str]]:
    """The comparison: [row, deltaflow, delta-spark, ratio (delta-spark / deltaflow)]."""
    out: list[list[str]] = []

    def add(label: str, df: float | None, ds: float | None, unit: str = "s") -> None:
        if df is None or ds is None:
            return
        shown = (lambda v: f"{v:.0f} MiB") if unit == "MiB" else (lambda v: f"{v:.2f} {unit}")
        out.append([label, shown(df), shown(ds), f"{ds / df:.2f}"])

    def med(engine: str, group: str, job: str) -> float | None:
        figures = results.get(engine, {}).get(group, {}).get(job)
        return statistics.median(figures["seconds"]) if figures else None

    def timed(label: str, group: str, job: str) -> None:
        """A row of the two engines' median seconds for ``job``."""
        add(label, med("deltaflow", group, job), med("delta-spark", group, job))

    def cpu(label: str, group: str, job: str) -> None:
        """A row of the two engines' median CPU seconds of the process tree for ``job``."""
        df, ds = (
            results.get(e, {}).get(group, {}).get(job, {}).get("cpu_seconds") for e in ENGINES
        )
        if df and ds:
            add(label, statistics.median(df), statistics.median(ds), "CPU-s")

    sessions = {e: [g["session_seconds"] for g in results.get(e, {}).values()] for e in ENGINES}
    if all(sessions.values()):
        add(
            "session start (to the first Delta read's answer; median of the processes)",
            statistics.median(sessions["deltaflow"]),
            statistics.median(sessions["delta-spark"]),
        )
    rows = scale["rows"]
    timed(f"full scan, {rows:,} rows, 20 files (median of {SCAN_REPS} warm)", "batch", "scan")
    cpu(f"full scan, {rows:,} rows: CPU of the process tree", "batch", "scan")
    skipping = f"selective scan, 1% id range of {rows:,} (skipping 19 of 20 files)"
    timed(skipping, "batch", "skipping")
    cpu(f"selective scan, 1% of {rows:,}: CPU of the process tree", "batch", "skipping")
    timed(f"write {rows:,} rows (read + write)", "batch", "write")
    for n in scale["streams"]:
        timed(f"Delta -> Delta stream, {n:,} rows (availableNow)", "stream", f"stream_{n}")
    lat = {e: results.get(e, {}).get("stream", {}).get("latency") for e in ENGINES}
    if all(lat.values()):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            add(
                f"end-to-end stream latency {name} (10 one-row commits)",
                percentile(lat["deltaflow"]["seconds"], q),  # type: ignore[index]
                percentile(lat["delta-spark"]["seconds"], q),
            )  # type: ignore[index]
    m = scale["merge_rows"]
    timed(f"MERGE 100k into {m:,} (time)", "merge", "merge")
    peaks = {
        e: results.get(e, {}).get("merge", {}).get("peak_rss_mib", {}).get("merge") for e in ENGINES
    }
    if all(peaks.values()):
        add(
            f"MERGE 100k into {m:,} (peak RSS of the process tree)",
            peaks["deltaflow"],
            peaks["delta-spark"],
            "MiB",
        )
    timed(f"UPDATE 2% of {rows:,} (every file)", "batch", "update")
    timed(f"DELETE 1% of {rows:,} (every file)", "batch", "delete")
    one = {e: results.get(e, {}).get("batch", {}).get("one_row") for e in ENGINES}
    if all(one.values()):
        for statement in ONE_ROW:
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                add(
                    f"one-row {statement} on 10k rows, {name} (3 warm reps)",
                    percentile(one["deltaflow"]["seconds"][statement], q),  # type: ignore[index]
                    percentile(one["delta-spark"]["seconds"][statement], q),
                )  # type: ignore[index]
    timed("OPTIMIZE 1,000 small files (1M rows)", "batch", "optimize")
    timed("VACUUM RETAIN 0 HOURS, 2,000 files (1,000 removed)", "batch", "vacuum")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--groups", default="batch,merge,stream")
    parser.add_argument("--tag", default="", help="appended to the results file's name")
    parser.add_argument("--jobs", default=None, help="only these jobs of the groups (names)")
    parser.add_argument("--deltaflow-python", default=sys.executable)
    parser.add_argument("--deltaflow-src", default=str(ROOT / "src"), help="deltaflow's sources")
    parser.add_argument(
        "--same-spark",
        action="store_true",
        help="deltaflow on the reference's pyspark version (a cached side venv)",
    )
    args = parser.parse_args()
    deltaflow = deltaflow_side(args)
    scale = SCALES[args.scale]
    RESULTS_LOG.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {loadavg()}", flush=True)
    python = _env.reference_python()
    spark_conf = {**BASE_CONF, **_env.reference_spark_conf(), **REFERENCE_CONF}
    groups = args.groups.split(",")
    data = prepare(scale, groups)
    results: dict[str, dict[str, dict]] = {e: {} for e in ENGINES}
    for group in groups:
        for engine in ENGINES:
            work = str(fresh_dir(DATA_DIR / f"reference_work_{engine}_{group}"))
            Path(work).mkdir()
            conf = spark_conf if engine == "delta-spark" else BASE_CONF
            chosen = [
                j for j in jobs(group, scale, data, work)
                if not args.jobs or j["name"] in args.jobs.split(",")
            ]  # fmt: skip
            spec = {"conf": conf, "first_table": data["small"], "jobs": chosen, "work": work}
            print(f"== {engine} {group} (load {loadavg()})", flush=True)
            results[engine][group] = run_side(engine, group, spec, deltaflow)
            results[engine][group]["load_end"] = loadavg()
            shutil.rmtree(work, ignore_errors=True)
            save_result(f"reference_{args.scale}{args.tag}", {"scale": scale, "results": results})
    table = rows_of_table(results, scale)
    versions = {
        "deltaflow side": results["deltaflow"][next(iter(results["deltaflow"]))]["spark"],
        "delta-spark side": results["delta-spark"][next(iter(results["delta-spark"]))]["spark"],
        "delta-spark": _env.DELTA_SPARK_VERSION,
        "reference python": str(python),
        "deltaflow python": deltaflow[0],
        "deltaflow src": str(deltaflow[1]),
    }
    print(f"\nSpark: deltaflow on {versions['deltaflow side']}, delta-spark "
          f"{versions['delta-spark']} on {versions['delta-spark side']}")  # fmt: skip
    print("\n| row | deltaflow | delta-spark | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(f"\nload average after: {loadavg()}")
    save_result(
        f"reference_{args.scale}{args.tag}",
        {"scale": scale, "versions": versions, "table": table, "results": results,
         "machine_extra": machine()},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
