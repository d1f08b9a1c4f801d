"""Fixtures shared by the Spark tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def stopping() -> Iterator[list[Any]]:
    """Queries to stop when the test ends, whatever happened."""
    queries: list[Any] = []
    yield queries
    for query in queries:
        query.stop()
