"""The test side of the reference: a long-lived delta-spark process that takes small jobs.

One :class:`ReferenceSpark` (one delta-spark JVM) serves a whole test module: starting a
Spark session costs seconds, a job milliseconds. Jobs are Python snippets run in the
reference venv with ``spark`` bound (``_server.py`` says what comes back).
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from tests.reference import _env, _server

_START_TIMEOUT = 300.0


class ReferenceJobError(AssertionError):
    """A job failed in delta-spark: ``type`` is its Python class (``ConcurrentAppendException``
    for a lost conflict, as delta-spark's ``delta.exceptions`` names it), ``java_class`` the
    JVM exception's class, ``condition`` Spark's error condition."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.type: str = error["type"]
        self.java_class: str | None = error.get("java_class")
        self.condition: str | None = error.get("condition")
        self.message: str = error["message"]
        super().__init__(
            f"delta-spark raised {self.type} ({self.java_class}): {self.message}\n"
            f"{error.get('traceback', '')}"
        )


class Pending:
    """A job sent and not yet answered: :meth:`result` waits for its reply."""

    def __init__(self, owner: ReferenceSpark, code: str) -> None:
        self._owner = owner
        self._code = code
        self._reply: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1)

    def result(self, timeout: float = 900.0) -> Any:
        try:
            reply = self._reply.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"delta-spark did not answer within {timeout} s:\n{self._code}\n"
                f"{self._owner.log_tail()}"
            ) from None
        if reply.get("closed"):
            raise AssertionError(f"delta-spark exited:\n{self._owner.log_tail()}")
        if not reply["ok"]:
            raise ReferenceJobError(reply["error"])
        return reply["result"]


class ReferenceSpark:
    """A delta-spark session in its own process (the reference venv's Python)."""

    def __init__(self, work_dir: Path, conf: dict[str, str] | None = None) -> None:
        python = _env.reference_python()
        settings = {
            **_env.reference_spark_conf(),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.showConsoleProgress": "false",
            # delta-spark rebuilds a snapshot's state with a 50-partition shuffle by default:
            # 50 tasks per read of a tiny table, seconds each on a loaded 2-core machine.
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
            **(conf or {}),
        }
        self.log_path = work_dir / "reference.log"
        self._log: TextIO = open(self.log_path, "w")  # noqa: SIM115 (closed in close())
        started = time.monotonic()
        self._process = subprocess.Popen(
            [str(python), _server.__file__, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=work_dir,
        )
        self._waiting: queue.Queue[Pending] = queue.Queue()
        self._lock = threading.Lock()
        self._ready: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1)
        self._reader = threading.Thread(target=self._read, name="reference-reader", daemon=True)
        self._reader.start()
        try:
            hello = self._ready.get(timeout=_START_TIMEOUT)
        except queue.Empty:
            self.close()
            raise AssertionError(f"delta-spark did not start in time:\n{self.log_tail()}") from None
        if not hello.get("ready"):
            self.close()
            raise AssertionError(f"delta-spark failed to start:\n{self.log_tail()}")
        self.spark_version: str = hello["spark"]
        self.delta_version: str = hello["delta"]
        self.started_in = time.monotonic() - started

    def _read(self) -> None:
        assert self._process.stdout is not None
        first = True
        for line in self._process.stdout:
            message = json.loads(line)
            if first:
                self._ready.put(message)
                first = False
                continue
            self._waiting.get_nowait()._reply.put(message)
        if first:
            self._ready.put({"ready": False})
        while not self._waiting.empty():
            self._waiting.get_nowait()._reply.put({"closed": True})

    def submit(self, code: str) -> Pending:
        """Send a job without waiting (jobs run one at a time, in the order sent)."""
        pending = Pending(self, code)
        assert self._process.stdin is not None
        with self._lock:
            self._waiting.put(pending)
            self._process.stdin.write(json.dumps({"code": code}) + "\n")
            self._process.stdin.flush()
        return pending

    def run(self, code: str, timeout: float = 900.0) -> Any:
        """Run a job and return its result (raises :class:`ReferenceJobError` if it failed)."""
        return self.submit(code).result(timeout)

    def log_tail(self, chars: int = 6000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.write(json.dumps({"stop": True}) + "\n")
                self._process.stdin.close()
                self._process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait(timeout=30)
        self._log.close()
