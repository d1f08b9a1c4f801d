"""MERGE at scale: a 100k-row source upserted into a 10M-row target, 1% of the target matched.

The target (10M rows, 5 columns, 40 files) is written once; each variant runs on a fresh
copy of it, in its own process so peak memory is that variant's alone:

* ``deltaflow``: ``deltaflow.DeltaTable.forPath(spark, t).merge(src, "t.id = s.id")
  .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()`` on ``local[2]``
  (driver JVM heap 2 GiB, ``spark.driver.memory``);
* ``deltaflow-sql``: the same as SQL, ``MERGE INTO delta.`t` AS t USING src AS s ...``
  (``src`` a temp view of the source): the connector's MERGE command, which the brain
  executes in the statement's session, as on every host (Connect, ``spark-sql``, Thrift);
* ``deltaflow-spark``: the same with deltaflow's delta-rs MERGE route off
  (``spark.deltaflow.merge.nativeMaxSourceRows=0``): the MERGE runs as Spark jobs (the
  ``deltaflow`` variant takes the delta-rs route: a small source, an exact condition);
* ``deltaflow-dv``: the same on the target with ``delta.enableDeletionVectors=true``
  (set by ``ALTER TABLE ... SET TBLPROPERTIES`` before the clock starts): matched
  the table has deletion vectors enabled (it takes the delta-rs route, which rewrites the
  touched files rather than writing vectors);
* ``deltalake``: delta-rs's own ``DeltaTable.merge(...).when_matched_update_all()
  .when_not_matched_insert_all().execute()`` on the same data.

The source holds 100k rows: 100k ids spread at random over the whole target (1% of its
rows, so every file is touched; the worst case for file pruning) with changed values.
Peak memory is the peak resident set of the variant's whole process tree (driver
Python, JVM, the brain and Python workers), sampled every 50 ms, and each kind's own
peak; the tree's resident set right after session start is recorded too, so memory can be
given as the peak's delta over it (the issue's "session start excluded"). Time after session
start is split into the source read plus the MERGE (``merge_seconds``, what both kinds do)
and, for deltaflow, reading the metrics back from history and ``spark.stop()``
(``after_seconds``). ``--reps N`` runs the variants N times, interleaved. A variant that
fails (e.g. runs out of memory) is reported as failed with its error, not retried.

``--only deltaflow,deltalake``: run only these variants (comma-separated).

``--keys range``: the source's ids are one contiguous run of the target's ids instead of
spread over it (so key-range file pruning can skip most of the target's files).

``--mixed-keys``: the ON clause is ``t.device = s.device AND t.id <=> s.id`` in every
variant (a plain ``=`` beside a null-safe ``<=>``; delta-rs alone hash-joins on the
5000-value ``device`` only, deltaflow's route rewrites the ``=`` null-safe, see
docs/sql.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import DATA_DIR, fresh_dir, loadavg, machine, parse_args, save_result

TARGET_FILES = 40
ON = "t.id = s.id"
MIXED_ON = "t.device = s.device AND t.id <=> s.id"


def make_data(target_rows: int, source_rows: int, *, range_keys: bool) -> tuple[Path, Path]:
    """The target table and the source (a parquet file), both written by pyarrow."""
    import numpy as np
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    base = fresh_dir(DATA_DIR / "merge")
    target = base / "target"
    rng = np.random.default_rng(7)
    per_file = target_rows // TARGET_FILES
    for part in range(TARGET_FILES):
        ids = np.arange(part * per_file, (part + 1) * per_file, dtype=np.int64)
        write_deltalake(str(target), _rows(ids, rng, 0), mode="append")
    matched = rng.choice(target_rows, size=source_rows, replace=False).astype(np.int64)
    if range_keys:
        start = target_rows // 3
        matched = np.arange(start, start + source_rows, dtype=np.int64)
    source = base / "source.parquet"
    pq.write_table(_rows(np.sort(matched), rng, 1), source)
    return target, source


def _rows(ids, rng, generation: int):
    import pyarrow as pa

    n = len(ids)
    return pa.table(
        {
            "id": ids,
            "device": pa.array([f"device-{i % 5000:05d}" for i in ids.tolist()]),
            "state": pa.array(["CA", "NY", "TX", "WA", "FL"] * (n // 5) + ["CA"] * (n % 5)),
            "value": rng.random(n),
            "generation": pa.array([generation] * n, pa.int32()),
        }
    )


def run_variant(variant: str, target: str, source: str, on: str = ON) -> None:
    """Runs in a child process: one MERGE, then prints a JSON line with its figures."""
    start = time.perf_counter()
    if variant.startswith("deltaflow"):
        import deltaflow

        conf = {"spark.driver.memory": "2g", "spark.ui.enabled": "false"}
        if variant == "deltaflow-spark":
            conf["spark.deltaflow.merge.nativeMaxSourceRows"] = "0"
        # session() starts the brain and runs the process's first Spark job in the
        # background: wait for both, so the session's fixed costs (the issue's "session
        # start excluded") stay out of the MERGE's time. BENCH_MERGE_NO_WAIT=1 times a
        # MERGE issued the moment session() returns instead.
        wait = os.environ.get("BENCH_MERGE_NO_WAIT") != "1"
        spark = deltaflow.session(app_name="bench-merge", conf=conf, await_warm_up=wait)
        if not wait:
            brain = spark._jvm.io.deltaflow.spark.Brain
            brain.call("ping", brain.newArgs())
        if variant == "deltaflow-dv":
            spark.sql(
                f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES"
                " ('delta.enableDeletionVectors' = 'true')"
            )
        session_ready = time.perf_counter()
        session_rss = rss_by_kind(os.getpid())
        src = spark.read.parquet(source)
        if variant == "deltaflow-sql":
            src.createOrReplaceTempView("src")
            spark.sql(
                f"MERGE INTO delta.`{target}` AS t USING src AS s ON {on}"
                " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            ).collect()
        else:
            (
                deltaflow.DeltaTable.forPath(spark, target)
                .alias("t")
                .merge(src.alias("s"), on)
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )
        merged = time.perf_counter()
        metrics = (
            deltaflow.DeltaTable.forPath(spark, target).history(1).collect()[0]["operationMetrics"]
        )
        spark.stop()
    else:
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        session_ready = time.perf_counter()
        session_rss = rss_by_kind(os.getpid())
        src_table = pq.read_table(source)
        metrics = (
            DeltaTable(target)
            .merge(src_table, _datafusion(on), source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        merged = time.perf_counter()
    end = time.perf_counter()
    figures = {
        "seconds": end - start,
        "session_seconds": session_ready - start,
        # Reading the source and the MERGE: what the two variants have in common.
        "merge_seconds": merged - session_ready,
        # deltaflow only: reading the metrics from history, and spark.stop().
        "after_seconds": end - merged,
        "session_rss_mib": round(sum(session_rss.values()) / 2**20),
        "session_rss_by_kind_mib": {k: round(v / 2**20) for k, v in session_rss.items()},
        "metrics": metrics,
    }
    print("RESULT " + json.dumps(figures))


def _datafusion(on: str) -> str:
    return on.replace("<=>", "IS NOT DISTINCT FROM")


def measure(
    variant: str, target: Path, source: Path, work: Path, on: str = ON
) -> dict[str, object]:
    copy = work / variant
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(target, copy)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--variant", variant, str(copy), str(source), on],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    peaks = dict.fromkeys(KINDS, 0)
    load_start = loadavg()
    while proc.poll() is None:
        sample = rss_by_kind(proc.pid)
        peak = max(peak, sum(sample.values()))
        peaks = {k: max(peaks[k], sample[k]) for k in KINDS}
        time.sleep(0.05)
    out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    result: dict[str, object] = {
        "variant": variant,
        "peak_rss_mib": round(peak / 2**20),
        "peak_rss_by_kind_mib": {k: round(v / 2**20) for k, v in peaks.items()},
        "load_start": load_start,
        "load_end": loadavg(),
    }
    if proc.returncode != 0 or not lines:
        result["failed"] = f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"
        return result
    result.update(json.loads(lines[-1].removeprefix("RESULT ")))
    shutil.rmtree(copy)
    return result


VARIANTS = ("deltaflow", "deltaflow-sql", "deltaflow-spark", "deltaflow-dv", "deltalake")
KINDS = ("driver python", "driver jvm", "brain", "python workers")


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (Linux /proc)."""
    return sum(rss_by_kind(pid).values())


def rss_by_kind(pid: int) -> dict[str, int]:
    """Resident bytes of ``pid``'s process tree, per kind of process (:data:`KINDS`):
    ``pid`` itself is the driver's Python, a ``java`` child the driver JVM, the
    ``deltaflow.spark.bridge._server`` process the brain, the rest Spark's Python workers."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            ppid, pages = int(fields[1]), int(fields[21])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
        rss[int(entry.name)] = pages * 4096
    totals = dict.fromkeys(KINDS, 0)
    stack = [pid]
    while stack:
        current = stack.pop()
        totals[_kind(current, pid)] += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return totals


def _kind(pid: int, root: int) -> str:
    if pid == root:
        return "driver python"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "python workers"
    if "deltaflow.spark.bridge._server" in command:
        return "brain"
    if command.split(" ", 1)[0].endswith("java"):
        return "driver jvm"
    return "python workers"


def main() -> dict[str, object]:
    range_keys = "--range-keys" in sys.argv
    if range_keys:
        sys.argv.remove("--range-keys")
    mixed_keys = "--mixed-keys" in sys.argv
    if mixed_keys:
        sys.argv.remove("--mixed-keys")
    on = MIXED_ON if mixed_keys else ON
    args = parse_args(__doc__ or "")
    target_rows = 1_000_000 if args.quick else 10_000_000
    source_rows = target_rows // 100
    started = time.perf_counter()
    target, source = make_data(target_rows, source_rows, range_keys=range_keys)
    print(
        f"data: {target_rows} target rows, {source_rows} source rows"
        f" ({'one range of ids' if range_keys else 'ids spread over the target'}),"
        f" {time.perf_counter() - started:.0f}s to generate"
    )
    work = fresh_dir(DATA_DIR / "merge_runs")
    variants = [v for v in VARIANTS if not args.only or v in args.only.split(",")]
    results = []
    reps = args.reps if "--reps" in sys.argv else 1  # one run each unless asked
    for rep in range(reps):  # variants interleaved, so load hits each alike
        for variant in variants:
            results.append({"rep": rep, **measure(variant, target, source, work, on)})
            print("VARIANT " + json.dumps(results[-1]), flush=True)  # kept if cut short
    print(f"\n### MERGE {source_rows} source rows into {target_rows} target rows (1% matched)")
    print(f"ON {on}\n")
    print(
        "| variant | seconds | session start s | source + MERGE s | after s | peak RSS (MiB)"
        " | RSS after session start (MiB) | peak - session (MiB) | peak per kind (MiB)"
        " | rows updated | rows inserted | load start / end | note |"
    )
    print("| --- |" + " ---: |" * 7 + " --- | ---: | ---: | --- | --- |")
    for r in results:
        m = r.get("metrics") or {}
        assert isinstance(m, dict)
        updated = m.get("numTargetRowsUpdated", m.get("num_target_rows_updated", ""))
        inserted = m.get("numTargetRowsInserted", m.get("num_target_rows_inserted", ""))
        shown = [
            f"{r[k]:.1f}" if isinstance(r.get(k), float) else "-"
            for k in ("seconds", "session_seconds", "merge_seconds", "after_seconds")
        ]
        base = r.get("session_rss_mib")
        delta = r["peak_rss_mib"] - base if isinstance(base, int) else "-"  # type: ignore[operator]
        kinds = r.get("peak_rss_by_kind_mib") or {}
        assert isinstance(kinds, dict)
        per_kind = ", ".join(f"{k} {v}" for k, v in kinds.items() if v)
        print(
            f"| {r['variant']} (rep {r['rep']}) | {' | '.join(shown)} | {r['peak_rss_mib']}"
            f" | {base if base is not None else '-'} | {delta} | {per_kind} | {updated}"
            f" | {inserted} | {r.get('load_start', '')} / {r.get('load_end', '')}"
            f" | {r.get('failed', '')} |"
        )
    result = {
        "target_rows": target_rows,
        "source_rows": source_rows,
        "range_keys": range_keys,
        "on": on,
        "results": results,
        "machine": machine(),
    }
    name = "merge_quick" if args.quick else "merge"
    save_result(name + ("_range" if range_keys else "") + ("_mixed" if mixed_keys else ""), result)
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--variant":
        run_variant(*sys.argv[2:6])
    else:
        main()
