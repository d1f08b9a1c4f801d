"""Shared benchmark plumbing: one Spark session, cached data, side-by-side timing, machine facts.

Every benchmark times its variants in one process on the same data, alternating
their order each repetition, and reports the median of the warm repetitions (the
first repetition of each variant is a warm-up and is dropped): other jobs share
this machine, so only side-by-side medians are comparable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
DATA_DIR = BENCH_DIR / ".data"
RESULTS_DIR = BENCH_DIR / "results"


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 warm repetitions")
    parser.add_argument("--reps", type=int, default=None, help="warm repetitions per variant")
    parser.add_argument("--rows", type=int, default=None, help="data size, where a bench has one")
    parser.add_argument(
        "--keys", type=int, default=None, help="dimension size (keys), where a bench has one"
    )
    parser.add_argument("--only", default=None, help="run only this part, where a bench has parts")
    parser.add_argument(
        "--sources-only",
        action="store_true",
        help="streaming throughput: the sources alone, into Spark's noop sink",
    )
    parser.add_argument(
        "--s3a", action="store_true", help="bench_s3: S3 through Hadoop's S3A (the JVM path)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="bench_s3: CPU-seconds per step (Spark JVM, its children, the S3 server)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="bench_s3: the S3 server on the last core, everything else on the others",
    )
    args = parser.parse_args()
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    return args


def spark_session(conf: dict[str, str] | None = None):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import deltaflow

    spark = deltaflow.session(app_name="deltaflow-bench", conf=conf)
    return spark


@dataclass
class Timings:
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])


def run_side_by_side(
    variants: dict[str, Callable[[], object]], reps: int, warmup: int = 1
) -> Timings:
    """Each variant ``warmup + reps`` times, order rotated per repetition."""
    names = list(variants)
    timings = Timings({name: [] for name in names})
    for rep in range(warmup + reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        if rep % 2:
            order.reverse()
        for name in order:
            start = time.perf_counter()
            variants[name]()
            elapsed = time.perf_counter() - start
            if rep >= warmup:
                timings.seconds[name].append(elapsed)
            print(f"  rep {rep} {name}: {elapsed:.3f}s", flush=True)
    return timings


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = "unknown"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            ram = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    import deltalake
    import pyarrow
    import pyspark

    return {
        "date": dt.date.today().isoformat(),
        "loadavg_at_save": loadavg(),
        "nproc": str(os.cpu_count()),
        "ram": ram,
        "cpu": cpu,
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "deltalake": deltalake.__version__,
        "pyarrow": pyarrow.__version__,
    }


def loadavg() -> str:
    """``/proc/loadavg``: other jobs share this machine, so every result records the load."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def save_result(name: str, result: dict[str, object]) -> None:
    RESULTS_DIR.mkdir(exist_ok=True)
    result = {"machine": machine(), **result}
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def print_table(title: str, rows: list[tuple[str, float, int, float]]) -> None:
    """rows: (variant, median seconds, row count, ratio to the baseline)."""
    print(f"\n### {title}\n")
    print("| variant | median s | rows/s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name, seconds, count, ratio in rows:
        print(f"| {name} | {seconds:.3f} | {count / seconds / 1e6:.2f} M | {ratio:.2f} |")


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def drive_upstream(
    upstream: Any, arrived: Callable[[], Container[int]], args: Any, drain_seconds: float
) -> tuple[int, int, str]:
    """Run a latency benchmark's paced ``upstream`` writer (a thread with ``seq`` and
    ``stop_event``): ``args.warmup`` seconds, then ``args.seconds`` measured; then wait up to
    ``drain_seconds`` until every measured ``seq`` is in ``arrived()``. Returns the first
    and last measured ``seq`` (end exclusive) and the load average at the start."""
    upstream.start()
    time.sleep(args.warmup)
    first_seq = upstream.seq
    load_before = loadavg()
    time.sleep(args.seconds)
    last_seq = upstream.seq
    upstream.stop_event.set()
    upstream.join()
    deadline = time.monotonic() + drain_seconds
    while time.monotonic() < deadline:
        seen = arrived()
        if all(s in seen for s in range(first_seq, last_seq)):
            break
        time.sleep(0.05)
    return first_seq, last_seq, load_before
