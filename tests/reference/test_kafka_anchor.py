"""The real-time benchmark's anchor works: a Kafka broker from Maven Central and Spark's own
real-time mode copying topic A to topic B (``bench/bench_realtime.py`` measures it).

No timing is asserted: only that every event produced to A arrives in B, unchanged, once.
Skipped only when Maven Central cannot be reached (the first run fetches the broker's and the
connector's jars into ``~/.cache/deltaflow/reference/ivy``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._waiting import wait_until
from tests.reference import _env, _kafka

pytestmark = [pytest.mark.reference, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_kafka.KafkaBroker]:
    try:
        _kafka.broker_classpath()
        _kafka.connector_jars()
    except _env.ReferenceUnavailable as exc:
        pytest.skip(f"Kafka anchor unavailable: {exc}")
    with _kafka.KafkaBroker(tmp_path_factory.mktemp("kafka")) as running:
        yield running


def _consume(bootstrap: str, topic: str, want: int, timeout: float) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "anchor-test", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < want and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        # a little longer: a duplicate would arrive now
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


@contextlib.contextmanager
def _rtm_query(broker: _kafka.KafkaBroker, source: str, target: str, checkpoint: Path):
    """The RTM query of ``tests.reference._kafka`` in its own process, started; yields a
    function that returns its output so far; stops it (closing its stdin) on exit."""
    query = subprocess.Popen(
        [sys.executable, "-m", "tests.reference._kafka", broker.bootstrap, source, target,
         str(checkpoint)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(query.stdout or ()), daemon=True)
    reader.start()

    def text() -> str:
        return "".join(output)[-3000:]

    try:

        def started() -> bool:
            assert query.poll() is None, f"the RTM query's process exited: {text()}"
            return any(line.startswith("STARTED") for line in output)

        wait_until(started, 300, "the RTM query to start")
        yield text
        assert query.poll() is None, f"the RTM query died: {text()}"
    finally:
        if query.stdin is not None:
            query.stdin.close()
        try:
            query.wait(120)
        except subprocess.TimeoutExpired:
            query.kill()
            query.wait(10)
        reader.join(10)
    assert not any(line.startswith("FAILED") for line in output), text()


def _topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(60)
    return {name: entry.value for name, entry in entries.items()}


@pytest.mark.timeout(900)
def test_rtm_kafka_to_kafka_copies_every_event(broker: _kafka.KafkaBroker, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    broker.create_topics("a")
    # B as the benchmark's fsync anchor makes it: the broker fsyncs each append.
    broker.create_topics("b", config={"flush.messages": "1"})
    assert _topic_config(broker.bootstrap, "b")["flush.messages"] == "1"
    with _rtm_query(broker, "a", "b", tmp_path / "checkpoint") as output:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        sent = [f"event-{i}".encode() for i in range(300)]
        for value in sent:
            producer.produce("a", value=value)
            producer.poll(0)
            time.sleep(0.002)  # a trickle, as a real-time source sees it
        assert producer.flush(30) == 0
        received = _consume(broker.bootstrap, "b", len(sent), timeout=180)
        assert sorted(received) == sorted(sent), (
            f"{len(received)} of {len(sent)} events in B: {output()}"
        )


@pytest.mark.timeout(900)
def test_rtm_delta_source_into_kafka_sends_every_row_once(
    broker: _kafka.KafkaBroker, tmp_path: Path
) -> None:
    """deltaflow's real-time Delta source feeds Spark's own real-time Kafka sink: rows
    committed before the start and while it runs, each in B once."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "events"

    def commit(ids: range) -> None:
        write_deltalake(str(table), pa.table({"id": pa.array(ids, pa.int64())}), mode="append")

    commit(range(0, 50))
    broker.create_topics("from-delta")
    with _rtm_query(broker, str(table), "from-delta", tmp_path / "checkpoint") as output:
        for first in range(50, 300, 25):  # ten more commits while the query runs
            commit(range(first, first + 25))
        received = _consume(broker.bootstrap, "from-delta", 300, timeout=180)
        assert sorted(int(v) for v in received) == list(range(300)), (
            f"{len(received)} of 300 rows in the topic: {output()}"
        )
