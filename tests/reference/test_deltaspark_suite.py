"""delta-spark's own Python API tests, run unchanged against deltaflow (the minimum bar of
issue 27). See ``_deltaspark_suite.py`` for where the tests come from and how they run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reference import _deltaspark_suite as suite

# At least this many of the 48 pass; the rest are listed in the docs' differences table
# (docs/python-api.md) with the reason.
THRESHOLD = 46
# Known failures and why (each also in docs/python-api.md's differences).
KNOWN_FAILURES = {
    "DeltaTableTests::test_create_table_geo_types": (
        "geometry/geography columns (Spark 4.1 types, Delta's geospatial feature): delta-rs,"
        " which reads deltaflow's logs, does not parse them"
    ),
    "DeltaTableTests::test_dropFeatureSupport": (
        "adds and drops delta-spark's test-only features (testRemovableWriter, ...),"
        " which are not Delta features"
    ),
}


@pytest.mark.slow
@pytest.mark.timeout(suite.TIMEOUT_SECONDS + 60)  # the whole suite, in a subprocess
def test_delta_sparks_python_suite_passes_against_deltaflow(tmp_path: Path) -> None:
    folder = suite.find_suite()
    if folder is None:
        pytest.skip(
            "delta-spark's Python tests are not on this machine: no registry this project"
            " reaches serves them (the delta-spark wheel and sdist on PyPI have none). Copy"
            " python/delta/tests of delta-io/delta (tag v4.4.0) to"
            f" {suite.CACHE_DIR} or point {suite.ENV_VAR} at them (docs/benchmarks.md)."
        )
    result = suite.run_suite(folder, tmp_path)
    total = len(result.passed) + len(result.failed)
    unexpected = {n: r for n, r in result.failed.items() if n not in KNOWN_FAILURES}
    report = "\n".join(f"  {n}: {r}" for n, r in sorted(result.failed.items()))
    assert total == suite.SUITE_SIZE, f"ran {total} tests, expected {suite.SUITE_SIZE}"
    assert len(result.passed) >= THRESHOLD and not unexpected, (
        f"{len(result.passed)} of {total} passed (threshold {THRESHOLD}); failures:\n{report}"
    )
