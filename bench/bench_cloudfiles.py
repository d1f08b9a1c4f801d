"""Landing zone: NDJSON files -> bronze Delta through ``cloudFiles`` vs Spark's file stream.

The same NDJSON files (IoT events from ``deltaflow.testing.DeviceEventGenerator``, about
230 bytes a line) are streamed with ``trigger(availableNow=True)`` into a fresh target
and checkpoint each repetition:

- baseline: ``spark.readStream.schema(s).json(dir)`` -> ``writeStream.format("parquet")``
  (Spark's own JSON parser and Parquet writer, all in the JVM);
- ``readStream.format("cloudFiles").schema(s)`` -> ``writeStream.format("delta")``, the
  same schema given (12 columns: strings, doubles, ints, a timestamp and a date);
- the same with the schema inferred (``cloudFiles.inferColumnTypes``: strings, bigints,
  doubles), which also infers and records it on every repetition (fresh schema location).

Every variant reads every file in one micro-batch. The files are generated once and
cached under ``bench/.data/``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from _common import (
    DATA_DIR,
    fresh_dir,
    parse_args,
    print_table,
    run_side_by_side,
    save_result,
    spark_session,
)

SCHEMA = (
    "event_id STRING, device_id STRING, user_id STRING, state STRING, event_type STRING,"
    " latitude DOUBLE, longitude DOUBLE, heart_rate INT, steps INT, battery_pct INT,"
    " event_time TIMESTAMP, event_date DATE"
)


def landing_files(files: int, rows_per_file: int) -> Path:
    """``files`` NDJSON files of ``rows_per_file`` events each (cached)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from deltaflow.testing import DeviceEventGenerator

    folder = DATA_DIR / f"landing_{files}x{rows_per_file}"
    if (folder / "_SUCCESS").exists():
        return folder
    fresh_dir(folder).mkdir()
    generator = DeviceEventGenerator(seed=11)
    for number in range(files):
        table = generator.batch(rows_per_file)
        # ISO 8601 with a 'T' and 'Z', as most producers write them.
        stamps = pc.replace_substring(table["event_time"].cast(pa.string()), " ", "T")
        table = table.set_column(table.schema.get_field_index("event_time"), "event_time", stamps)
        date_index = table.schema.get_field_index("event_date")
        table = table.set_column(date_index, "event_date", table["event_date"].cast(pa.string()))
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in table.to_pylist())
        staging = folder / f".part-{number:05d}.json"
        staging.write_text(text)
        os.replace(staging, folder / f"part-{number:05d}.json")
    (folder / "_SUCCESS").write_text("")
    return folder


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    files, per_file = (40, 10_000) if args.quick else (200, 20_000)
    rows = files * per_file
    started = time.perf_counter()
    landing = landing_files(files, per_file)
    size = sum(p.stat().st_size for p in landing.glob("part-*.json"))
    print(f"landing zone: {files} files x {per_file} rows, {size / 1e6:.0f} MB", flush=True)
    print(f"  (ready in {time.perf_counter() - started:.1f}s)", flush=True)
    spark = spark_session()
    out = fresh_dir(DATA_DIR / "cloudfiles_out")

    def run(frame, fmt: str) -> None:
        run_dir = out / uuid.uuid4().hex
        query = (
            frame.writeStream.format(fmt)
            .option("checkpointLocation", str(run_dir / "checkpoint"))
            .trigger(availableNow=True)
            .start(str(run_dir / "table"))
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise query.exception()
        got = sum(p["numInputRows"] for p in query.recentProgress)
        assert got == rows, f"{fmt}: read {got} rows, expected {rows}"

    def spark_json() -> None:
        run(spark.readStream.schema(SCHEMA).json(str(landing)), "parquet")

    load_seconds: dict[bool, list[float]] = {False: [], True: []}

    def cloud_files(inferred: bool):
        def variant() -> None:
            reader = (
                spark.readStream.format("cloudFiles")
                .option("cloudFiles.format", "json")
                .option("cloudFiles.schemaLocation", str(out / uuid.uuid4().hex / "schema"))
            )
            if inferred:
                reader = reader.option("cloudFiles.inferColumnTypes", "true")
            else:
                reader = reader.schema(SCHEMA)
            began = time.perf_counter()
            frame = reader.load(str(landing))  # inferred: samples files, records the schema
            load_seconds[inferred].append(time.perf_counter() - began)
            run(frame, "delta")

        return variant

    variants = {
        "spark json -> parquet": spark_json,
        "cloudFiles -> delta (schema given)": cloud_files(inferred=False),
        "cloudFiles -> delta (schema inferred)": cloud_files(inferred=True),
    }
    print(f"cloudFiles: {rows} rows, {args.reps} warm reps", flush=True)
    timings = run_side_by_side(variants, args.reps)
    fresh_dir(out)
    base = timings.median("spark json -> parquet")
    table = [(n, timings.median(n), rows, base / timings.median(n)) for n in variants]
    print_table(f"landing zone, {files} NDJSON files x {per_file} rows, {size / 1e6:.0f} MB", table)
    baseline = timings.seconds["spark json -> parquet"]
    per_rep = {
        n: sorted(b / s for b, s in zip(baseline, timings.seconds[n], strict=True))
        for n in variants
    }
    print("per-repetition ratios:", json.dumps(per_rep))
    inference = sorted(load_seconds[True][1:])  # the first is the warm-up
    print(f"load() with inference (in the inferred variant's time): {inference}")
    result = {
        "files": files,
        "rows_per_file": per_file,
        "bytes": size,
        "seconds": timings.seconds,
        "table": table,
        "per_rep_ratios": per_rep,
        "inference_load_seconds": inference,
    }
    save_result("cloudfiles_quick" if args.quick else "cloudfiles", result)
    spark.stop()
    return result


if __name__ == "__main__":
    main()
