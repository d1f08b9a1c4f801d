"""Group commit with durable acknowledgement and idempotency keys, per table.

Delivery semantics (what a ``200`` means): every event of the request is in a Delta
commit of the table, and (``fsync``, local tables) the data files and the log entry
reached the disk. Requests that arrive while a commit runs are gathered into the next
group: one Parquet file per partition and **one** Delta commit per group, after which
all of the group's requests are answered.

Idempotency: a request's ``Idempotency-Key`` is recorded inside the commit that holds
its events (commitInfo field ``deltaflow.ingest``: group id plus ``[key, rows]`` pairs),
so "events committed" and "key remembered" are one atomic fact. The service keeps the
keys in memory (at most ``idempotency_max_keys`` per table, oldest forgotten first) and
re-reads them from the table's latest ``idempotency_recover_commits`` commits at
start-up. A retry of a remembered key is answered with the first attempt's result and
writes nothing; a retry while the first attempt is still in flight waits for it.
No Delta ``txn`` action per key: those stay in every checkpoint forever.

How a group becomes files and one commit (object stores, failed commits, schema changes
by other writers) is :mod:`._table_writer`'s part; this module is the event loop's: the
queue, the grouping by delay and size, and the key index.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from deltaflow.ingest.http._config import ServeConfig
from deltaflow.ingest.http._table_writer import TableWriter
from deltaflow.ingest.http.errors import IngestCommitError

log = logging.getLogger("deltaflow.serve")


@dataclass(frozen=True)
class Acknowledgement:
    version: int
    rows: int
    duplicate: bool = False


@dataclass
class _Pending:
    table: pa.Table
    key: str | None
    future: asyncio.Future[Acknowledgement]
    arrived: float
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.table.nbytes


class GroupCommitter:
    """The event-loop side: queue, grouping by delay/size, and the key index."""

    def __init__(
        self,
        writer: TableWriter,
        server: ServeConfig,
        on_commit: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.writer = writer
        self.name = writer.config.name
        self.max_delay = server.group_commit_max_delay_ms / 1000.0
        self.max_rows = max(server.group_commit_max_rows, 1)
        self.max_bytes = max(server.group_commit_max_bytes, 1)
        self.max_pending_bytes = server.max_pending_bytes
        self.max_keys = max(server.idempotency_max_keys, 0)
        self._on_commit = on_commit
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_rows = 0
        self.pending_bytes = 0
        self._wakeup = asyncio.Event()
        self._full = asyncio.Event()
        self._closing = False
        self._keys: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
        self._in_flight: dict[str, asyncio.Future[Acknowledgement]] = {}
        # One thread: commits of a table are sequential; the event loop keeps accepting.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, f"deltaflow-commit-{self.name}")
        self._task: asyncio.Task[None] | None = None
        self.healthy = True
        self._schema_checked = float("-inf")

    def remember(self, keys: list[tuple[str, int, int]]) -> None:
        for key, version, rows in keys:
            self._remember(key, version, rows)

    def _remember(self, key: str, version: int, rows: int) -> None:
        if self.max_keys == 0:
            return
        self._keys[key] = (version, rows)
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    @property
    def remembered_keys(self) -> int:
        return len(self._keys)

    def pending_bytes_now(self) -> float:
        return float(self.pending_bytes)

    def remembered_keys_now(self) -> float:
        return float(len(self._keys))

    def known(self, key: str) -> Acknowledgement | None:
        """The result a committed request with ``key`` had, if it is remembered."""
        found = self._keys.get(key)
        return None if found is None else Acknowledgement(found[0], found[1], duplicate=True)

    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def refresh_schema(self) -> bool:
        """The writer's :meth:`TableWriter.refresh_schema`, on its own thread; at most
        once a second, so a client that keeps sending a wrong field costs no log reads."""
        now = time.monotonic()
        if now - self._schema_checked < 1.0:
            return False
        self._schema_checked = now
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.writer.refresh_schema)
        except Exception as exc:  # the request is answered as it was; say why here
            log.warning("table %s: could not re-read its schema: %s", self.name, exc)
            return False

    def overloaded(self) -> bool:
        return self.pending_bytes >= self.max_pending_bytes

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, table: pa.Table, key: str | None) -> Acknowledgement:
        """Resolve once ``table`` is committed (or was, under ``key``); raises on failure."""
        if self._closing:
            raise IngestCommitError(
                f"table {self.name!r} is shutting down; retry against the restarted service",
                table=self.name,
                table_uri=self.writer.config.uri,
            )
        if key is not None:
            known = self._keys.get(key)
            if known is not None:
                return Acknowledgement(known[0], known[1], duplicate=True)
            running = self._in_flight.get(key)
            if running is not None:
                first = await asyncio.shield(running)
                return Acknowledgement(first.version, first.rows, duplicate=True)
        future: asyncio.Future[Acknowledgement] = asyncio.get_running_loop().create_future()
        if key is not None:
            self._in_flight[key] = future
        item = _Pending(table, key, future, time.monotonic())
        self._pending.append(item)
        self._pending_rows += table.num_rows
        self.pending_bytes += item.nbytes
        self._wakeup.set()
        if self._pending_rows >= self.max_rows or self.pending_bytes >= self.max_bytes:
            self._full.set()
        return await asyncio.shield(future)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            if not self._pending:
                self._wakeup.clear()
                if self._closing:
                    return
                continue
            wait = self._pending[0].arrived + self.max_delay - time.monotonic()
            if wait > 0 and not self._closing and not self._full.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait)
            group = self._take_group()
            started = time.monotonic()
            tables = [p.table for p in group]
            keys = [(p.key, p.table.num_rows) for p in group if p.key is not None]
            try:
                version = await loop.run_in_executor(
                    self._executor, self.writer.commit_group, tables, keys
                )
            except Exception as exc:
                log.error("commit to table %s failed: %s", self.name, exc)
                self._fail(group, exc)
                continue
            finally:
                for p in group:
                    self.pending_bytes -= p.nbytes
            rows = sum(t.num_rows for t in tables)
            for p in group:
                if p.key is not None:
                    self._remember(p.key, version, p.table.num_rows)
                    self._in_flight.pop(p.key, None)
                if not p.future.done():
                    p.future.set_result(Acknowledgement(version, p.table.num_rows))
            if self._on_commit is not None:
                self._on_commit(rows, len(group), time.monotonic() - started)

    def _take_group(self) -> list[_Pending]:
        group: list[_Pending] = []
        rows = nbytes = 0
        while self._pending and (not group or (rows < self.max_rows and nbytes < self.max_bytes)):
            item = self._pending.popleft()
            group.append(item)
            rows += item.table.num_rows
            nbytes += item.nbytes
        self._pending_rows -= rows
        if self._pending_rows < self.max_rows and self.pending_bytes - nbytes < self.max_bytes:
            self._full.clear()
        if not self._pending:
            self._wakeup.clear()
        return group

    def _fail(self, group: list[_Pending], exc: Exception) -> None:
        error = exc
        if not isinstance(exc, IngestCommitError):
            error = IngestCommitError(
                f"could not commit to table {self.name!r}: {exc}. Retry the request.",
                table=self.name,
                table_uri=self.writer.config.uri,
            )
        for p in group:
            if p.key is not None:
                self._in_flight.pop(p.key, None)
            if not p.future.done():
                p.future.set_exception(error)

    async def close(self) -> None:
        """Commit what is pending, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)
