"""Landing-zone discovery: how long ``cloudFiles`` takes to find new files among many.

The seen-file record of a ``cloudFiles`` stream is a SQLite file under the schema
location (``ingest/_discovery.py``): each trigger lists the landing zone, looks up only
the files that arrived within ``cloudFiles.recheckWindowSeconds`` of the newest one seen
(default 3600 s), and inserts the new ones. This measures, for zones of 10,000 and
100,000 small files (no Spark involved; the trigger's discovery step alone):

- first discovery: every file is new (listed, looked up, inserted);
- a trigger with nothing new, all files recent (the worst case: every file is inside the
  recheck window and looked up again);
- the same with old files (recheck window 0 s: the steady state of a zone whose files
  are older than the window);
- a trigger after 100 new files arrived (recent files, default window);
- admitting one batch of ``maxFilesPerTrigger=1000`` from the record.

Each step runs ``--reps`` times (median); the zone is generated once and cached.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

from _common import DATA_DIR, fresh_dir, parse_args, save_result


def landing_zone(files: int) -> Path:
    """``files`` one-line NDJSON files in 100 subfolders (cached)."""
    folder = DATA_DIR / f"discovery_{files}"
    if (folder / "_SUCCESS").exists():
        return folder
    fresh_dir(folder).mkdir()
    for number in range(files):
        sub = folder / f"d{number % 100:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"e{number:06d}.json").write_bytes(b'{"id": %d}\n' % number)
    (folder / "_SUCCESS").write_text("")
    return folder


def store(zone: Path, schemas: Path, window: str) -> object:
    from deltaflow.ingest.cloudfiles._discovery import FileStore
    from deltaflow.ingest.cloudfiles._options import parse_options

    return FileStore(
        parse_options(
            {
                "path": str(zone),
                "cloudFiles.format": "json",
                "cloudFiles.schemaLocation": str(schemas),
                "cloudFiles.recheckWindowSeconds": window,
            }
        )
    )


def timed(step, *args: object) -> tuple[float, object]:
    """(seconds, result) of ``step(*args)``."""
    started = time.perf_counter()
    result = step(*args)
    return time.perf_counter() - started, result


def measure(files: int, reps: int) -> dict[str, float]:
    zone = landing_zone(files)
    work = fresh_dir(DATA_DIR / "discovery_work")
    seconds: dict[str, list[float]] = {}

    def record(step: str, took: tuple[float, object]) -> object:
        seconds.setdefault(step, []).append(took[0])
        return took[1]

    for rep in range(reps):
        schemas = work / f"schemas_{rep}"
        recent = store(zone, schemas, "3600")
        old = store(zone, schemas, "0")  # the same record, looked at with a 0 s window
        assert record("first discovery (all new)", timed(recent.discover)) == files
        record("nothing new, all files recent", timed(recent.discover))
        record("nothing new, files older than the window", timed(old.discover))
        extra = zone / f"new_{rep}"
        extra.mkdir()
        for i in range(100):
            (extra / f"n{i:03d}.json").write_bytes(b'{"id": -1}\n')
        assert record("100 new files arrived", timed(recent.discover)) == files + 100
        end = record("admit 1000 files", timed(recent.admit, files // 2, None, 1000, None))
        assert end == files // 2 + 1000
        shutil.rmtree(extra)
    shutil.rmtree(work)
    return {step: statistics.median(values) for step, values in seconds.items()}


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    sizes = (10_000,) if args.quick else (10_000, 100_000)
    results: dict[str, dict[str, float]] = {}
    for files in sizes:
        print(f"landing zone of {files:,} files ...", flush=True)
        results[str(files)] = measure(files, max(args.reps, 1))
    steps = list(next(iter(results.values())))
    print("\n| step | " + " | ".join(f"{int(n):,} files" for n in results) + " |")
    print("| --- |" + " ---: |" * len(results))
    for step in steps:
        cells = " | ".join(f"{results[n][step] * 1000:,.0f} ms" for n in results)
        print(f"| {step} | {cells} |")
    result = {"sizes": list(results), "median_seconds": results, "cpu_count": os.cpu_count()}
    save_result("discovery_quick" if args.quick else "discovery", result)
    return result


if __name__ == "__main__":
    main()
