"""A real-time query into Delta whose commit fails stops at once, typed, even when no
row follows the failing one (a quiet source), instead of at the epoch's end.

The commit is made to fail as in ``test_realtime_recreated.py``: the table's log is
replaced under the running query (DROP and CREATE of the same name do that), so the next
roll does not continue the new log's app transactions and the brain refuses it. The
epoch is five minutes long: before the driver's endpoint cancelled the epoch's job on a
failed commit, the failure stayed in the task until its next row or the epoch's end, and
this query went on running, committing nothing, for the rest of the five minutes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import deltaflow
from deltaflow.spark._compat import PYSPARK_MINOR
from deltaflow.table.errors import ConcurrentWriteError
from tests._waiting import wait_until
from tests.reference._compare import log_versions
from tests.spark._conf import conf_set
from tests.spark.test_realtime_sink import ALLOWLIST, EPOCH, MemoryStream, ids, new_table, start

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark 4.1+"),
]


def _replace_log(location: str) -> None:
    """Another writer wipes the table and writes a new one at its path, two versions long."""
    shutil.rmtree(Path(location, "_delta_log"))
    for part in Path(location).glob("*.parquet"):
        part.unlink()
    schema = pa.schema([pa.field("id", pa.int32())])
    write_deltalake(location, pa.table({"id": pa.array([1000], pa.int32())}, schema))
    write_deltalake(location, pa.table({"id": pa.array([1001], pa.int32())}, schema), mode="append")


def test_a_failed_commit_stops_a_quiet_query_at_once_with_the_typed_error(
    spark, table_path
) -> None:
    assert EPOCH == "5 minutes"  # the wait below is far shorter than the epoch
    name, location = new_table(spark)
    source = MemoryStream(spark)
    with conf_set(spark, ALLOWLIST, "false"):
        query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="5")
        try:
            source.add(list(range(6)))
            wait_until(lambda: len(ids(location)) >= 6, 120, "the first rows")
            _replace_log(location)

            # One more batch, whose roll's commit fails; then the source stays quiet.
            source.add(list(range(6, 12)))
            wait_until(
                lambda: query.exception() is not None,
                60,
                "the query to stop on its failed commit (not at the 5-minute epoch's end)",
            )
            # Still the first epoch: Spark never reached its end.
            assert query.lastProgress is None
        finally:
            query.stop()

    error = deltaflow.typed_error(query.exception())
    assert isinstance(error, ConcurrentWriteError), query.exception()
    # The brain's refusal, with its fields, as when a later row or the epoch's end raised it.
    assert error.kind == "ConcurrentTransaction"
    assert Path(error.table_uri.removeprefix("file://")) == Path(location)
    assert error.read_version == 1  # the new log's last version
    assert error.attempts == 1
    assert "do not continue its app transactions" in str(error)
    # Nothing of the query reached the new log.
    assert log_versions(location) == [0, 1]
