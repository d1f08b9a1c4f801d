"""Run every benchmark at full size (``--quick`` for small sizes); results in bench/results/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = (
    "bench_scan.py",
    "bench_write.py",
    "bench_skipping.py",
    "bench_clustering.py",
    "bench_ingest_http.py",
    "bench_console.py",
    "bench_merge.py",
    "bench_delete_dv.py",
    "bench_interactive.py",
    "bench_hosts_dml.py",
    "bench_pipelines.py",
    "bench_mv_refresh.py",
    "bench_cloudfiles.py",
    "bench_discovery.py",
    "bench_stream_throughput.py",
    ("bench_stream_throughput.py", "--sources-only"),
    "bench_stream_latency.py",
    "bench_realtime.py",
)


def main() -> int:
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    from _common import loadavg

    failed = 0
    for entry in BENCHMARKS:
        name, *extra = (entry,) if isinstance(entry, str) else entry
        label = " ".join([name, *extra])
        print(f"== {label} (load average before: {loadavg()})", flush=True)
        # One process per benchmark: each starts from a fresh Spark session.
        failed |= subprocess.call([sys.executable, str(here / name), *extra, *sys.argv[1:]])
        print(f"== {label} done (load average after: {loadavg()})", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
