"""Reading one Delta table with both engines and comparing what they see.

Each side reads in its own process: deltaflow in the test process (the ``spark`` fixture),
delta-spark in the reference process. Rows are compared sorted (a table has no row order),
schemas as ``[name, type, nullable]`` per field, values through ``_server.canonical``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.reference._client import ReferenceSpark
from tests.reference._server import frame


def log_versions(path: str) -> list[int]:
    """The table's versions, from its commit files."""
    log = Path(path) / "_delta_log"
    return sorted(int(p.stem) for p in log.glob("*.json") if p.stem.isdigit())


def deltaflow_read(spark: Any, path: str, options: dict[str, str] | None = None) -> Any:
    return frame(spark.read.format("delta").options(**(options or {})).load(path))


def reference_read(ref: ReferenceSpark, path: str, options: dict[str, str] | None = None) -> Any:
    return ref.run(f"spark.read.format('delta').options(**{options or {}!r}).load({path!r})")


def deltaflow_sql(spark: Any, statement: str) -> None:
    spark.sql(statement).collect()


def reference_sql(ref: ReferenceSpark, statement: str) -> None:
    ref.run(f"spark.sql({statement!r}).collect() and None")


def deltaflow_run(spark: Any, code: str) -> Exception | None:
    """Run a PySpark snippet in deltaflow's session, as the reference runs the same one;
    what it raised (None: it ran)."""
    try:
        exec(code, {"spark": spark})
    except Exception as exc:
        return exc
    return None


def assert_same_reads(
    spark: Any,
    ref: ReferenceSpark,
    path: str,
    versions: list[int],
    cdf_from: int | None = None,
) -> None:
    """Both engines see the same rows and schema at the latest version and at each of
    ``versions`` (time travel), and the same change feed from ``cdf_from`` (when the table
    records one)."""
    started = time.monotonic()
    latest = reference_read(ref, path)
    assert deltaflow_read(spark, path) == latest, "latest version differs"
    for version in versions:
        options = {"versionAsOf": str(version)}
        expected = reference_read(ref, path, options)
        assert deltaflow_read(spark, path, options) == expected, f"version {version} differs"
    if cdf_from is not None:
        options = {"readChangeFeed": "true", "startingVersion": str(cdf_from)}
        expected = reference_read(ref, path, options)
        assert expected["rows"], "delta-spark read no change rows"
        assert deltaflow_read(spark, path, options) == expected, "change data feed differs"
    print(f"versions {versions} + latest compared in {time.monotonic() - started:.1f} s")
