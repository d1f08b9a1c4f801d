"""Real-time mode latency (issue 28 part 7): per-event p50 / p99 / p99.9 and CPU per event.

Variants, each at 100, 1,000 and 10,000 events/s (``--quick``: 100 and 1,000; ``--rows N``:
only N events/s), all in one Spark session, one after the other:

* ``kafka -> kafka RTM`` (the anchor): Spark's own real-time mode, Kafka topic A to topic B, a
  stateless projection, on a single-node KRaft broker started for the run. Both the broker
  and Spark's Kafka connector come from Maven Central (``tests/reference/_kafka.py``); neither
  is part of deltaflow. A producer in this process stamps each event at send time; a consumer
  here records when it reaches B.
* ``kafka -> kafka RTM, fsync per append`` (``kafka-fsync``): the anchor with both topics set
  to ``flush.messages=1``, so the broker fsyncs each append before it acknowledges it, as a
  Delta commit is fsynced before it counts. Spark's Kafka sink stays at least once.
* ``delta -> delta RTM``: a delta-rs writer commits the due events to a source table every
  50 ms; the RTM query copies them to a target table; a probe tails the target's
  ``_delta_log`` (one ``stat`` every 2 ms), takes the time the commit file appears, then reads
  its added files' ids. Latency starts when the source commit file appeared, on the
  writer's own wall clock: a stat loop of the writer (every 0.5 ms, only while its
  ``write_deltalake`` call runs) takes the time it first sees the file, else the call's
  return is the start (the commit is visible no later than that). Until 2026-11-29 the
  start was the file's modification time, which the kernel's coarse clock stamps up to
  one tick early; the return alone would be late: ``write_deltalake`` returns p50 7-21 ms
  after its file appears (delta-rs works on after the put). Both are kept for
  comparison: the ``ret-mtime`` column is the p50 of (return - mtime) over the window's
  events, and a line under the row gives p50 / p99 from the mtime, p50 of (return -
  start) and of (start - mtime) (``p50_ms_from_mtime``, ``p99_ms_from_mtime``,
  ``return_minus_start_p50_ms``, ``start_minus_mtime_p50_ms`` in the result). The same
  start applies to every variant whose source is this writer (foreach, delta-kafka, cdf,
  dedup, micro-batch).
* ``delta -> foreach RTM``: the same source into a ``foreach`` sink whose writer sends each
  row's id by UDP to this process: the source's latency alone (Python's ``foreach`` hands
  rows to its worker in batches: see docs/realtime.md). ``delta -> kafka RTM``: the same
  source into Spark's Kafka sink (a JVM sink), read back by a consumer.
* ``serve -> delta -> delta RTM``: events POSTed to ``deltaflow serve`` (durable
  acknowledgement, every 10 ms) land in the source table; the rest as above. Latency starts
  when the event was due by the rate schedule.
* ``delta CDF -> delta RTM`` (``cdf``): as ``delta -> delta RTM``, but the source table has
  the change data feed on and the query reads it (``readChangeFeed``): each event reaches
  the target with its ``_change_type`` and ``_commit_version``.
* ``delta -> dropDuplicates -> delta RTM`` (``dedup``): as ``delta -> delta RTM`` with
  ``dropDuplicates("id")`` (Spark 4.3's pipelined shuffle, one shuffle partition): the
  shuffle hop's cost against the stateless variant.
* ``delta (row log) -> delta (row log) RTM`` (``rowlog``): a writer process appends the
  events to the source table's row log (``docs/notes/rowlog.md``: one fsynced frame per
  1 ms tick, each row's ``ts`` the moment it was due) and commits them to the table every
  second; the RTM query reads the log and writes the target with ``realTimeRowLog``; a
  probe tails the target's row log (every 0.5 ms). Latency starts when the event was due,
  as for the Kafka anchor.
* ``delta -> delta micro-batch``: today's best Delta path, ``processingTime="0 seconds"``,
  as the baseline.

A variant Spark refuses (no RTM Delta source/sink yet: ``STREAMING_REAL_TIME_MODE...``) is
reported as unavailable with Spark's message, and the run goes on. CPU per event = CPU
seconds of the Spark JVM's process tree (the JVM, its Python workers, the deltaflow brain)
during the measurement window / events created in it; the Kafka broker's CPU is reported
apart. Every result records the load average: the machine is shared.

    .venv/bin/python bench/bench_realtime.py [--quick] [--rows 1000] [--only kafka,delta]
    (parts: kafka, kafka-fsync, delta, dedup, foreach, delta-kafka, serve, cdf, microbatch,
    rowlog)

``BENCH_RT_TIMING_LINES=1`` turns the logger ``org.apache.spark.sql.deltaflow`` to INFO, so
the real-time source's, writers' and driver's per-epoch timing lines (docs/realtime.md)
print on stderr. ``BENCH_RT_AGED_LOG=N`` puts N more files in the Delta target's
``_delta_log`` before the query starts: the log a real-time sink leaves after hours
(docs/realtime.md, "A long-running query's log").
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from tests.reference import _env, _kafka  # noqa: E402

from _common import DATA_DIR, fresh_dir, loadavg, parse_args, save_result, spark_session  # noqa: E402
from _realtime_probes import (  # noqa: E402
    DeltaProbe,
    DeltaWriter,
    ForeachProbe,
    KafkaProbe,
    KafkaProducer,
    Paced,
    RowLogProbe,
    RowLogProducer,
    ServePoster,
    UdpRowWriter,
    tree_cpu_seconds,
)

REALTIME = "5 minutes"  # the real-time trigger's checkpoint interval (Spark's own examples)
NAMES = {
    "kafka": "kafka -> kafka RTM",
    "kafka-fsync": "kafka -> kafka RTM, fsync per append",
    "delta": "delta -> delta RTM",
    "dedup": "delta -> dropDuplicates -> delta RTM",
    "foreach": "delta -> foreach RTM",
    "delta-kafka": "delta -> kafka RTM",
    "serve": "serve -> delta -> delta RTM",
    "cdf": "delta CDF -> delta RTM",
    "microbatch": "delta -> delta micro-batch",
    "rowlog": "delta (row log) -> delta (row log) RTM",
}
PARTS = tuple(NAMES)
ALLOWLIST = "spark.sql.streaming.realTimeMode.allowlistCheck"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
FIRST_EVENT_TIMEOUT = 120.0
# BENCH_RT_COMMIT_INTERVAL_MS=N: the real-time Delta sink's realTimeCommitIntervalMs (its
# default, 50, when unset), to measure the interval's trade-off.
COMMIT_INTERVAL_MS = os.environ.get("BENCH_RT_COMMIT_INTERVAL_MS", "")
# BENCH_RT_POLL_INTERVAL_MS=N: the real-time Delta source's realTimePollIntervalMs (its
# default when unset: 2 ms on local disk, 10 elsewhere): how often a task checks for the
# next commit.
POLL_INTERVAL_MS = os.environ.get("BENCH_RT_POLL_INTERVAL_MS", "")
# BENCH_RT_TIMING_LINES=1: the connector's real-time timing lines (INFO) on stderr.
TIMING_LINES = os.environ.get("BENCH_RT_TIMING_LINES", "") == "1"
# BENCH_RT_AGED_LOG=N: N more files in the target's ``_delta_log`` before the query starts
# (names no reader takes for a log entry), as a long-running real-time sink leaves there:
# what every listing of that directory then walks.
AGED_LOG = int(os.environ.get("BENCH_RT_AGED_LOG", "0") or 0)
TIMING_LOGGER = "org.apache.spark.sql.deltaflow"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    name: str,
    rate: int,
    args: Any,
    source: Paced,
    probe: Any,
    start_query: Any,
    jvm_pid: int,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """Starts ``probe``, the query, then ``source``; warms up until events flow, measures
    ``args.seconds``, and waits (bounded) for the window's events to be seen."""
    probe.start()
    query = None
    try:
        query = start_query()
        source.start()
        deadline = time.monotonic() + FIRST_EVENT_TIMEOUT
        while not probe.seen_at:  # the first event made it through: tasks and workers are up
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            if source.error is not None:
                raise RuntimeError(f"the event source failed: {source.error}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no event arrived within {FIRST_EVENT_TIMEOUT:.0f} s")
            time.sleep(0.05)
    except BaseException:  # no thread left polling (a daemon thread in pyarrow at exit)
        source.stop_event.set()
        probe.stop_event.set()
        if query is not None:
            query.stop()
        for thread in (source, probe):
            if thread.is_alive():
                thread.join(30)
        raise
    time.sleep(args.warmup)
    first, load_before = source.sent, loadavg()
    cpu_before = tree_cpu_seconds(jvm_pid)
    broker_before = tree_cpu_seconds(broker_pid) if broker_pid else 0.0
    time.sleep(args.seconds)
    last = source.sent
    cpu = tree_cpu_seconds(jvm_pid) - cpu_before
    broker_cpu = (tree_cpu_seconds(broker_pid) - broker_before) if broker_pid else None
    load_after = loadavg()
    source.stop_event.set()
    source.join(60)
    window = range(first, last)
    deadline = time.monotonic() + 30
    while any(e not in probe.seen_at for e in window) and time.monotonic() < deadline:
        time.sleep(0.05)
    active = query.isActive
    query.stop()
    probe.stop_event.set()
    probe.join(10)
    latencies = [
        (probe.seen_at[e] - source.created[e]) * 1000
        for e in window
        if e in probe.seen_at and e in source.created
    ]
    if not latencies:
        raise RuntimeError(f"none of the window's {len(window)} events arrived")
    events = len(window)
    # A Delta writer's events also carry their commit file's mtime (the start used before).
    landed: dict[int, float] = getattr(source, "landed", {})
    returned: dict[int, float] = getattr(source, "returned", {})
    seen = [e for e in window if e in probe.seen_at and e in landed]
    from_mtime = [(probe.seen_at[e] - landed[e]) * 1000 for e in seen]
    return_gaps = [(returned[e] - landed[e]) * 1000 for e in seen]
    return_lags = [(returned[e] - source.created[e]) * 1000 for e in seen]
    mtime_leads = [(source.created[e] - landed[e]) * 1000 for e in seen]
    result: dict[str, Any] = {
        "variant": name,
        "rate": rate,
        "events": events,
        "missing": events - len(latencies),
        "query_active_at_end": active,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "p999_ms": percentile(latencies, 0.999),
        "max_ms": max(latencies),
        "mean_ms": statistics.fmean(latencies),
        "cpu_s": cpu,
        "cpu_us_per_event": cpu / events * 1e6,
        "broker_cpu_us_per_event": broker_cpu / events * 1e6 if broker_cpu is not None else None,
        "start": "commit file first seen by the writer" if landed else "source's own stamp",
        "return_minus_mtime_p50_ms": percentile(return_gaps, 0.5) if seen else None,
        "return_minus_start_p50_ms": percentile(return_lags, 0.5) if seen else None,
        "start_minus_mtime_p50_ms": percentile(mtime_leads, 0.5) if seen else None,
        "p50_ms_from_mtime": percentile(from_mtime, 0.5) if from_mtime else None,
        "p99_ms_from_mtime": percentile(from_mtime, 0.99) if from_mtime else None,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    gap = result["return_minus_mtime_p50_ms"]
    print(
        f"| {name} | {rate} | {events} | {result['missing']} | {result['p50_ms']:.1f} |"
        f" {result['p99_ms']:.1f} | {result['p999_ms']:.1f} | {result['max_ms']:.1f} |"
        f" {'-' if gap is None else f'{gap:.1f}'} |"
        f" {result['cpu_us_per_event']:.0f} | {load_before.split()[0]} |",
        flush=True,
    )
    if from_mtime:
        print(
            f"|   (from the source file's mtime: p50 {result['p50_ms_from_mtime']:.1f}"
            f" / p99 {result['p99_ms_from_mtime']:.1f} ms; p50 return - start"
            f" {result['return_minus_start_p50_ms']:.1f}, start - mtime"
            f" {result['start_minus_mtime_p50_ms']:.1f} ms) |",
            flush=True,
        )
    return result


def kafka_variant(
    spark: Any, broker: Any, rate: int, args: Any, out: Path, pid: int, part: str = "kafka"
) -> dict:
    a, b = f"a-{rate}-{time.time_ns()}", f"b-{rate}-{time.time_ns()}"
    # kafka-fsync: both topics fsync each append before the broker acknowledges it, as a
    # Delta commit is fsynced before it counts (the plain anchor leaves it to the page cache).
    broker.create_topics(a, b, config={"flush.messages": "1"} if part == "kafka-fsync" else None)
    probe = KafkaProbe(broker.bootstrap, b)
    return measure(
        NAMES[part],
        rate,
        args,
        KafkaProducer(broker.bootstrap, a, rate, probe),
        probe,
        lambda: _kafka.start_rtm_copy(
            spark, broker.bootstrap, a, b, str(out / f"chk-{a}"), REALTIME
        ),
        pid,
        broker.pid,
    )


def delta_variant(
    spark: Any,
    part: str,
    rate: int,
    args: Any,
    out: Path,
    pid: int,
    serve: Any = None,
    broker: Any = None,
) -> dict:
    from pyspark.sql import functions as F

    root = out / f"{part}-{rate}-{time.time_ns()}"
    source_path, target, checkpoint = str(root / "src"), str(root / "dst"), str(root / "chk")
    writer: Any
    if part == "rowlog":
        _create_source(source_path)
    elif serve is None:
        writer = DeltaWriter(source_path, rate)
        _create_source(source_path, change_feed=part == "cdf")
    else:
        writer = serve(source_path, rate)
    probe: Any
    if part == "rowlog":
        probe = RowLogProbe(target)
        writer = RowLogProducer(source_path, rate, "bench-upstream", probe)
    elif part == "foreach":
        probe = ForeachProbe()
    elif part == "delta-kafka":
        topic = f"from-delta-{rate}-{time.time_ns()}"
        broker.create_topics(topic)
        probe = KafkaProbe(broker.bootstrap, topic)
    else:
        probe = DeltaProbe(target)

    def start() -> Any:
        reader = spark.readStream.format("delta")
        if part == "cdf":
            reader = reader.option("readChangeFeed", "true")
        columns = ["id", F.upper("kind").alias("kind"), "ts"]
        if part == "cdf":
            columns += ["_change_type", "_commit_version"]
        if POLL_INTERVAL_MS:
            reader = reader.option("realTimePollIntervalMs", POLL_INTERVAL_MS)
        rows = reader.load(source_path).where("kind <> 'heartbeat'").select(*columns)
        if part == "dedup":  # Spark 4.3's pipelined shuffle, one producer (docs/realtime.md)
            rows = rows.dropDuplicates(["id"])
        if part == "delta-kafka":  # Kafka's sink takes a value column
            rows = rows.select(F.col("id").cast("string").alias("value"))
        stream = rows.writeStream.option("checkpointLocation", checkpoint)
        if part == "microbatch":
            return stream.format("delta").trigger(processingTime="0 seconds").start(target)
        stream = stream.outputMode("update").trigger(realTime=REALTIME)
        if part == "foreach":
            return stream.foreach(UdpRowWriter(probe.port)).start()
        if part == "delta-kafka":
            return (
                stream.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap)
                .option("topic", topic)
                .start()
            )
        # The real-time Delta sink is a catalog table's streaming write (Spark's path sink
        # is a micro-batch one); the connector turns Spark's asynchronous progress tracking
        # default off for it.
        table = f"realtime_target_{time.time_ns()}"
        change = ", _change_type STRING, _commit_version BIGINT" if part == "cdf" else ""
        spark.sql(
            f"CREATE TABLE {table} (id BIGINT, kind STRING, ts BIGINT{change}) USING delta"
            f" LOCATION '{target}'"
        )
        age_log(Path(target) / "_delta_log", AGED_LOG)
        stream = stream.format("delta")
        if COMMIT_INTERVAL_MS:  # the sink's commit interval, when the run asks for one
            stream = stream.option("realTimeCommitIntervalMs", COMMIT_INTERVAL_MS)
        if part == "rowlog":
            stream = stream.option("realTimeRowLog", "true")
        return stream.toTable(table)

    # Spark's real-time sink allowlist names only Spark's own sinks; the connector checks a
    # real-time query's operators itself (docs/realtime.md), so the check is off for them.
    allowlist_off = part in ("delta", "serve", "cdf", "dedup", "rowlog")
    if allowlist_off:
        spark.conf.set(ALLOWLIST, "false")
    # The source task and every shuffle partition run at once (Spark's slot check).
    shuffle = spark.conf.get(SHUFFLE_PARTITIONS)
    if part == "dedup":
        spark.conf.set(SHUFFLE_PARTITIONS, "1")
    try:
        result = measure(NAMES[part], rate, args, writer, probe, start, pid)
    finally:
        if allowlist_off:
            spark.conf.unset(ALLOWLIST)
        spark.conf.set(SHUFFLE_PARTITIONS, shuffle)
    return {**result, "allowlist_check_off": allowlist_off}


def age_log(log: Path, files: int) -> None:
    """``files`` empty files in the log directory ``log``, named as no log entry is."""
    for i in range(files):
        (log / f"aged-{i:09d}.tmp").touch()


def _create_source(path: str, change_feed: bool = False) -> None:
    """An empty source table, so the query starts before the first event."""
    from deltalake import DeltaTable

    from _realtime_probes import SOURCE_SCHEMA

    configuration = {"delta.enableChangeDataFeed": "true"} if change_feed else None
    DeltaTable.create(path, schema=SOURCE_SCHEMA, configuration=configuration)


class Serve:
    """``deltaflow serve`` on a free port for one source table; ``__call__`` makes the
    poster. The table is created by the server (``--schema``)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server: subprocess.Popen[bytes] | None = None

    def __call__(self, path: str, rate: int) -> ServePoster:
        port = _kafka._free_port()
        env = {**os.environ, "BENCH_TOKENS": "bench-token"}
        self.server = subprocess.Popen(
            [sys.executable, "-m", "deltaflow.cli", "serve", "--table", f"events={path}",
             "--schema", "events=id BIGINT, kind STRING, ts BIGINT",
             "--token-env", "events=BENCH_TOKENS", "--port", str(port),
             "--log-level", "warning"],
            env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    raise RuntimeError("deltaflow serve did not start") from None
                time.sleep(0.1)
        poster = ServePoster(port, "events", "bench-token", rate)
        # The table exists once the first event is committed: one warm-up POST.
        poster.connection.request(
            "POST", poster.url, b'{"id": -1, "kind": "heartbeat", "ts": 0}', poster.headers
        )
        poster.connection.getresponse().read()
        return poster

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait(60)


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    args.seconds = 20 if args.quick else 60
    args.warmup = 5 if args.quick else 10
    rates = [args.rows] if args.rows else ([100, 1000] if args.quick else [100, 1000, 10000])
    parts = args.only.split(",") if args.only else list(PARTS)
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"--only: unknown parts {sorted(unknown)}; the parts are {PARTS}")
    out = fresh_dir(DATA_DIR / "realtime_out")
    conf: dict[str, str] = {}
    broker = None
    anchor: dict[str, Any] = {}
    if {"kafka", "kafka-fsync", "delta-kafka"} & set(parts):
        try:
            version, _ = _kafka.connector_jars()
            conf = _kafka.spark_kafka_conf()
            broker = _kafka.KafkaBroker(Path(tempfile.mkdtemp(prefix="bench-kafka-")))
            anchor = {"broker": _kafka.BROKER_VERSION, "spark_sql_kafka": version}
        except (_env.ReferenceUnavailable, RuntimeError, TimeoutError) as exc:
            anchor = {"error": str(exc).splitlines()[0][:300]}
            print(f"kafka anchor unavailable: {anchor['error']}", flush=True)
    spark = spark_session(conf)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    if TIMING_LINES:
        jvm = spark.sparkContext._jvm
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(TIMING_LOGGER, log4j.Level.INFO)
    print("| variant | events/s | events | missing | p50 ms | p99 ms | p99.9 ms | max ms |"
          " ret-mtime ms | CPU µs/event | load |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    results: list[dict[str, Any]] = []
    serve = Serve(out)
    try:
        for rate in rates:
            for part in parts:
                try:
                    if part in ("kafka", "kafka-fsync", "delta-kafka") and broker is None:
                        continue
                    if part in ("kafka", "kafka-fsync"):
                        result = kafka_variant(spark, broker, rate, args, out, jvm_pid, part)
                    else:
                        hook = serve if part == "serve" else None
                        result = delta_variant(spark, part, rate, args, out, jvm_pid, hook, broker)
                except Exception as exc:  # a refused variant is reported, the run goes on
                    message = str(exc).strip().splitlines()[0][:400] if str(exc) else repr(exc)
                    print(f"| {NAMES[part]} | {rate} | unavailable: {message} |", flush=True)
                    result = {"variant": NAMES[part], "rate": rate, "unavailable": message}
                finally:
                    serve.close()
                    for query in spark.streams.active:
                        query.stop()
                results.append(result)
    finally:
        spark.stop()  # before the broker: Spark's cached Kafka producers would retry it
        if broker is not None:
            broker.close()
    result = {
        "seconds": args.seconds,
        "warmup_seconds": args.warmup,
        "rates": rates,
        "realtime_trigger": REALTIME,
        "anchor": anchor,
        "results": results,
    }
    save_result("realtime", result)
    return result


if __name__ == "__main__":
    main()
