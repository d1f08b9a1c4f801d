"""Event sources and visibility probes for ``bench_realtime.py``.

Every event has a unique ``id`` and a creation time (this machine's wall clock, seconds):
for Kafka the moment it was due on the rate's schedule (stamped into the event by the
producer's own process), for a Delta writer the moment its commit file appeared (seen by
a stat loop of the writer's own while its commit call runs, else the call's return; the
return and the file's modification time are kept beside it as ``returned`` and
``landed``), for ``deltaflow serve`` the moment it was due
(rate schedule; a request waiting on the previous acknowledgement delays it, as a real
client would be). A probe records when each id became visible downstream; latency = seen -
created, per event.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live descendant (``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(cpu.get(pid, 0.0) for pid in tree)


class Paced(threading.Thread):
    """Calls ``emit(first_id, count)`` so that ``rate`` events/s go out, in ticks of
    ``tick_s``; ``created[id]`` is filled by ``emit``."""

    def __init__(self, rate: int, tick_s: float) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.tick_s = tick_s
        self.created: dict[int, float] = {}
        self.sent = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def emit(self, first: int, count: int) -> None:
        raise NotImplementedError

    def run(self) -> None:
        started = time.monotonic()
        try:
            while not self.stop_event.is_set():
                due = int((time.monotonic() - started) * self.rate) - self.sent
                if due > 0:
                    self.emit(self.sent, due)
                    self.sent += due
                self.stop_event.wait(self.tick_s)
        except BaseException as exc:  # reported by the variant, never silently lost
            self.error = exc


class ChildProducer(threading.Thread):
    """Runs an event source script in its own process (a Python producer sharing this
    process's GIL with the probe and py4j sent only ~2,000 events/s of 10,000, and the
    backlog made the anchor's p99 seconds): the child stamps each event's creation time
    into the event and reports how many it sent (``SENT <n>``); the probe reads the stamps
    into ``created`` (``measure`` reads both through this object, as for the other
    sources)."""

    script = ""

    def __init__(self, args: list[str], created: dict[int, float]) -> None:
        super().__init__(daemon=True)
        self.args = args
        self.created = created
        self.sent = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        script = Path(__file__).with_name(self.script)
        child = subprocess.Popen(
            [sys.executable, str(script), *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        try:
            lines = iter(child.stdout.readline, "")
            while not self.stop_event.is_set():
                line = next(lines, "")
                if not line:
                    raise RuntimeError(f"the producer exited (rc={child.wait(10)})")
                self.sent = int(line.split()[1])
            child.stdin.close()  # the child flushes and reports its last count
            for line in lines:
                self.sent = int(line.split()[1])
            child.wait(60)
        except BaseException as exc:  # reported by the variant, never silently lost
            self.error = exc
            child.kill()


class KafkaProducer(ChildProducer):
    """``bench/_kafka_producer.py``: each value ``<id> <creation time>``."""

    script = "_kafka_producer.py"

    def __init__(self, bootstrap: str, topic: str, rate: int, probe: KafkaProbe) -> None:
        super().__init__([bootstrap, topic, str(rate)], probe.created)


class RowLogProducer(ChildProducer):
    """``bench/_rowlog_producer.py``: appends events to the source table's row log and
    commits them every second; each row's ``ts`` is when it was due."""

    script = "_rowlog_producer.py"

    def __init__(self, path: str, rate: int, app_id: str, probe: RowLogProbe) -> None:
        super().__init__([path, str(rate), app_id], probe.created)


class RowLogProbe(threading.Thread):
    """Tails every writer's partition of a table's row log (``docs/notes/rowlog.md``) from
    its start, every ``poll_s``: reads what their frames added and stamps each id with the
    time the read ended (new writers' directories are looked for every 50 ms). ``created``
    comes from the rows' ``ts`` (ns, when each event was due)."""

    def __init__(self, path: str, poll_s: float = 0.0005) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.poll_s = poll_s
        self.seen_at: dict[int, float] = {}
        self.created: dict[int, float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        from deltaflow.table import _rowlog

        root = Path(self.path, _rowlog.DIRECTORY)
        tails: dict[Path, Any] = {}
        listed = 0.0
        while not self.stop_event.is_set():
            if time.monotonic() - listed > 0.05:  # new writers and partitions
                listed = time.monotonic()
                for partition in root.glob("*/p*"):
                    if partition not in tails:
                        tails[partition] = _rowlog.PartitionTail(
                            str(partition), _rowlog.Position(0, 0)
                        )
            for tail in tails.values():
                batches = tail.poll()
                seen = time.time()  # after the read: never earlier than the rows were there
                for batch in batches:
                    ids, stamps = batch.column("id").to_pylist(), batch.column("ts").to_pylist()
                    for event, ts in zip(ids, stamps, strict=True):
                        self.seen_at.setdefault(event, seen)
                        self.created.setdefault(event, ts / 1e9)
            self.stop_event.wait(self.poll_s)


class KafkaProbe(threading.Thread):
    """Consumes a topic in batches; each value is ``<id>``, or ``<id> <creation time>``
    from ``KafkaProducer`` (whose clock is this machine's)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.seen_at: dict[int, float] = {}
        self.created: dict[int, float] = {}
        self.stop_event = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"probe-{topic}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe([topic])

    def run(self) -> None:
        while not self.stop_event.is_set():
            # Wait for one message, then take what else is queued without waiting:
            # consume(n, timeout) alone waits until n arrive or the timeout passes, which
            # would add up to the timeout to every event's latency.
            first = self.consumer.poll(0.05)
            now = time.time()
            if first is None:
                continue
            messages = [first, *self.consumer.consume(num_messages=10_000, timeout=0)]
            for message in messages:
                if message.error() is None:
                    event, *created = message.value().split()
                    if created:
                        self.created.setdefault(int(event), float(created[0]))
                    self.seen_at.setdefault(int(event), now)
        self.consumer.close()


SOURCE_SCHEMA = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("ts", pa.int64())])


class DeltaWriter(Paced):
    """Appends the due events to a Delta table with delta-rs, one commit per tick.

    An event's creation time (``created``) is when its commit file appeared, on this
    process's wall clock: a thread stats ``_delta_log/<v>.json`` every
    ``FIRST_SIGHT_POLL_S`` while ``write_deltalake`` runs (delta-rs releases the GIL), so
    the start is exact to the poll. When the loop did not see the file before the call
    returned, the return is the start: the commit is visible no later than that. Both
    other clocks are kept: ``returned`` (the call's return, read right after it: p50 7-21
    ms after the file appears, delta-rs working on after the put) and ``landed`` (the
    file's modification time: the kernel's coarse clock puts it up to one tick early).
    The table is created empty at version 0, so the writer's n-th commit is version n."""

    def __init__(self, path: str, rate: int, tick_s: float = 0.05) -> None:
        super().__init__(rate, tick_s)
        self.path = path
        self.version = 0
        self.returned: dict[int, float] = {}
        self.landed: dict[int, float] = {}

    def emit(self, first: int, count: int) -> None:
        from deltalake import write_deltalake

        ids = range(first, first + count)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "kind": pa.array(["click"] * count),
                "ts": pa.array([time.time_ns()] * count, pa.int64()),
            },
            schema=SOURCE_SCHEMA,
        )
        self.version += 1
        entry = Path(self.path, "_delta_log", f"{self.version:020d}.json")
        sight = FirstSight(entry)
        sight.start()
        write_deltalake(self.path, table, mode="append")
        returned = time.time()
        appeared = sight.finish(returned)
        mtime = entry.stat().st_mtime_ns / 1e9
        for event in ids:
            self.created[event] = appeared
            self.returned[event] = returned
            self.landed[event] = mtime


# How often a Delta writer's own loop stats the commit file its call is writing: the start
# clock's resolution, at ~2,000 stats/s for the ~half of each 50 ms tick a commit takes.
FIRST_SIGHT_POLL_S = 0.0005


class FirstSight(threading.Thread):
    """Stats ``entry`` every ``FIRST_SIGHT_POLL_S`` until it exists (``seen``: when) or
    ``finish`` is called."""

    def __init__(self, entry: Path) -> None:
        super().__init__(daemon=True)
        self.entry = entry
        self.seen: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if os.path.exists(self.entry):
                self.seen = time.time()
                return
            self.done.wait(FIRST_SIGHT_POLL_S)

    def finish(self, returned: float) -> float:
        """When the file appeared: the loop's sight, or ``returned`` when it saw none."""
        self.done.set()
        self.join()
        return returned if self.seen is None else min(self.seen, returned)


class ServePoster(Paced):
    """POSTs the due events as NDJSON to ``deltaflow serve`` (durable acknowledgement), one
    request per tick on one keep-alive connection."""

    def __init__(self, port: int, table: str, token: str, rate: int, tick_s: float = 0.01):
        super().__init__(rate, tick_s)
        import http.client

        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.url = f"/v1/tables/{table}/events"
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
        self.started = time.monotonic()
        self.wall_offset = time.time() - time.monotonic()

    def emit(self, first: int, count: int) -> None:
        body = "\n".join(
            json.dumps({"id": event, "kind": "click", "ts": time.time_ns()})
            for event in range(first, first + count)
        )
        for event in range(first, first + count):  # when it was due, by the rate schedule
            self.created[event] = self.wall_offset + self.started + (event + 1) / self.rate
        self.connection.request("POST", self.url, body.encode(), self.headers)
        response = self.connection.getresponse()
        text = response.read()
        if response.status != 200:
            raise RuntimeError(f"serve answered {response.status}: {text[:300]!r}")

    def run(self) -> None:
        self.started = time.monotonic()
        self.wall_offset = time.time() - self.started
        super().run()


class DeltaProbe(threading.Thread):
    """Tails a Delta table's ``_delta_log``: every 2 ms one ``stat`` for the next commit
    file; when it appears, the time is taken first, then the ids of its added files are read
    (Parquet, the ``id`` column only)."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = Path(path)
        self.seen_at: dict[int, float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        import pyarrow.parquet as pq

        version = 0
        while not self.stop_event.is_set():
            entry = self.path / "_delta_log" / f"{version:020d}.json"
            try:
                text = entry.read_text()
            except FileNotFoundError:
                time.sleep(0.002)
                continue
            seen = time.time()
            for line in text.splitlines():
                action = json.loads(line)
                add = action.get("add")
                if add is None or not add.get("dataChange", True):
                    continue
                file = urlparse(add["path"])
                local = unquote(file.path) if file.scheme else self.path / unquote(add["path"])
                ids = pq.read_table(local, columns=["id"])
                for event in ids.column("id").to_pylist():
                    self.seen_at.setdefault(event, seen)
            version += 1


class ForeachProbe(threading.Thread):
    """Receives one UDP datagram per row (the row's id) from a foreach sink's writer."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = int(self.sock.getsockname()[1])
        self.seen_at: dict[int, float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                data = self.sock.recv(64)
            except TimeoutError:
                continue
            self.seen_at.setdefault(int(data), time.time())
        self.sock.close()


class UdpRowWriter:
    """A ``foreach`` writer: sends each row's id to the probe (runs in Spark's Python worker)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: Any = None

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        return True

    def process(self, row: Any) -> None:
        self.sock.sendto(str(row["id"]).encode(), ("127.0.0.1", self.port))

    def close(self, error: BaseException | None) -> None:
        if self.sock is not None:
            self.sock.close()
