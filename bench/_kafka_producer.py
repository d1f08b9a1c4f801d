"""The Kafka anchor's event source, in its own process (``bench/_realtime_probes.py``,
``KafkaProducer``): ``<bootstrap> <topic> <rate>`` sends events ``0, 1, ...`` at ``rate``
per second, each value ``<id> <creation time>`` (the wall-clock moment the event was
due on the rate's schedule), and prints ``SENT <n>`` every 50 ms; when stdin closes it
flushes, prints the last count and exits."""

from __future__ import annotations

import sys
import threading
import time

from confluent_kafka import Producer

TICK_S = 0.001
REPORT_S = 0.05
# Up to 1 ms of batching: with none, 10,000 events/s went out one request each and the
# single-node broker fell behind (the local queue filled in ~10 s on this 2-core box).
LINGER_MS = 1


def main(bootstrap: str, topic: str, rate: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS})
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    started, wall = time.monotonic(), time.time()
    reported, sent = started, 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            # Stamped with the moment the event was due, not when the producer took it: a
            # producer held back by a full queue shows as latency, as for a real client.
            value = f"{sent} {wall + sent / rate!r}".encode()
            try:
                producer.produce(topic, value=value)
            except BufferError:  # the local queue is full: wait for deliveries
                producer.poll(0.005)
                continue
            sent += 1
        producer.poll(0)
        if time.monotonic() - reported >= REPORT_S:
            print(f"SENT {sent}", flush=True)
            reported = time.monotonic()
        stop.wait(TICK_S)
    producer.flush(30)
    print(f"SENT {sent}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
