"""Reader leases: what a running stream still needs from a table, for VACUUM to keep.

delta-spark protects a lagging stream only by VACUUM's retention: once a file was removed
longer ago than ``delta.deletedFileRetentionDuration`` (or a shorter ``RETAIN``), it goes,
and a stream whose next batch still reads it fails. deltaflow's stream source (the one
the JVM connector and the Python data source share) holds a lease instead:

``<table>/_delta_staging/_readers/<lease id>.json`` =
``{"version": v, "heartbeat": <ms since the epoch>, "reader": "...", ...}``

``v`` is the lowest table version the reader may still read (its next batch starts
there). VACUUM keeps every file some version ``>= v`` references
(:mod:`deltaflow.table._vacuum_guard`) while the lease is live: its heartbeat is younger
than the table's ``deltaflow.vacuum.readerLeaseTimeout`` (default one hour).

Crash safety and cost:

* A lease file is replaced whole (a rename locally, a single put on object stores), so a
  reader never sees half of one; a file that does not parse is ignored with a warning.
* The recorded version only ever errs low: a reader writes at once when the version it
  needs goes *down* (or on its first write), and raises it lazily, with the next
  heartbeat. Between heartbeats VACUUM keeps a little more than needed, never less; a
  micro-batch that moves the stream forward writes nothing.
* Heartbeats come from the reader's calls and from one daemon thread per process, every
  quarter of the timeout, so a long micro-batch keeps its lease too.
* A clean stop deletes the lease. A killed process leaves it, and it stops counting once
  its heartbeat is older than the timeout; the next real VACUUM deletes it.

A stopped query is not protected beyond that: its checkpoint alone holds no lease (a
query may never come back), as in delta-spark. Clock skew between the reader's and
VACUUM's machines must stay well below the timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.fs as pafs

from deltaflow.table import _uri

log = logging.getLogger(__name__)

LEASE_DIR = "_delta_staging/_readers"  # "_"-prefixed: VACUUM's staging cleanup skips it
TIMEOUT_PROPERTY = "deltaflow.vacuum.readerLeaseTimeout"
DEFAULT_TIMEOUT_SECONDS = 3600.0
# A heartbeat is rewritten once it is this fraction of the timeout old: three missed
# refreshes in a row before a live reader's lease lapses.
REFRESH_FRACTION = 0.25
# The heartbeat thread never sleeps longer than this, so a holder registered later with
# a short timeout is served in time.
_MAX_POLL_SECONDS = 30.0


@dataclass(frozen=True)
class ReaderLease:
    """One lease as VACUUM reads it."""

    lease_id: str
    version: int  # the lowest table version the reader may still read
    heartbeat_ms: int
    reader: str  # who holds it, for people: "stream over <uri> (pid 123 on host)"
    process: str = ""  # the holder's process, see _this_process()

    def age_seconds(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.heartbeat_ms / 1000

    def is_live(self, timeout_seconds: float, now: float | None = None) -> bool:
        return self.age_seconds(now) < timeout_seconds and not _ended_here(self.process)

    def describe(self, now: float | None = None) -> str:
        return (
            f"reader lease {self.lease_id} ({self.reader}, needs version {self.version},"
            f" heartbeat {self.age_seconds(now):.0f} s ago)"
        )


def timeout_seconds(configuration: Mapping[str, str | None]) -> float:
    """The table's ``deltaflow.vacuum.readerLeaseTimeout`` in seconds (an interval such as
    ``interval 30 minutes``; unset or unreadable: one hour)."""
    raw = next((v for k, v in configuration.items() if k.lower() == TIMEOUT_PROPERTY.lower()), None)
    seconds = interval_seconds(raw)
    if seconds is None:
        if raw is not None:
            log.warning(
                "%s=%r is not an interval such as 'interval 30 minutes'; using %g s",
                TIMEOUT_PROPERTY,
                raw,
                DEFAULT_TIMEOUT_SECONDS,
            )
        return DEFAULT_TIMEOUT_SECONDS
    return seconds


_UNITS = {
    "week": 604800.0,
    "day": 86400.0,
    "hour": 3600.0,
    "minute": 60.0,
    "min": 60.0,
    "second": 1.0,
    "sec": 1.0,
    "millisecond": 0.001,
    "ms": 0.001,
}


def interval_seconds(raw: str | None) -> float | None:
    """``[interval] <number> <unit>`` (Delta's table property style) in seconds."""
    match = re.fullmatch(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*", (raw or "").lower())
    if match is None:
        return None
    unit = match.group(2)
    per_unit = _UNITS.get(unit, _UNITS.get(unit.rstrip("s")))
    return None if per_unit is None else float(match.group(1)) * per_unit


# ---- reading (VACUUM) -----------------------------------------------------------------


def read_leases(table_uri: str) -> list[ReaderLease]:
    """Every lease file of the table, live or not."""
    fs, root = _uri.filesystem(_uri.join(table_uri, LEASE_DIR))
    selector = pafs.FileSelector(root, allow_not_found=True, recursive=False)
    leases = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue  # e.g. a temporary file of a write in progress
        try:
            with fs.open_input_stream(info.path) as handle:
                data = json.loads(handle.read())
            leases.append(
                ReaderLease(
                    lease_id=info.base_name.removesuffix(".json"),
                    version=int(data["version"]),
                    heartbeat_ms=int(data["heartbeat"]),
                    reader=str(data.get("reader", "")),
                    process=str(data.get("process", "")),
                )
            )
        except FileNotFoundError:
            continue  # released while we listed
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable reader lease %s: %s", info.path, exc)
    return leases


def live_leases(
    table_uri: str, timeout: float, now: float | None = None
) -> tuple[list[ReaderLease], list[ReaderLease]]:
    """The table's leases as (live, expired) under ``timeout`` seconds."""
    live: list[ReaderLease] = []
    expired: list[ReaderLease] = []
    for lease in read_leases(table_uri):
        (live if lease.is_live(timeout, now) else expired).append(lease)
    return live, expired


def delete_lease(table_uri: str, lease_id: str) -> None:
    fs, root = _uri.filesystem(_uri.join(table_uri, LEASE_DIR))
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(f"{root}/{lease_id}.json")


# ---- holding (stream sources) ---------------------------------------------------------


class LeaseHolder:
    """A running reader's lease on one table. :meth:`need` is cheap to call on every
    offset call: it writes only when the needed version goes down, the first time, or when
    the heartbeat is due."""

    def __init__(self, table_uri: str, timeout: float, reader: str) -> None:
        self.table_uri = table_uri
        self.timeout = timeout
        self.lease_id = uuid.uuid4().hex
        self.reader = f"{reader} (pid {os.getpid()} on {socket.gethostname()})"
        self._lock = threading.Lock()
        self._needed: int | None = None  # what the reader needs now
        self._written: int | None = None  # what the lease file says
        self._written_at = 0.0  # time.monotonic() of the last write
        self._released = False

    def need(self, version: int) -> None:
        """The reader may still read ``version`` and later ones (and nothing older)."""
        with self._lock:
            if self._released:
                return
            self._needed = version
            if self._written is None or version < self._written or self._heartbeat_due():
                self._write()

    def refresh(self) -> None:
        """Rewrite the heartbeat (with the current version) if it is due."""
        with self._lock:
            if not self._released and self._written is not None and self._heartbeat_due():
                self._write()

    def release(self) -> None:
        """The reader stopped cleanly: the lease goes, and VACUUM need keep nothing for it."""
        with self._lock:
            self._released = True
            if self._written is not None:
                try:
                    delete_lease(self.table_uri, self.lease_id)
                except Exception as exc:  # it expires by itself; the stop goes on
                    log.warning("could not delete reader lease %s: %s", self.lease_id, exc)
        _heartbeats.discard(self)

    def _heartbeat_due(self) -> bool:
        return time.monotonic() - self._written_at >= self.timeout * REFRESH_FRACTION

    def _write(self) -> None:
        assert self._needed is not None
        payload = {
            "version": self._needed,
            "heartbeat": int(time.time() * 1000),
            "reader": self.reader,
            "table": self.table_uri,
            "process": _this_process(),
        }
        try:
            _put(self.table_uri, self.lease_id, json.dumps(payload).encode())
        except Exception as exc:
            # Never fatal to the stream: the files stay protected by VACUUM's retention,
            # as with delta-spark; the next call tries again.
            log.warning("could not write reader lease on %s: %s", self.table_uri, exc)
            return
        first = self._written is None
        self._written, self._written_at = self._needed, time.monotonic()
        if first:
            _heartbeats.add(self)


def _put(table_uri: str, lease_id: str, payload: bytes) -> None:
    """Replace the lease file whole: readers see the old one or the new one."""
    uri = _uri.join(table_uri, f"{LEASE_DIR}/{lease_id}.json")
    if _uri.is_local(uri):
        final = _uri.local_path(uri)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        temp = f"{final}.{uuid.uuid4().hex}.tmp"
        with open(temp, "wb") as handle:
            handle.write(payload)
        os.replace(temp, final)
        return
    fs, path = _uri.filesystem(uri)
    with fs.open_output_stream(path) as handle:  # one put: object stores replace atomically
        handle.write(payload)


def _this_process() -> str:
    """This process, named so that another process on the same machine can tell whether
    it still runs: host, boot, PID namespace and PID ("" where that cannot be told)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux: leases expire by their timeout only
        return ""
    return f"{socket.gethostname()}|{boot}|{namespace}|{os.getpid()}"


def _ended_here(process: str) -> bool:
    """Whether ``process`` ran on this machine, in this PID namespace, and has ended.

    Spark ends a Python data source's stream worker without calling its ``stop()`` when
    the query stops, and a killed process never releases its lease: where VACUUM runs
    next to the reader it need not wait for the timeout. Anything uncertain (another
    machine or namespace, a PID reused by a new process) counts as running.
    """
    host, _, rest = process.partition("|")
    if not rest or host != socket.gethostname():
        return False
    mine = _this_process()
    if not mine or rest.rsplit("|", 1)[0] != mine.split("|", 1)[1].rsplit("|", 1)[0]:
        return False
    try:
        os.kill(int(rest.rsplit("|", 1)[1]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):  # e.g. another user's process: it exists
        return False
    return False


class _Heartbeats:
    """One daemon thread per process refreshing every registered holder's heartbeat."""

    def __init__(self) -> None:
        self._holders: weakref.WeakSet[LeaseHolder] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, holder: LeaseHolder) -> None:
        with self._lock:
            self._holders.add(holder)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="deltaflow-reader-leases", daemon=True
                )
                self._thread.start()
        self._wake.set()  # re-plan the sleep for this holder's timeout

    def discard(self, holder: LeaseHolder) -> None:
        with self._lock:
            self._holders.discard(holder)

    def _run(self) -> None:
        while True:
            with self._lock:
                holders = list(self._holders)
                if not holders:  # every reader stopped: the next add() starts a new thread
                    self._thread = None
                    return
            for holder in holders:
                try:
                    holder.refresh()
                except Exception as exc:  # never let one table stop the others' heartbeats
                    log.warning("reader lease heartbeat failed: %s", exc)
            pause = min([_MAX_POLL_SECONDS, *(h.timeout * REFRESH_FRACTION / 2 for h in holders)])
            self._wake.wait(max(pause, 0.05))
            self._wake.clear()


_heartbeats = _Heartbeats()
