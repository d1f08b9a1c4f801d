"""deltaflow's main demo job: a fitness-tracker lakehouse, from backfill to live streams.

Run it with ``make demo`` (or ``.venv/bin/python demo/main_job.py --help``). Five parts,
each printing a short section whose numbers are checked against an independent
computation (the demo exits 1 with ``DEMO FAILED`` when one disagrees):

1. **Backfill.** Generated device events are appended to ``bronze/device_events`` in a few
   Delta commits through ``df.write.format("delta")``; a question is answered with Spark
   SQL and checked against the raw Arrow data; history and time travel.
2. **Ingest** (``_ingest.py``). ``deltaflow serve`` runs as a subprocess; the trackers'
   events continue live, POSTed as NDJSON with idempotency keys into
   ``bronze/live_events``, while a share arrives as NDJSON files in a landing folder that
   ``readStream.format("cloudFiles")`` appends to the same table.
3. **Streaming** (``_pipeline.py``). While events arrive, bronze -> silver (cleaned,
   de-duplicated with a watermark) -> gold (events per minute, state and type, with a
   watermark); the California question is answered from gold while the streams run;
   then everything is drained and stopped.
4. **Device registry** (``_registry.py``). A dimension table created with
   ``DeltaTable.create`` and the change data feed on, upserted twice with ``merge``; its
   change feed shows the second round's changes.
5. **Declared** (``_declared.py``). The same chain declared as a pipeline
   (``deltaflow.pipelines``): silver with expectations (events off the wrist dropped and
   counted), a gold materialized view, and the registry as an AUTO CDC SCD type 2
   dimension; one triggered update, and the event log's data-quality summary. Streaming
   ML inference (``_scoring.py``): a scikit-learn model, trained on a labelled slice of
   the backfill to tell an event's kind from its readings, is broadcast once and scored by
   an Arrow UDF in a streaming table (``gold_event_kinds``) over the features table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

if __package__ in (None, ""):  # run as a script: make ``demo`` importable as a package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo import _declared, _live, _registry
from demo._checks import DemoCheckError, DemoRunError

from deltaflow.testing import DeviceEventGenerator, to_spark
from deltaflow.testing._seaweedfs import ObjectStoreStartError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaflow.testing._seaweedfs import ObjectStore

DEFAULT_DATA_DIR = "./data/demo"
DATA_DIR_ENV = "DELTAFLOW_DEMO_DIR"
STORAGE_ENV = "DELTAFLOW_DEMO_STORAGE"
STORAGES = ("local", "s3")
S3_PREFIX = "demo"  # the tables go under s3://<bucket>/demo/ in S3 mode
# Written into the data dir so a later run knows it may wipe it.
MARKER = ".deltaflow-demo"
TABLE = "bronze/device_events"

# Ten minutes before midnight UTC: the default run (1M events, ~17 minutes of data) spans
# two days, so the table has two event_date partitions and the question below reads both.
START = datetime(2025, 6, 1, 23, 50, tzinfo=timezone.utc)
QUESTION_EVENT_TYPE = "workout_start"
QUESTION_STATE = "CA"

# Bronze IoT events are partitioned by event_date rather than state: nearly every query
# (and retention, and re-processing) is bounded by time, a day's partition grows to a
# healthy file size, and the number of partitions grows by one a day. Partitioning by state
# would cut every commit into 51 small files, skewed 60:1 between CA and WY, and still scan
# all of them for a time range. Per-state filters are served by file statistics instead.
PARTITION_COLUMN = "event_date"


@dataclass(frozen=True)
class DemoConfig:
    data_dir: Path
    commits: int
    events_per_commit: int
    devices: int
    seed: int
    live_seconds: float = 40.0
    live_rate: float = 5000.0
    events_per_request: int = 500
    trigger_seconds: float = 1.0
    report_seconds: float = 5.0
    console_port: int | None = None  # --console: leave the web console up at the end
    storage: str = "local"  # "s3": the tables on a SeaweedFS S3 gateway the demo starts
    # With "s3": hadoop-aws and its AWS SDK jars, for Spark's own files (checkpoints) on S3.
    s3a_jars: tuple[str, ...] = ()


@dataclass(frozen=True)
class DemoResult:
    table_uri: str
    total_rows: int
    spark_answer: int
    arrow_answer: int
    window: tuple[datetime, datetime]
    versions: int


def parse_args(argv: Sequence[str] | None) -> DemoConfig:
    parser = argparse.ArgumentParser(
        prog="demo/main_job.py",
        description="deltaflow demo: IoT events into Delta, Spark SQL, history, time travel.",
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get(DATA_DIR_ENV, DEFAULT_DATA_DIR),
        help=f"where the tables go; wiped at start (default: ${DATA_DIR_ENV} or "
        f"{DEFAULT_DATA_DIR})",
    )
    parser.add_argument("--commits", type=int, default=5, help="append commits (default: 5)")
    parser.add_argument(
        "--events-per-commit", type=int, default=200_000, help="rows per commit (default: 200000)"
    )
    parser.add_argument(
        "--devices", type=int, default=1000, help="trackers, each reporting once a second"
    )
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    live = parser.add_argument_group("live part (ingest service, landing files, streams)")
    live.add_argument(
        "--live-seconds",
        type=float,
        default=40.0,
        help="how long the trackers keep sending while the streams run (default: 40)",
    )
    live.add_argument(
        "--live-rate",
        type=float,
        default=5000.0,
        help="events/s the trackers try to send; event time runs this many / --devices "
        "times faster than the wall clock (default: 5000)",
    )
    live.add_argument(
        "--events-per-request",
        type=int,
        default=500,
        help="events per HTTP request to the ingest service (default: 500)",
    )
    live.add_argument(
        "--trigger-seconds",
        type=float,
        default=1.0,
        help="processing-time trigger of the streaming queries (default: 1)",
    )
    live.add_argument(
        "--report-seconds",
        type=float,
        default=5.0,
        help="seconds between live progress lines (default: 5)",
    )
    parser.add_argument(
        "--console",
        nargs="?",
        const=8765,
        type=int,
        metavar="PORT",
        help="at the end, serve the web console over the demo's tables on 127.0.0.1:PORT "
        "(default 8765) until Ctrl-C",
    )
    parser.add_argument(
        "--storage",
        choices=STORAGES,
        default=os.environ.get(STORAGE_ENV, "local"),
        help="where the tables go: the data dir (local), or s3://... on a SeaweedFS S3 "
        f"gateway the demo starts and stops (s3) (default: ${STORAGE_ENV} or local)",
    )
    parser.add_argument(
        "--s3a-jars",
        default="",
        metavar="JARS",
        help="with --storage s3: hadoop-aws and the AWS SDK jars it needs (comma-separated),"
        " as a cluster with S3A has them: the stream checkpoints, the landing zone and the"
        " declared pipeline's checkpoints then go to the object store too (`make demo"
        " STORAGE=s3` resolves them from Maven Central, as the tests do)",
    )
    args = parser.parse_args(argv)
    if args.storage not in STORAGES:
        parser.error(f"--storage (or ${STORAGE_ENV}) must be one of {', '.join(STORAGES)}")
    if args.storage == "s3" and args.console is not None:
        parser.error("--console serves local tables only; drop --console or --storage s3")
    if args.commits < 2:
        parser.error("--commits must be at least 2 (time travel needs an earlier version)")
    if args.events_per_commit < 1 or args.devices < 1:
        parser.error("--events-per-commit and --devices must be positive")
    if min(args.live_seconds, args.live_rate, args.trigger_seconds, args.report_seconds) <= 0:
        parser.error("--live-* , --trigger-seconds and --report-seconds must be positive")
    if args.events_per_request < 1:
        parser.error("--events-per-request must be positive")
    return DemoConfig(
        data_dir=Path(args.data_dir).resolve(),
        commits=args.commits,
        events_per_commit=args.events_per_commit,
        devices=args.devices,
        seed=args.seed,
        live_seconds=args.live_seconds,
        live_rate=args.live_rate,
        events_per_request=args.events_per_request,
        trigger_seconds=args.trigger_seconds,
        report_seconds=args.report_seconds,
        console_port=args.console,
        storage=args.storage,
        s3a_jars=tuple(j for j in args.s3a_jars.split(",") if j.strip()),
    )


def main(
    argv: Sequence[str] | None = None,
    spark: SparkSession | None = None,
    object_store: ObjectStore | None = None,
) -> int:
    """Run the demo; returns the process exit code. Pass ``spark`` to reuse a session, and
    with ``--storage s3`` ``object_store`` to reuse a running S3 server (its AWS_*
    variables must be in the environment before ``spark`` started)."""
    config = parse_args(argv)
    try:
        prepare_data_dir(config.data_dir)
        print_banner(config)
        # The gateway first: its AWS_* variables must be exported before the JVM starts.
        with (
            tables_root_for(config, object_store) as tables_root,
            session_for(config, spark) as session,
        ):
            run_demo(config, session, tables_root)
    except (DemoCheckError, DemoRunError) as err:
        print(f"\nDEMO FAILED: {err}", file=sys.stderr)
        return 1
    except ObjectStoreStartError as err:
        print(f"\nDEMO FAILED: the S3 gateway did not start: {err}", file=sys.stderr)
        return 1
    except DataDirNotOursError as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2
    print("\nDone.")
    if config.console_port is not None:
        serve_console(config.data_dir, config.console_port)
    return 0


def serve_console(data_dir: Path, port: int) -> None:
    """Leave the read-only web console up over the demo's tables until Ctrl-C."""
    from deltaflow.console import ConsoleConfig, serve_console

    print(f"\nThe console over {data_dir} (Ctrl-C stops it):")
    serve_console(ConsoleConfig.build([str(data_dir)], port=port))


class DataDirNotOursError(RuntimeError):
    pass


@contextlib.contextmanager
def tables_root_for(config: DemoConfig, store: ObjectStore | None) -> Iterator[str]:
    """Where the tables go: the data dir's URI, or ``s3://<bucket>/demo`` on a SeaweedFS
    S3 gateway started here (data under ``<data dir>/seaweedfs``) and stopped on the way
    out, also on Ctrl-C or a failure."""
    if config.storage == "local":
        yield config.data_dir.as_uri()
        return
    if store is not None:
        yield _announce_s3(store, config)
        return
    from deltaflow.testing import _seaweedfs

    # Export the endpoint and credentials first (a free port chosen now): Spark's JVM, its
    # Python workers and `deltaflow serve` read them from the environment they start with.
    _seaweedfs.plan_environment()
    data_dir = config.data_dir / "seaweedfs"
    data_dir.mkdir()
    started = time.perf_counter()
    print("\nStarting a SeaweedFS S3 gateway ...", end=" ", flush=True)
    with _seaweedfs.start_seaweedfs(data_dir) as started_store:
        print(f"{time.perf_counter() - started:.1f}s   (its log: {data_dir / 'weed.log'})")
        try:
            yield _announce_s3(started_store, config)
        finally:
            print("\nStopping the S3 gateway (its files stay in the data dir until the next run).")


def _announce_s3(store: ObjectStore, config: DemoConfig) -> str:
    root = f"s3://{store.bucket}/{S3_PREFIX}"
    names = ", ".join(sorted(store.env))
    print(f"  S3 endpoint {store.endpoint}, bucket {store.bucket}; exported {names}")
    print(f"  tables under {root}/ (bronze, silver, gold, dims)")
    if config.s3a_jars:
        print(
            f"  with Hadoop's S3A ({len(config.s3a_jars)} jars on Spark's class path): the"
            f" stream checkpoints under {root}/checkpoints/, the landing folder under"
            f" {root}/landing/, the declared pipeline's checkpoints under"
            f" {root}/pipeline/checkpoints/"
        )
        print(
            "  still local: Auto Loader's schema location (a SQLite seen-file store) and the"
            " saved model"
        )
        return root
    print(
        "  stream checkpoints stay on local disk: the pyspark wheel has no hadoop-aws, so "
        "Spark cannot write them to s3://"
    )
    print(
        "  also local in this demo: the landing folder, the saved model and the declared "
        "pipeline's stream checkpoints (its tables and event log are under pipeline/)"
    )
    return root


def prepare_data_dir(data_dir: Path) -> None:
    """Empty ``data_dir``, but only if it is new, empty, or made by an earlier run."""
    if data_dir.exists():
        if any(data_dir.iterdir()) and not (data_dir / MARKER).exists():
            raise DataDirNotOursError(
                f"refusing to wipe {data_dir}: it is not empty and no earlier demo run "
                f"created it (no {MARKER} file). Pass --data-dir with a new or empty directory."
            )
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    (data_dir / MARKER).write_text("created by deltaflow's demo/main_job.py; safe to delete\n")


def print_banner(config: DemoConfig) -> None:
    total = config.commits * config.events_per_commit
    print("deltaflow demo: fitness-tracker events into a Delta table, queried with Spark")
    print(f"  1. generate {total:,} events from {config.devices:,} trackers reporting every second")
    print(
        f"  2. append them to {TABLE} (partitioned by {PARTITION_COLUMN}) "
        f"in {config.commits} commits of {config.events_per_commit:,}"
    )
    print("  3. answer a question with Spark SQL; cross-check it against the raw Arrow data")
    print("  4. show the table history; time-travel to an earlier version")
    print(
        f"  5. live for {config.live_seconds:.0f}s: trackers POST to `deltaflow serve` and drop "
        "landing files; streams build silver and gold"
    )
    print("  6. device registry: MERGE twice, then read its change data feed")
    print(
        "  7. the same chain as a declared pipeline; a scikit-learn model trained on the "
        "backfill scores every event in-stream"
    )
    print(f"  data: {config.data_dir}   (Spark's own log: {config.data_dir / 'spark.log'})")


@contextlib.contextmanager
def session_for(config: DemoConfig, spark: SparkSession | None) -> Iterator[SparkSession]:
    """The caller's session, or a fresh one whose JVM logs go to a file (and is stopped)."""
    if spark is not None:
        yield spark
        return
    import deltaflow

    started = time.perf_counter()
    print("\nStarting Spark ...", end=" ", flush=True)
    # The JVM (and the Python workers it forks) inherit stderr when the gateway starts; point
    # it at a log file for that moment so start-up chatter and WARNs stay out of the output.
    with jvm_stderr_to(config.data_dir / "spark.log"):
        session = deltaflow.session(app_name="deltaflow-demo", conf=s3a_conf(config))
    session.sparkContext.setLogLevel("ERROR")
    print(f"{time.perf_counter() - started:.1f}s")
    try:
        yield session
    finally:
        session.stop()


def s3a_conf(config: DemoConfig) -> dict[str, str]:
    """Hadoop's S3A for the session when the demo runs on S3 with its jars (the gateway's
    endpoint and keys: the AWS variables ``tables_root_for`` exported), else nothing."""
    if config.storage != "s3" or not config.s3a_jars:
        return {}
    from deltaflow.testing._seaweedfs import s3a_settings

    env = os.environ
    return s3a_settings(
        list(config.s3a_jars),
        env["AWS_ENDPOINT_URL"],
        env["AWS_ACCESS_KEY_ID"],
        env["AWS_SECRET_ACCESS_KEY"],
        env["AWS_REGION"],
    )


@contextlib.contextmanager
def jvm_stderr_to(log_path: Path) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def run_demo(config: DemoConfig, spark: SparkSession, tables_root: str | None = None) -> DemoResult:
    tables_root = tables_root or config.data_dir.as_uri()
    table_uri = f"{tables_root}/{TABLE}"
    generator = DeviceEventGenerator(seed=config.seed, devices=config.devices, start=START)
    total_events = config.commits * config.events_per_commit
    window = question_window(generator.start, generator.time_of(total_events))

    arrow_answer = write_events(config, spark, generator, table_uri, window)
    spark_answer = ask_question(spark, table_uri, window)
    print(f"  Spark SQL answer:          {spark_answer:,}")
    print(f"  Arrow cross-check:         {arrow_answer:,}")
    if spark_answer != arrow_answer:
        raise DemoCheckError(
            f"Spark SQL counted {spark_answer:,} {QUESTION_EVENT_TYPE} events but the "
            f"generated data holds {arrow_answer:,}; the table at {table_uri} is wrong"
        )
    print("  OK: both agree")

    versions = show_history(table_uri)
    total_rows = time_travel(spark, table_uri, config)

    _live.run_live(spark, config.data_dir, generator, _live_settings(config), tables_root)
    _registry.run_registry(spark, tables_root, table_uri)
    _declared.run_declared(spark, config.data_dir, table_uri, tables_root)
    return DemoResult(
        table_uri=table_uri,
        total_rows=total_rows,
        spark_answer=spark_answer,
        arrow_answer=arrow_answer,
        window=window,
        versions=versions,
    )


def _live_settings(config: DemoConfig) -> _live.LiveSettings:
    return _live.LiveSettings(
        seconds=config.live_seconds,
        rate=config.live_rate,
        events_per_request=config.events_per_request,
        trigger_seconds=config.trigger_seconds,
        report_seconds=config.report_seconds,
        seed=config.seed,
    )


def question_window(first: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The middle half of the generated time span, on whole minutes when it is long enough."""
    span = end - first
    low, high = first + span / 4, first + span * 3 / 4
    low, high = low.replace(microsecond=0), high.replace(microsecond=0)
    rounded_low = low.replace(second=0) + timedelta(minutes=1 if low.second else 0)
    rounded_high = high.replace(second=0)
    if rounded_high - rounded_low >= timedelta(minutes=2):
        return rounded_low, rounded_high
    return low, high


def write_events(
    config: DemoConfig,
    spark: SparkSession,
    generator: DeviceEventGenerator,
    table_uri: str,
    window: tuple[datetime, datetime],
) -> int:
    """Append the generator's events in ``config.commits`` commits; count answers as we go."""
    print(f"\nWriting {TABLE}")
    expected = 0
    for commit in range(config.commits):
        started = time.perf_counter()
        events = generator.batch(config.events_per_commit)
        expected += count_matching(events, window)
        (
            to_spark(spark, events)
            .write.format("delta")
            .mode("append")
            .partitionBy(PARTITION_COLUMN)
            .save(table_uri)
        )
        span = pc.min_max(events["event_time"])
        first, last = span["min"].as_py(), span["max"].as_py()
        print(
            f"  commit {commit + 1}/{config.commits}: {events.num_rows:,} events "
            f"{_hms(first)} .. {_hms(last)}  "
            f"({time.perf_counter() - started:.1f}s)"
        )
    return expected


def count_matching(events: pa.Table, window: tuple[datetime, datetime]) -> int:
    """The question, answered over Arrow data without Spark or Delta."""
    mask = pc.and_(
        pc.and_(
            pc.equal(events["event_type"], QUESTION_EVENT_TYPE),
            pc.equal(events["state"], QUESTION_STATE),
        ),
        pc.and_(
            pc.greater_equal(events["event_time"], pa.scalar(window[0], events["event_time"].type)),
            pc.less(events["event_time"], pa.scalar(window[1], events["event_time"].type)),
        ),
    )
    return int(pc.sum(mask.cast(pa.int64())).as_py() or 0)


def question_sql(window: tuple[datetime, datetime]) -> str:
    low, high = (moment.strftime("%Y-%m-%d %H:%M:%S") for moment in window)
    return (
        "SELECT count(*) AS events\n"
        "FROM events\n"
        f"WHERE event_type = '{QUESTION_EVENT_TYPE}'\n"
        f"  AND state = '{QUESTION_STATE}'\n"
        f"  AND event_time >= TIMESTAMP '{low} UTC'\n"
        f"  AND event_time <  TIMESTAMP '{high} UTC'"
    )


def ask_question(spark: SparkSession, table_uri: str, window: tuple[datetime, datetime]) -> int:
    low, high = (_hms(moment) for moment in window)
    print(f"\nHow many '{QUESTION_EVENT_TYPE}' events came from users in California")
    print(f"between {low} and {high} UTC?")
    spark.read.format("delta").load(table_uri).createOrReplaceTempView("events")
    sql = question_sql(window)
    print("\n".join("    " + line for line in sql.splitlines()))
    started = time.perf_counter()
    answer = int(spark.sql(sql).collect()[0]["events"])
    print(f"  (query took {time.perf_counter() - started:.1f}s)")
    return answer


def show_history(table_uri: str) -> int:
    """Print the table's commits, newest first; returns how many there are."""
    import deltalake

    history = deltalake.DeltaTable(table_uri).history()
    print(f"\nHistory of {TABLE}")
    print(f"  {'version':>7}  {'timestamp (UTC)':<23}  {'operation':<13}  {'rows added':>10}")
    rows_before: dict[int, int] = {}
    for entry in sorted(history, key=lambda entry: int(entry["version"])):
        version = int(entry["version"])
        rows_before[version] = _rows_at(table_uri, version)
    for entry in history:
        version = int(entry["version"])
        added = rows_before[version] - rows_before.get(version - 1, 0)
        stamp = datetime.fromtimestamp(int(entry["timestamp"]) / 1000, tz=timezone.utc)
        print(
            f"  {version:>7}  {stamp.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]:<23}  "
            f"{entry['operation']:<13}  {added:>10,}"
        )
    return len(history)


def time_travel(spark: SparkSession, table_uri: str, config: DemoConfig) -> int:
    """Count rows at version 1 and now; both must match what was written."""
    earlier = 1
    then = spark.read.format("delta").option("versionAsOf", earlier).load(table_uri).count()
    now = spark.read.format("delta").load(table_uri).count()
    print("\nTime travel")
    print(f'  spark.read.format("delta").option("versionAsOf", {earlier}): {then:>10,} rows')
    print(f'  spark.read.format("delta") (latest):              {now:>10,} rows')
    expected_then = (earlier + 1) * config.events_per_commit
    expected_now = config.commits * config.events_per_commit
    if (then, now) != (expected_then, expected_now):
        raise DemoCheckError(
            f"expected {expected_then:,} rows at version {earlier} and {expected_now:,} now, "
            f"got {then:,} and {now:,}"
        )
    return int(now)


def _rows_at(table_uri: str, version: int) -> int:
    import deltalake

    # delta-rs history has no operationMetrics for these commits, so count the rows in the
    # snapshot's files (from their stats) instead.
    actions = pa.table(deltalake.DeltaTable(table_uri, version=version).get_add_actions())
    return int(pc.sum(actions["num_records"]).as_py() or 0)


def _hms(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


if __name__ == "__main__":
    sys.exit(main())
