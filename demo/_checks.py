"""What every part of the demo uses to compare its numbers with an independent computation."""

from __future__ import annotations


class DemoCheckError(RuntimeError):
    """Spark's answer and the independent computation disagree."""


class DemoRunError(RuntimeError):
    """A part of the demo could not run (a service did not start, a query failed)."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`DemoCheckError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise DemoCheckError(message)
