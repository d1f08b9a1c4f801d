"""Per-thread step timings of one operation, for timing lines (the real-time commit's).

A caller opens :func:`collect` around an operation; code deep inside it (the log commit,
the atomic put) calls :func:`add` with a step's duration. Outside a :func:`collect`,
:func:`add` does nothing, so every other caller pays one thread-local lookup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Collect the steps timed on this thread while the block runs: name -> seconds."""
    outer = getattr(_local, "steps", None)
    steps: dict[str, float] = {}
    _local.steps = steps
    try:
        yield steps
    finally:
        _local.steps = outer


def add(name: str, seconds: float) -> None:
    """Add ``seconds`` to step ``name`` of the operation being collected on this thread."""
    steps = getattr(_local, "steps", None)
    if steps is not None:
        steps[name] = steps.get(name, 0.0) + seconds


@contextmanager
def step(name: str) -> Iterator[None]:
    """Time the block as step ``name`` (nothing recorded outside :func:`collect`)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - started)
