"""Issue 29 research probe: Hadoop's S3A against SeaweedFS in one short Spark session.

Not a test (not collected, not in ``make test``): run by hand and read its output, see
``docs/notes/s3a-research.md``::

    PYTHONPATH=src python -m tests._s3a_probe

S3A's jars come from Maven Central through ``spark.jars.packages`` (Spark's own Ivy) into
``~/.cache/deltaflow/jars/ivy``: ``hadoop-aws`` matching the wheel's Hadoop, with the AWS
SDK ``bundle`` (686 MB) excluded and the few SDK modules S3A uses named instead; the
jars pyspark already ships (netty, httpclient, commons-*, slf4j) are excluded too.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltaflow.testing._seaweedfs import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    plan_environment,
    start_seaweedfs,
)

# The AWS SDK v2 version hadoop-project 3.5.0 pins (aws-java-sdk-v2.version).
SDK_VERSION = "2.35.4"
# What pyspark's jars/ already has, or S3A does not need in this setup.
EXCLUDES = (
    "software.amazon.awssdk:bundle",
    "io.netty:netty-common",
    "io.netty:netty-buffer",
    "io.netty:netty-codec",
    "io.netty:netty-codec-http",
    "io.netty:netty-codec-http2",
    "io.netty:netty-handler",
    "io.netty:netty-resolver",
    "io.netty:netty-transport",
    "io.netty:netty-transport-classes-epoll",
    "io.netty:netty-transport-native-unix-common",
    "org.apache.httpcomponents:httpclient",
    "org.apache.httpcomponents:httpcore",
    "commons-codec:commons-codec",
    "commons-logging:commons-logging",
    "org.slf4j:slf4j-api",
    "org.wildfly.openssl:wildfly-openssl",
)


def cache_dir() -> Path:
    path = Path.home() / ".cache" / "deltaflow" / "jars" / "ivy"
    path.mkdir(parents=True, exist_ok=True)
    return path


def hadoop_version() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not found:
        raise RuntimeError(f"no hadoop-client-api jar in {jars}")
    match = re.search(r"hadoop-client-api-(.+)\.jar$", found[-1].name)
    assert match is not None
    return match.group(1)


def s3a_conf(endpoint: str) -> dict[str, str]:
    """The S3A jars (through Ivy) and ``fs.s3a.*`` for a path-style, plain-HTTP endpoint."""
    packages = [
        f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
        f"software.amazon.awssdk:s3:{SDK_VERSION}",
        f"software.amazon.awssdk:sts:{SDK_VERSION}",
        f"software.amazon.awssdk:s3-transfer-manager:{SDK_VERSION}",
    ]
    hadoop = {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": REGION,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": ACCESS_KEY,
        "fs.s3a.secret.key": SECRET_KEY,
        "fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
        # s3:// mapped to S3A, as EMR's users write it
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    return {
        "spark.jars.packages": ",".join(packages),
        "spark.jars.excludes": ",".join(EXCLUDES),
        "spark.jars.ivy": str(cache_dir()),
        **{f"spark.hadoop.{k}": v for k, v in hadoop.items()},
    }


def step(name: str, action: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        result = action()
    except Exception as exc:  # a probe: report and go on
        text = str(exc).splitlines()[0][:400] if str(exc) else type(exc).__name__
        print(f"[FAIL] {name} ({time.monotonic() - started:.1f} s): {type(exc).__name__}: {text}")
        return None
    print(f"[ OK ] {name} ({time.monotonic() - started:.1f} s): {result}")
    return result


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(0.5)


def main() -> int:
    from pyspark.sql import SparkSession

    from deltaflow import spark_conf

    plan_environment()  # AWS_* for delta-rs and the brain, before the JVM starts
    with tempfile.TemporaryDirectory() as tmp, start_seaweedfs(Path(tmp)) as store:
        base = f"s3a://{store.bucket}/probe"
        builder = SparkSession.builder.master("local[2]").appName("s3a-probe")
        conf = {**spark_conf(warehouse=str(Path(tmp) / "wh")), **s3a_conf(store.endpoint)}
        for key, value in conf.items():
            builder = builder.config(key, value)
        started = time.monotonic()
        spark = builder.getOrCreate()
        print(f"session (with Ivy resolution) {time.monotonic() - started:.1f} s")
        try:
            probe(spark, base, store.bucket)
        finally:
            spark.stop()
    return 0


def probe(spark: Any, base: str, bucket: str) -> None:
    jvm = spark._jvm
    hconf = spark._jsc.hadoopConfiguration()

    def fs_class(uri: str) -> str:
        path = jvm.org.apache.hadoop.fs.Path(uri)
        return str(path.getFileSystem(hconf).getClass().getName())

    step("FileSystem for s3a://", lambda: fs_class(base))
    step("FileSystem for s3:// (fs.s3.impl)", lambda: fs_class(f"s3://{bucket}/probe"))
    step("parquet write s3a://", lambda: spark.range(1000).write.parquet(f"{base}/pq"))
    step("parquet read s3a://", lambda: spark.read.parquet(f"{base}/pq").count())

    def delta(uri: str) -> str:
        spark.range(100).write.format("delta").save(uri)
        spark.range(100, 150).write.format("delta").mode("append").save(uri)
        df = spark.read.format("delta").load(uri)
        n = df.count()
        plan = df._jdf.queryExecution().executedPlan().toString()
        print(f"--- plan of the Delta read of {uri}:\n{plan}")
        print(f"--- files: {files(uri)}")
        return f"rows={n}"

    def files(uri: str) -> list[str]:
        path = jvm.org.apache.hadoop.fs.Path(uri)
        fs = path.getFileSystem(hconf)
        it = fs.listFiles(path, True)
        found = []
        while it.hasNext():
            status = it.next()
            found.append(f"{status.getPath().getName()} ({status.getLen()} B)")
        return sorted(found)

    step("delta write+read s3a://", lambda: delta(f"{base}/delta"))
    step("delta write+read s3://", lambda: delta(f"s3://{bucket}/probe/delta-s3"))
    step(
        "delta on a local path (for the plan's shape)",
        lambda: delta(tempfile.mkdtemp(prefix="s3a-probe-local-")),
    )

    def dml(uri: str) -> str:
        spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 10")
        spark.sql(f"UPDATE delta.`{uri}` SET id = id + 1000 WHERE id >= 140")
        rows = spark.read.format("delta").load(uri).selectExpr("count(*)", "max(id)").first()
        return f"count={rows[0]} max={rows[1]}"

    step("DELETE + UPDATE on s3a://", lambda: dml(f"{base}/delta"))

    def delta_stream() -> str:
        target = f"{base}/delta-copy"
        query = (
            spark.readStream.format("delta")
            .load(f"{base}/delta")
            .writeStream.format("delta")
            .option("checkpointLocation", f"{base}/ckpt-delta")
            .trigger(availableNow=True)
            .start(target)
        )
        query.awaitTermination(180)
        return f"copied rows={spark.read.format('delta').load(target).count()}"

    step("Delta -> Delta availableNow, s3a table + checkpoint", delta_stream)

    def stream(run: int) -> str:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 5)
            .load()
            .writeStream.format("console")
            .option("numRows", 2)
            .option("checkpointLocation", f"{base}/ckpt")
            .trigger(processingTime="1 second")
            .start()
        )
        try:
            wait_for(lambda: len(query.recentProgress) >= 3, 120, "three batches")
            ids = [p["batchId"] for p in query.recentProgress]
            return f"run {run}: batchIds {ids}"
        finally:
            query.stop()

    step("rate -> console, checkpoint on s3a (run 1)", lambda: stream(1))
    step("same checkpoint again (run 2 resumes)", lambda: stream(2))

    def listing() -> str:
        path = jvm.org.apache.hadoop.fs.Path(f"{base}/ckpt")
        fs = path.getFileSystem(hconf)
        it = fs.listFiles(path, True)
        names = []
        while it.hasNext():
            names.append(str(it.next().getPath()).split("/ckpt/", 1)[1])
        return f"{len(names)} files: {sorted(names)[:12]}"

    step("checkpoint files on s3a", listing)
    step(
        "checkpoint file manager class",
        lambda: str(
            jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
                jvm.org.apache.hadoop.fs.Path(f"{base}/ckpt"), hconf
            )
            .getClass()
            .getName()
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
