"""A single-node Kafka broker (KRaft) and Spark's Kafka connector, from Maven Central, on demand.

The anchor of the real-time benchmark (``bench/bench_realtime.py``) and its test
(``tests/reference/test_kafka_anchor.py``): Spark's own real-time mode on Kafka -> Kafka. Neither
the broker nor the connector is part of deltaflow; they live only here.

Jars are resolved by ``tests/_maven.py`` (the Ivy that pyspark ships) into the reference
harness's Ivy cache (``~/.cache/deltaflow/reference/ivy``,
:func:`tests.reference._env.cache_root`); the resolved class paths are recorded in
``kafka-*.json`` beside it, so later runs start without touching the network. Maven Central
is the only registry reached; when it cannot be reached,
:class:`tests.reference._env.ReferenceUnavailable` says so (tests skip on it).

The connector is taken at pyspark's own version when Maven Central serves it, else at the
newest Spark release it serves (``CONNECTOR_FALLBACK``): pyspark 4.3.0's Spark artifacts are
not on Maven Central yet, and the 4.2.0 connector runs on 4.3.0 (the test proves it). Jars
pyspark already ships (Scala, Hadoop, slf4j, compression codecs) are left out of the
connector's class path.

Entry points: :func:`broker_classpath`, :func:`connector_jars`, :func:`spark_kafka_conf`,
:class:`KafkaBroker`, :func:`start_rtm_copy` (the anchor's query). ``python -m
tests.reference._kafka BOOTSTRAP SOURCE TARGET CHECKPOINT`` runs that query in a Spark of its
own until its standard input closes (tests share one Spark session per worker, which has no
Kafka connector on its class path).
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests import _maven
from tests.reference._env import cache_root

BROKER_VERSION = "4.1.1"  # org.apache.kafka:kafka_2.13 (KRaft only since 4.0)
CONNECTOR_FALLBACK = "4.2.0"  # the newest spark-sql-kafka-0-10_2.13 Maven Central serves
_RESOLVE_TIMEOUT = 600.0


def _resolve(org: str, module: str, version: str) -> list[Path] | None:
    """The class path of ``org:module:version`` (its default conf), resolved by Ivy from
    Maven Central into the shared cache; None when Maven Central does not have it."""
    return _maven.resolve(f"kafka-{module}-{version}", [f"{org}:{module}:{version}"], cache_root())


def broker_classpath() -> list[Path]:
    """kafka_2.13 and everything it needs: a broker runs from these in its own JVM."""
    jars = _resolve("org.apache.kafka", "kafka_2.13", BROKER_VERSION)
    if jars is None:
        raise RuntimeError(f"Maven Central has no org.apache.kafka:kafka_2.13:{BROKER_VERSION}")
    return jars


def connector_jars() -> tuple[str, list[Path]]:
    """(the connector's version, its jars beyond what pyspark ships) for ``spark.jars``."""
    import pyspark

    shipped = {_maven.artifact(j) for j in _maven.pyspark_jars().glob("*.jar")}
    for version in dict.fromkeys((pyspark.__version__, CONNECTOR_FALLBACK)):
        jars = _resolve("org.apache.spark", "spark-sql-kafka-0-10_2.13", version)
        if jars is not None:
            return version, [j for j in jars if _maven.artifact(j) not in shipped]
    raise RuntimeError(
        f"Maven Central has spark-sql-kafka-0-10_2.13 neither at {pyspark.__version__} "
        f"nor at {CONNECTOR_FALLBACK}"
    )


def spark_kafka_conf() -> dict[str, str]:
    """The session settings that put Spark's Kafka connector on the class path."""
    return {"spark.jars": ",".join(str(j) for j in connector_jars()[1])}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class KafkaBroker:
    """One KRaft broker+controller on 127.0.0.1 (free ports), its data under ``root``.

    ``bootstrap`` is the address clients use; :meth:`create_topics` makes single-partition
    topics; :meth:`close` stops the JVM (also on ``with`` exit). ``pid`` is the broker JVM's
    process id (for its CPU time)."""

    def __init__(self, root: Path, heap: str = "512m", start_timeout: float = 120.0) -> None:
        classpath = os.pathsep.join(str(j) for j in broker_classpath())
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        port, controller = _free_port(), _free_port()
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        properties = root / "server.properties"
        properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{controller}",
                    f"listeners=PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{controller}",
                    f"advertised.listeners=PLAINTEXT://{self.bootstrap}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={root / 'data'}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "",
                ]
            )
        )
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        java = ["java", f"-Xmx{heap}", "-cp", classpath]
        done = subprocess.run(
            [*java, "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(properties)],
            capture_output=True,
            text=True,
            timeout=start_timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"formatting the Kafka storage failed:\n{done.stderr[-3000:]}")
        self.log = open(root / "broker.log", "w")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [*java, "kafka.Kafka", str(properties)], stdout=self.log, stderr=subprocess.STDOUT
        )
        self.pid = self.process.pid
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = None
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Kafka broker exited ({self.process.returncode}):"
                    f" {(self.root / 'broker.log').read_text()[-3000:]}"
                )
            try:
                if admin is None:  # a client only once the port listens: no retry noise
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    admin = AdminClient({"bootstrap.servers": self.bootstrap})
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # not up yet: the broker's own error is in broker.log
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Kafka broker was not up within {timeout:.0f} s")
            time.sleep(0.2)

    def create_topics(
        self, *names: str, config: dict[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        """Single-partition topics; ``config``: topic settings (``flush.messages=1``
        makes the broker fsync each append before it acknowledges)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(n, num_partitions=1, config=dict(config or {})) for n in names]
        )
        for future in futures.values():
            future.result(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()

    def __enter__(self) -> KafkaBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_rtm_copy(
    spark: Any, bootstrap: str, source: str, target: str, checkpoint: str, interval: str
) -> Any:
    """Spark's real-time mode on Kafka -> Kafka: topic ``source`` to topic ``target``, a
    stateless projection (key and value as they are, a null value dropped), from the earliest
    offset, ``trigger(realTime=interval)`` (the long-running tasks' checkpoint interval)."""
    return _to_kafka(
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .where("value IS NOT NULL")
        .select("key", "value"),
        bootstrap,
        target,
        checkpoint,
        interval,
    )


def start_rtm_delta_to_kafka(
    spark: Any, table: str, bootstrap: str, target: str, checkpoint: str, interval: str
) -> Any:
    """deltaflow's real-time Delta source into Spark's Kafka sink: every row of the Delta
    table at path ``table`` (column ``id``) to topic ``target`` as its value, from the
    table's first version."""
    return _to_kafka(
        spark.readStream.format("delta").load(table).selectExpr("CAST(id AS STRING) AS value"),
        bootstrap,
        target,
        checkpoint,
        interval,
    )


def _to_kafka(rows: Any, bootstrap: str, target: str, checkpoint: str, interval: str) -> Any:
    """``rows`` (a ``value`` column, maybe a ``key``) into topic ``target`` by Spark's
    Kafka sink in real-time mode, started."""
    return (
        rows.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", target)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .trigger(realTime=interval)
        .start()
    )


def _main(bootstrap: str, source: str, target: str, checkpoint: str) -> int:
    """Copy topic ``source`` to topic ``target`` in real-time mode, or, when ``source`` is
    a path (``/...``), the Delta table there through deltaflow's session."""
    from pyspark.sql import SparkSession

    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.jars": spark_kafka_conf()["spark.jars"],
    }
    from_delta = source.startswith("/")
    if from_delta:
        import deltaflow

        spark = deltaflow.session(app_name="deltaflow-delta-to-kafka", conf=conf)
    else:
        builder = SparkSession.builder.master("local[2]").appName("deltaflow-kafka-anchor")
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if from_delta:
        query = start_rtm_delta_to_kafka(spark, source, bootstrap, target, checkpoint, "5 minutes")
    else:
        query = start_rtm_copy(spark, bootstrap, source, target, checkpoint, "5 minutes")
    print("STARTED", flush=True)
    sys.stdin.read()  # until the caller closes our standard input
    failure = query.exception()
    query.stop()
    spark.stop()
    if failure is not None:
        print(f"FAILED {failure}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:5]))
