"""Waiting on a condition while a process we started runs, with a deadline.

The pause between checks is a wait on the process itself, so a process that exits ends the
wait at once (and fails it) instead of leaving the test to run into its timeout.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from deltaflow.testing import _seaweedfs


def wait_while_running(
    ready: Callable[[], bool],
    process: subprocess.Popen[Any],
    timeout: float,
    what: str,
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Return once ``ready()`` is true; fail when ``process`` exits or ``timeout`` passes.
    ``what`` names the awaited condition, ``detail()`` adds a log tail to a failure."""
    _seaweedfs.wait_while_running(ready, process, timeout, what, detail, error=AssertionError)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``condition()`` is true; fail when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        threading.Event().wait(0.2)
