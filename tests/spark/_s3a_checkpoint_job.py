"""Run by test_s3a_checkpoints.py: a classic Spark driver with S3A on its class path
(``DELTAFLOW_JOB_CONF``: the S3A jars and ``fs.s3a.*``, see ``tests/_s3a.py``).

``manager <s3a dir> <local dir>`` drives deltaflow's checkpoint manager through py4j and
prints one ``RESULT <json>`` line of what it saw (the test reads the objects back with its
own S3 client). ``stream <source> <sink> <checkpoint> <loop|once>`` runs a Delta -> Delta
stream: ``loop`` triggers every 300 ms until killed, printing ``PROGRESS <batchId>`` after
each batch and ``FAILED fenced|other <message>`` if the query fails; ``once`` runs availableNow and
prints ``DONE <last batchId>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, NoReturn

from pyspark.errors import StreamingQueryException

import deltaflow

MANAGER_CLASS = "org.apache.spark.sql.deltaflow.DeltaflowCheckpointFileManager"


def job_session() -> Any:
    conf = {
        "spark.sql.shuffle.partitions": "1",
        "spark.ui.enabled": "false",
        **json.loads(os.environ.get("DELTAFLOW_JOB_CONF", "{}")),
    }
    return deltaflow.session(app_name="s3a-checkpoints", master="local[1]", conf=conf)


def java_error(call: Any) -> str | None:
    """The Java class name of what ``call()`` raised through py4j, None if nothing."""
    from py4j.protocol import Py4JJavaError

    try:
        call()
    except Py4JJavaError as failure:
        return str(failure.java_exception.getClass().getName())
    return None


def run_manager(s3a_dir: str, local_dir: str) -> None:
    spark = job_session()
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    path = jvm.org.apache.hadoop.fs.Path
    found: dict[str, Any] = {
        "configured": conf.get("spark.sql.streaming.checkpointFileManagerClass"),
    }
    manager = jvm.org.apache.spark.sql.deltaflow.DeltaflowCheckpointFileManager(path(s3a_dir), conf)

    # Two put-if-absent writes of one file, closed in turn: the first wins.
    race = path(s3a_dir + "/offsets/0")
    first, second = manager.createAtomic(race, False), manager.createAtomic(race, False)
    first.write(bytearray(b"first writer"))
    second.write(bytearray(b"second writer"))
    found["stream_class"] = first.getClass().getName()
    found["first_close"] = java_error(first.close)
    found["second_close"] = java_error(second.close)
    found["second_cancel"] = java_error(second.cancel)  # what HDFSMetadataLog does next

    # The same bytes again (an upload S3A retried after its answer was lost): no error.
    again = manager.createAtomic(race, False)
    again.write(bytearray(b"first writer"))
    found["same_bytes_close"] = java_error(again.close)

    # A cancelled write publishes nothing, new or over an existing file.
    cancelled = manager.createAtomic(path(s3a_dir + "/offsets/1"), False)
    cancelled.write(bytearray(b"never"))
    cancelled.cancel()
    found["cancelled_exists"] = bool(manager.exists(path(s3a_dir + "/offsets/1")))

    # overwriteIfPossible=true (state files) replaces; a cancelled overwrite keeps the old.
    state = path(s3a_dir + "/state/0/0/1.delta")
    for content in (b"state v1", b"state v2"):
        out = manager.createAtomic(state, True)
        out.write(bytearray(content))
        out.close()
    dropped = manager.createAtomic(state, True)
    dropped.write(bytearray(b"state v3"))
    dropped.cancel()

    # The store's conditional create switched off: Spark's rename path, still atomic.
    off = jvm.org.apache.hadoop.conf.Configuration(conf)
    off.set("fs.s3a.create.conditional.enabled", "false")
    off.set("fs.s3a.impl.disable.cache", "true")
    fallback = jvm.org.apache.spark.sql.deltaflow.DeltaflowCheckpointFileManager(path(s3a_dir), off)
    fallback.mkdirs(path(s3a_dir + "/commits"))  # as HDFSMetadataLog does: a rename needs it
    out = fallback.createAtomic(path(s3a_dir + "/commits/0"), False)
    out.write(bytearray(b"renamed"))
    found["fallback_stream_class"] = out.getClass().getName()
    found["fallback_close"] = java_error(out.close)

    # A local path: Spark's own temp file and rename, visible before close.
    local = jvm.org.apache.spark.sql.deltaflow.DeltaflowCheckpointFileManager(path(local_dir), conf)
    out = local.createAtomic(path(local_dir + "/offsets/0"), False)
    out.write(bytearray(b"local"))
    found["local_stream_class"] = out.getClass().getName()
    found["local_before_close"] = sorted(os.listdir(os.path.join(local_dir, "offsets")))
    out.close()
    twice = local.createAtomic(path(local_dir + "/offsets/0"), False)
    twice.write(bytearray(b"other"))
    found["local_second_close"] = java_error(twice.close)
    print("RESULT " + json.dumps(found), flush=True)
    spark.stop()


def run_stream(source: str, sink: str, checkpoint: str, mode: str) -> None:
    spark = job_session()
    writer = (
        spark.readStream.format("delta")
        .load(source)
        .selectExpr("id", "k")
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "once":
        query = writer.trigger(availableNow=True).start(sink)
        query.awaitTermination()
        if query.exception() is not None:
            raise query.exception()
        progress = query.lastProgress
        print(f"DONE {progress['batchId'] if progress else -1}", flush=True)
        spark.stop()
        return
    try:
        query = writer.trigger(processingTime="300 milliseconds").start(sink)
    except Exception as error:  # a second query on the checkpoint can lose at start
        fail(error)
    print("STARTED", flush=True)
    seen = None
    while True:  # killed by the test
        if query.exception() is not None:
            fail(query.exception())
        progress = query.lastProgress
        if progress and progress["batchId"] != seen:
            seen = progress["batchId"]
            print(f"PROGRESS {seen} {progress['numInputRows']}", flush=True)
        with contextlib.suppress(StreamingQueryException):
            query.awaitTermination(0.1)


# Spark's two ways to report a second query on a checkpoint: its log's existence check
# (CONCURRENT_STREAM_LOG_UPDATE) or a lost put-if-absent (HDFSMetadataLog.write's
# "Multiple streaming queries are concurrently using <path>", _LEGACY_ERROR_TEMP_2207).
FENCED = ("CONCURRENT_STREAM_LOG_UPDATE", "Multiple streaming queries are concurrently using")


def fail(error: BaseException) -> NoReturn:
    text = str(error)
    kind = "fenced" if any(marker in text for marker in FENCED) else "other"
    print(f"FAILED {kind} {text.strip().splitlines()[0] if text.strip() else ''}", flush=True)
    print(f"query failed: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "manager":
        run_manager(sys.argv[2], sys.argv[3])
    else:
        run_stream(*sys.argv[2:6])
