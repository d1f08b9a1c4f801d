"""What a durable log entry costs on this disk (rtm-next M2): p50/p99 in microseconds.

1,000 x (1 KB write + fsync + hard link), as ``deltaflow._atomic.put_if_absent`` does,
without and with the directory fsync after the link, and with fdatasync.
Usage: python bench/bench_fsync.py [directory] [count]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time


def run(folder: str, count: int, sync: str, dir_fsync: bool) -> list[float]:
    payload = os.urandom(1024)
    times = []
    for i in range(count):
        started = time.perf_counter()
        temp = os.path.join(folder, f".{i:020d}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, payload)
        (os.fdatasync if sync == "fdatasync" else os.fsync)(fd)
        os.close(fd)
        os.link(temp, os.path.join(folder, f"{i:020d}.json"))
        os.unlink(temp)
        if dir_fsync:
            dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
        times.append((time.perf_counter() - started) * 1e6)
    return times


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else None
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(f"load {os.getloadavg()[0]:.2f}, {count} entries of 1 KB")
    for sync, dir_fsync in (("fsync", False), ("fsync", True), ("fdatasync", True)):
        with tempfile.TemporaryDirectory(dir=root) as folder:
            q = statistics.quantiles(run(folder, count, sync, dir_fsync), n=100)
            label = f"{sync} + link{' + dir fsync' if dir_fsync else ''}"
            print(f"{label:30s} p50 {q[49]:8.0f} us  p99 {q[98]:8.0f} us")


if __name__ == "__main__":
    main()
