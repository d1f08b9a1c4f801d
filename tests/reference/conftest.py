"""The reference fixtures: one delta-spark process (one JVM) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reference import _env
from tests.reference._client import ReferenceSpark


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceSpark]:
    """delta-spark (the newest release and the pyspark it supports) in its own process.

    Skipped only when PyPI or Maven Central cannot be reached (the registry's own error is
    the reason); any other failure to build or start it fails the tests."""
    try:
        _env.reference_jars()
    except _env.ReferenceUnavailable as exc:
        pytest.skip(f"delta-spark reference unavailable: {exc}")
    session = ReferenceSpark(tmp_path_factory.mktemp("reference"))
    print(
        f"delta-spark {session.delta_version} on Spark {session.spark_version} "
        f"up in {session.started_in:.1f} s"
    )
    yield session
    session.close()
