"""Parts 2 and 3 of the demo: live ingest and the streaming pipeline, run together.

Order of events: create silver and gold (empty, so their readers can start), start
``deltaflow serve``, start the three streaming queries, start the live feed; report
progress while it runs; then stop the feed (all of its requests acknowledged), stop the
service (SIGTERM), drain the queries upstream first (``processAllAvailable``) and stop
them. Every figure printed afterwards is checked against what the feed sent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from demo import _ingest, _pipeline
from demo._checks import check

from deltaflow.testing import DeviceEventGenerator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

QUESTION_EVENT_TYPE = "workout_start"
QUESTION_STATE = "CA"
GROUP_COMMIT_MAX_DELAY_MS = 20.0
# The live stage sends on past its set time, up to this many times it, until gold's first
# whole minute can close; and this much event time past the watermark.
MAX_STRETCH = 4.0
CLOSE_SLACK = dt.timedelta(seconds=5)


@dataclass(frozen=True)
class LiveSettings:
    seconds: float
    rate: float
    events_per_request: int
    trigger_seconds: float
    report_seconds: float
    seed: int


@dataclass(frozen=True)
class LiveResult:
    feed: _ingest.FeedStats
    bronze_rows: int
    silver_rows: int
    gold_minutes: int
    gold_events: int
    gold_answer: int


def run_live(
    spark: SparkSession,
    data_dir: Path,
    generator: DeviceEventGenerator,
    settings: LiveSettings,
    tables_root: str,
) -> LiveResult:
    paths = _pipeline.PipelinePaths.under(data_dir, tables_root, spark)
    speed = settings.rate / generator.events_per_second
    print(
        f"\nLive: trackers send for {settings.seconds:.0f}s at up to {settings.rate:,.0f} "
        f"events/s (event time runs {speed:.1f}x the wall clock)"
    )
    create_silver_and_gold(spark, paths)
    config = _ingest.write_serve_config(
        data_dir / "ingest", paths.bronze, GROUP_COMMIT_MAX_DELAY_MS
    )
    queries: dict[str, StreamingQuery] = {}
    with _ingest.running_server(config, data_dir / "ingest" / "serve.log") as server:
        print(
            f"  deltaflow serve --config {config.relative_to(data_dir)}: http://127.0.0.1:{server.port}"
        )
        try:
            queries = _pipeline.start_queries(spark, paths, settings.trigger_seconds)
            print(
                "  streams: landing/ -(cloudFiles)-> bronze/live_events -> silver/events "
                "-> gold/events_per_minute"
            )
            feed = _ingest.LiveFeed(
                generator,
                server,
                paths.landing,
                rate=settings.rate,
                events_per_request=settings.events_per_request,
                seed=settings.seed,
            )
            feed.start()
            try:
                _report_while_running(spark, settings, feed, queries, paths)
            finally:
                stats = feed.stop()
        except BaseException:
            for query in queries.values():
                with contextlib.suppress(Exception):
                    query.stop()
            raise
    print("  stopped: the feed (every request acknowledged), then deltaflow serve", end="")
    started = time.perf_counter()
    progress = {name: list(query.recentProgress) for name, query in queries.items()}
    _pipeline.drain_and_stop(queries)
    progress = {name: _all_progress(progress[name], query) for name, query in queries.items()}
    print(f"; queries drained and stopped in {time.perf_counter() - started:.1f}s")
    check(
        server.process.returncode == 0, f"deltaflow serve exited with {server.process.returncode}"
    )

    if paths.checkpoints_on_store:
        report_checkpoints_on_store(paths, list(queries))
    bronze_rows = report_ingest(stats, paths)
    silver_rows = report_streaming(stats, paths, progress)
    gold_minutes, gold_events, gold_answer = report_gold(
        paths, _pipeline.dropped_by_watermark(progress["gold"])
    )
    return LiveResult(stats, bronze_rows, silver_rows, gold_minutes, gold_events, gold_answer)


def report_checkpoints_on_store(paths: _pipeline.PipelinePaths, names: list[str]) -> None:
    """With S3A: each stream's offset and commit logs are objects on the store, none left
    behind half-written (Spark's temporary files), and nothing of them on local disk."""
    import pyarrow.fs as pafs

    from deltaflow.table import _uri

    fs, root = _uri.filesystem(paths.checkpoints)
    keys = [
        info.path.removeprefix(root + "/")
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True))
        if info.type == pafs.FileType.File
    ]
    for name in names:
        commits = [k for k in keys if k.startswith(f"{name}/commits/")]
        check(bool(commits), f"stream {name} has no commit log under {paths.checkpoints}")
    stray = [k for k in keys if k.rsplit("/", 1)[-1].endswith(".tmp")]
    check(not stray, f"temporary checkpoint files left on the store: {stray[:5]}")
    print(
        f"  OK: the streams' checkpoints are on the object store ({len(keys)} objects under"
        f" {paths.checkpoints}/, none temporary)"
    )


def create_silver_and_gold(spark: SparkSession, paths: _pipeline.PipelinePaths) -> None:
    """Empty tables up front, so the downstream streams can start before data arrives."""
    from pyspark.sql.types import StructType

    from deltaflow import DeltaTable

    silver_schema = StructType.fromDDL(_ingest.BRONZE_DDL)
    (
        DeltaTable.create(spark)
        .location(paths.silver)
        .addColumns(silver_schema)
        .partitionedBy("event_date")
        .comment("device events: valid GPS, one row per event_id")
        .execute()
    )
    (
        DeltaTable.create(spark)
        .location(paths.gold)
        .addColumn("minute", "TIMESTAMP")
        .addColumn("state", "STRING")
        .addColumn("event_type", "STRING")
        .addColumn("events", "BIGINT", nullable=False)
        .comment("events per minute, state and event type; a minute is final once written")
        .execute()
    )


def _report_while_running(
    spark: SparkSession,
    settings: LiveSettings,
    feed: _ingest.LiveFeed,
    queries: dict[str, StreamingQuery],
    paths: _pipeline.PipelinePaths,
) -> None:
    started = time.perf_counter()
    asked = stretched = False
    while True:
        elapsed = time.perf_counter() - started
        if elapsed >= settings.seconds:
            # The set time is up. On a slow machine the feed may not have sent enough event
            # time for gold's first minute to close: send on (at most MAX_STRETCH times the
            # set time) rather than end with nothing in gold.
            if first_minute_can_close(feed) or elapsed >= settings.seconds * MAX_STRETCH:
                return
            if not stretched:
                stretched = True
                print(
                    f"  [{elapsed:4.0f}s] sending on: the first live minute has not passed "
                    f"the {_pipeline.WATERMARK} watermark yet (slow machine)"
                )
        # The demo runs for a set time; this wait paces the progress lines, it waits for
        # nothing. Failures are checked on every turn.
        time.sleep(max(0.1, min(settings.report_seconds, settings.seconds - elapsed)))
        if feed.failed:
            return  # feed.stop() raises the feed's error
        _pipeline.check_running(queries)
        elapsed = time.perf_counter() - started
        parts = [f"sent {feed.stats.events:>9,} ({feed.stats.events / elapsed:,.0f}/s)"]
        for name, query in queries.items():
            last = query.lastProgress
            if last:
                parts.append(
                    f"{name} #{last['batchId']} {last['numInputRows']:,} rows "
                    f"{last['durationMs'].get('triggerExecution', 0) / 1000:.1f}s"
                )
        print(f"  [{elapsed:4.0f}s] " + " | ".join(parts))
        # A minute reaches gold once the watermark (a minute behind the newest event) has
        # passed its end, so ask late enough for the first live minutes to have closed.
        if not asked and elapsed >= settings.seconds * 3 / 4:
            asked = True
            minutes, answer = gold_question(spark, paths.gold)
            if minutes:
                print(
                    f"  [{elapsed:4.0f}s] gold, read while the streams run: {answer:,} "
                    f"'{QUESTION_EVENT_TYPE}' events in {QUESTION_STATE} over {minutes} "
                    "closed minutes"
                )
            else:
                print(
                    f"  [{elapsed:4.0f}s] gold, read while the streams run: no minute has "
                    f"closed yet (watermark {_pipeline.WATERMARK})"
                )


def first_minute_can_close(feed: _ingest.LiveFeed) -> bool:
    """Whether the feed has sent events late enough for the watermark to pass the end of
    the first whole minute it sent events in (a few seconds of slack)."""
    first, newest = feed.first_event_time, feed.newest_event_time
    if first is None or newest is None:
        return False
    first_minute_end = first.replace(second=0, microsecond=0) + dt.timedelta(minutes=2)
    return newest >= first_minute_end + _pipeline.WATERMARK_DELTA + CLOSE_SLACK


def gold_question(spark: SparkSession, gold_uri: str) -> tuple[int, int]:
    """(closed minutes, workout_start events in CA) from the gold table, with Spark."""
    from pyspark.sql import functions as F

    question = (F.col("state") == QUESTION_STATE) & (F.col("event_type") == QUESTION_EVENT_TYPE)
    row = (
        spark.read.format("delta")
        .load(gold_uri)
        .agg(
            F.countDistinct("minute").alias("minutes"),
            F.coalesce(F.sum(F.when(question, F.col("events"))), F.lit(0)).alias("answer"),
        )
        .first()
    )
    return int(row["minutes"]), int(row["answer"])


def _all_progress(before: list[dict[str, Any]], query: StreamingQuery) -> list[dict[str, Any]]:
    """Progress reports of every batch (recentProgress keeps only the last 100)."""
    seen = {p["batchId"] for p in before}
    return before + [p for p in query.recentProgress if p["batchId"] not in seen]


def _read(uri: str, columns: list[str] | None = None) -> pa.Table:
    import deltalake

    return deltalake.DeltaTable(uri).to_pyarrow_table(columns=columns)


def report_ingest(stats: _ingest.FeedStats, paths: _pipeline.PipelinePaths) -> int:
    lat = stats.ack_latencies_ms
    print("\nIngest")
    print(f"  HTTP acknowledged events:  {stats.http_events:>10,}")
    print(
        f"    {stats.http_requests:,} requests in {len(stats.versions):,} commits; "
        f"{stats.events / stats.seconds:,.0f} events/s sent over {stats.seconds:.1f}s (both paths)"
    )
    print(
        f"    acknowledgement latency: p50 {_ingest.percentile(lat, 50):.0f} ms, "
        f"p90 {_ingest.percentile(lat, 90):.0f} ms, p99 {_ingest.percentile(lat, 99):.0f} ms, "
        f"max {max(lat, default=0):.0f} ms"
    )
    print(
        f"    {stats.retries} requests re-sent with the same Idempotency-Key: "
        f"{stats.retries_answered_duplicate} answered duplicate, nothing written twice"
    )
    print(f"  Landing file lines:        {stats.file_lines:>10,}")
    print(
        f"    {stats.files:,} files, {stats.file_events:,} events + {stats.reuploads:,} "
        f"re-uploads + {stats.corrupt_lines:,} cut-short lines"
    )
    bronze = _read(paths.bronze, ["event_id", "_rescued_data"])
    print(f"  Bronze rows:               {bronze.num_rows:>10,}")
    check(
        stats.retries_answered_duplicate == stats.retries,
        f"{stats.retries - stats.retries_answered_duplicate} retried requests were not "
        "recognised as duplicates",
    )
    check(
        bronze.num_rows == stats.http_events + stats.file_lines,
        f"bronze holds {bronze.num_rows:,} rows, but {stats.http_events:,} events were "
        f"acknowledged and {stats.file_lines:,} landing lines written",
    )
    sent = stats.sent_table()
    http_ids = sent.filter(pc.equal(sent["path"], "http"))["event_id"]
    landed = bronze.filter(pc.is_in(bronze["event_id"], value_set=http_ids))["event_id"]
    check(
        len(landed) == len(http_ids) == pc.count_distinct(landed).as_py(),
        f"{len(http_ids):,} acknowledged events, but bronze has {len(landed):,} rows of "
        f"them ({pc.count_distinct(landed).as_py():,} distinct)",
    )
    rescued = int(pc.sum(pc.is_valid(bronze["_rescued_data"]).cast(pa.int64())).as_py() or 0)
    check(
        rescued == stats.corrupt_lines,
        f"{rescued} rows in _rescued_data, {stats.corrupt_lines} cut-short lines written",
    )
    print(
        "  OK: every acknowledged event is in bronze exactly once, every landing line once "
        f"({rescued} in _rescued_data)"
    )
    return bronze.num_rows


def report_streaming(
    stats: _ingest.FeedStats,
    paths: _pipeline.PipelinePaths,
    progress: dict[str, list[dict[str, Any]]],
) -> int:
    print("\nStreaming")
    print(
        f"  {'query':<8} {'batches':>7} {'rows':>9} {'rows/s':>8} {'p50 batch':>9} "
        f"{'max batch':>9}   {'source commit -> batch done':>27}"
    )
    sources = {"silver": paths.bronze, "gold": paths.silver}
    for name, reports in progress.items():
        figures = _pipeline.batch_figures(reports)
        latency = ""
        if name in sources:
            waits = _pipeline.commit_latencies_ms(reports, sources[name])
            latency = (
                f"p50 {_ingest.percentile(waits, 50) / 1000:.1f}s, "
                f"p90 {_ingest.percentile(waits, 90) / 1000:.1f}s"
            )
        print(
            f"  {name:<8} {figures.batches:>7} {figures.rows:>9,} "
            f"{figures.rows_per_second:>8,.0f} {figures.p50_batch_ms / 1000:>8.1f}s "
            f"{figures.max_batch_ms / 1000:>8.1f}s   {latency:>27}"
        )
    silver = _read(paths.silver, ["event_id"])
    expected = _pipeline.expected_silver(stats.sent_table())
    bad_gps = stats.events - expected.num_rows
    late_rows = _pipeline.dropped_by_watermark(progress["silver"])
    missing = expected.num_rows - silver.num_rows
    print(f"  Silver rows:               {silver.num_rows:>10,}")
    print(
        f"    dropped from bronze: {bad_gps:,} bad GPS fixes, {stats.corrupt_lines:,} "
        f"unparseable lines, {stats.reuploads:,} re-uploaded duplicates, "
        f"{late_rows:,} rows later than the {_pipeline.WATERMARK} watermark"
    )
    distinct = pc.count_distinct(silver["event_id"]).as_py()
    unknown = silver.filter(
        pc.invert(pc.is_in(silver["event_id"], value_set=expected["event_id"]))
    ).num_rows
    check(
        distinct == silver.num_rows and unknown == 0,
        f"silver has {silver.num_rows:,} rows, {distinct:,} distinct event ids, {unknown:,} "
        "that are not valid events the feed sent",
    )
    check(
        0 <= missing <= late_rows,
        f"silver has {silver.num_rows:,} rows; the feed sent {expected.num_rows:,} distinct "
        f"events with valid GPS and Spark dropped {late_rows:,} rows as late",
    )
    if missing:
        print(f"    ({missing:,} valid events arrived after the watermark passed them)")
    print("  OK: silver holds each valid event once (late ones aside)")
    return silver.num_rows


def report_gold(paths: _pipeline.PipelinePaths, late_rows: int) -> tuple[int, int, int]:
    """Gold against silver's own rows: each closed minute's counts, minus rows Spark dropped."""
    gold = _read(paths.gold)
    minutes = sorted(set(gold["minute"].to_pylist()))
    silver = _read(paths.silver, ["event_time", "state", "event_type"])
    expected = _pipeline.minute_counts(silver)
    written = {
        (row["minute"], row["state"], row["event_type"]): int(row["events"])
        for row in gold.to_pylist()
    }
    closed = {key: n for key, n in expected.items() if key[0] in set(minutes)}
    total = sum(written.values())
    answer = _question(written)
    cross = _question(closed)
    silver_in_closed = sum(closed.values())
    print(f"\nGold: events per minute, state and type ({_pipeline.WATERMARK} watermark)")
    if minutes:
        print(f"  closed minutes: {_hm(minutes[0])} .. {_hm(minutes[-1])} UTC")
    print(f"  Gold minutes:              {len(minutes):>10,}")
    print(f"  Gold events:               {total:>10,}")
    print(f"  Silver events in them:     {silver_in_closed:>10,}")
    print(f"  Late for gold:             {late_rows:>10,}")
    print(
        f"  How many '{QUESTION_EVENT_TYPE}' events came from users in California in the "
        "closed minutes?"
    )
    print(f"  Gold answer:               {answer:>10,}")
    print(f"  Silver cross-check:        {cross:>10,}")
    check(len(minutes) > 0, "the gold table has no closed minute: run longer (--live-seconds)")
    over = [key for key, n in written.items() if n > closed.get(key, 0)]
    check(not over, f"gold counts more than silver holds for {len(over)} groups, e.g. {over[:1]}")
    check(
        0 <= silver_in_closed - total <= late_rows,
        f"gold counts {total:,} events in its minutes, silver holds {silver_in_closed:,} and "
        f"Spark dropped {late_rows:,} rows as late",
    )
    check(
        cross - answer <= late_rows,
        f"gold answers {answer:,}, silver holds {cross:,}, {late_rows:,} rows were late",
    )
    print(
        "  OK: gold equals silver's counts in every closed minute (late rows aside); "
        "later minutes wait for the watermark"
    )
    return len(minutes), total, answer


def _question(counts: dict[tuple[datetime, str, str], int]) -> int:
    return sum(
        n
        for (_, state, kind), n in counts.items()
        if state == QUESTION_STATE and kind == QUESTION_EVENT_TYPE
    )


def _hm(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")
