"""deltaflow and delta-spark read each other's tables identically, every feature, both ways.

For each feature (``_features.py``) and each direction, the *writer* builds the table; both
engines then read it at every version (and its change feed) and must agree; the *other*
engine writes on top of it (a write or DML on a table it did not create) and both read again;
statements that break a CHECK constraint are refused by both. delta-spark runs in its own
process (one JVM for the module, ``conftest.reference``), deltaflow in this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.reference import _compare, _env, _server
from tests.reference._client import ReferenceJobError, ReferenceSpark
from tests.reference._features import FEATURES, Feature

pytestmark = [pytest.mark.reference, pytest.mark.slow]

DELTAFLOW, DELTA_SPARK = "deltaflow", "delta-spark"

# Known gaps, (feature, writer) -> reason: each is xfail(strict=True), so a fixed gap fails
# the run until its entry is removed.
GAPS: dict[tuple[str, str], str] = {}


def _cases() -> list[Any]:
    cases = []
    for feature in FEATURES:
        for writer in (DELTAFLOW, DELTA_SPARK):
            reason = GAPS.get((feature.name, writer))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(
                pytest.param(feature, writer, id=f"{feature.name}-by-{writer}", marks=marks)
            )
    return cases


def _run(spark: Any, reference: ReferenceSpark, engine: str, statement: str, path: str) -> None:
    statement = statement.replace("{path}", path)
    if engine == DELTAFLOW:
        _compare.deltaflow_sql(spark, statement)
    else:
        _compare.reference_sql(reference, statement)


def _log_text(path: str) -> str:
    return "".join(p.read_text() for p in sorted(Path(path, "_delta_log").glob("*.json")))


# The first test pays for building the reference environment on a fresh machine (about 5
# minutes: a 450 MB pyspark from PyPI, delta-spark's jars from Maven Central) and starting it.
@pytest.mark.timeout(1800)
def test_reference_is_delta_spark(reference):
    assert reference.delta_version == _env.DELTA_SPARK_VERSION
    assert reference.spark_version.startswith("4.2.")
    with pytest.raises(ReferenceJobError) as failed:
        reference.run("spark.read.format('delta').load('/nonexistent/table').collect()")
    assert failed.value.condition == "PATH_NOT_FOUND"
    assert failed.value.java_class == "org.apache.spark.sql.AnalysisException"


@pytest.mark.parametrize(("feature", "writer"), _cases())
def test_interop(spark, reference, tmp_path, feature: Feature, writer: str):
    other = DELTA_SPARK if writer == DELTAFLOW else DELTAFLOW
    path = str(tmp_path / feature.name)
    for statement in feature.setup:
        _run(spark, reference, writer, statement, path)
    if feature.log_marker:
        assert feature.log_marker in _log_text(path), f"{writer} did not write {feature.name}"
    # The writer's versions are read again by time travel once the other engine has written
    # on top; here the latest, for a failure that names the step.
    assert _compare.deltaflow_read(spark, path) == _compare.reference_read(reference, path)

    written = _compare.log_versions(path)[-1]
    for statement in feature.on_top:
        _run(spark, reference, other, statement, path)
    # Time travel to the table's first data and to the writer's last version (each Spark
    # read costs seconds on a loaded machine: two versions, not every one).
    versions = sorted({min(1, written), written})
    _compare.assert_same_reads(spark, reference, path, versions, feature.cdf_from)

    before = _compare.log_versions(path)[-1]
    for engine in (writer, other):
        for statement in feature.refused:
            with pytest.raises(Exception) as refused:
                _run(spark, reference, engine, statement, path)
            assert "x_positive" in str(refused.value), f"{engine}: {refused.value}"
    assert _compare.log_versions(path)[-1] == before, "a refused statement committed"


# The conflict classes of delta-spark's `delta.exceptions` (deltaflow's `deltaflow.exceptions`
# has the same names): a MERGE that lost a conflict raises one of these on either side.
CONFLICTS = {
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
}
ROUNDS = 8
ATTEMPTS = 12
MERGE_COUNTER = (
    "MERGE INTO delta.`{path}` t USING (SELECT 'counter' AS key) s ON t.key = s.key "
    "WHEN MATCHED THEN UPDATE SET n = t.n + 1"
)

# Run by delta-spark: per round, a blind append, then the counter's MERGE, retried on a
# conflict (at most ATTEMPTS times); returns how many MERGEs committed and the conflicts seen.
_REFERENCE_ROUNDS = """
conflicts, merged = [], 0
for i in range({rounds}):
    spark.sql("INSERT INTO delta.`{path}` VALUES ('delta-spark-' || {{0}}, 0)".format(i)).collect()
    for attempt in range({attempts}):
        try:
            spark.sql({merge!r}).collect()
            merged += 1
            break
        except Exception as exc:
            if type(exc).__name__ not in {conflicts!r}:
                raise
            conflicts.append(type(exc).__name__)
result = [merged, conflicts]
"""


def _deltaflow_rounds(spark: Any, path: str) -> tuple[int, list[str]]:
    import deltaflow

    conflicts: list[str] = []
    merged = 0
    for i in range(ROUNDS):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES ('deltaflow-' || {i}, 0)").collect()
        for _ in range(ATTEMPTS):
            try:
                spark.sql(MERGE_COUNTER.replace("{path}", path)).collect()
                merged += 1
                break
            except Exception as exc:
                typed = deltaflow.typed_error(exc)
                name = type(typed).__name__ if typed is not None else type(exc).__name__
                if name not in CONFLICTS:
                    raise
                conflicts.append(name)
    return merged, conflicts


def test_concurrent_appends_and_merges(spark, reference, tmp_path):
    """Both engines append to and MERGE one table at once, each from its own process: every
    append lands, no counter update is lost, and a MERGE that loses a conflict raises one
    of delta.exceptions' conflict classes (then retries)."""
    path = str(tmp_path / "concurrent")
    _compare.deltaflow_sql(spark, f"CREATE TABLE delta.`{path}` (key STRING, n INT) USING delta")
    _compare.deltaflow_sql(spark, f"INSERT INTO delta.`{path}` VALUES ('counter', 0)")
    job = _REFERENCE_ROUNDS.format(
        rounds=ROUNDS,
        attempts=ATTEMPTS,
        path=path,
        merge=MERGE_COUNTER.replace("{path}", path),
        conflicts=sorted(CONFLICTS),
    )
    pending = reference.submit(job)
    merged, conflicts = _deltaflow_rounds(spark, path)
    # (The job's result travels as canonical JSON, where a dict would become a "$map".)
    their_merged, their_conflicts = pending.result(timeout=600)
    print(f"deltaflow: {merged} MERGEs, conflicts {conflicts}")
    print(f"delta-spark: {their_merged} MERGEs, conflicts {their_conflicts}")
    assert merged == ROUNDS and their_merged == ROUNDS, "a MERGE ran out of attempts"
    assert set(conflicts) | set(their_conflicts) <= CONFLICTS

    expected = sorted(
        [[f"{side}-{i}", 0] for side in (DELTAFLOW, DELTA_SPARK) for i in range(ROUNDS)]
        + [["counter", 2 * ROUNDS]],
        key=_server.sort_key,
    )
    seen = _compare.reference_read(reference, path)
    assert seen["rows"] == expected
    assert _compare.deltaflow_read(spark, path) == seen
