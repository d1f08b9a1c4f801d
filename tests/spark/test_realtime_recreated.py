"""A real-time query into a table whose log is replaced while it runs (the folder wiped
and a new table written there, as DROP TABLE and CREATE TABLE of the same name do).

The sink's log head (``table/_log_head.py``) knows the old table's version; a commit after
it into the new, shorter log would leave a gap in the versions (a table no reader can
load). Rolls in the wiped folder fail their commit (their files are gone); this test
keeps the staging folder, as a roll opened while the folder was being removed would, so
the head alone stands between the query and the gap (before it checked its commit file's
identity, this test found versions 0, 1, 21, 22).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.spark._compat import PYSPARK_MINOR
from tests._waiting import wait_until
from tests.reference._compare import log_versions
from tests.spark._conf import conf_set
from tests.spark.test_realtime_sink import ALLOWLIST, MemoryStream, ids, new_table, start

pytestmark = pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark 4.1+")


def test_a_log_replaced_under_a_running_query_is_never_written_past(spark, table_path) -> None:
    name, location = new_table(spark)
    source = MemoryStream(spark)
    with conf_set(spark, ALLOWLIST, "false"):
        query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="5")
        try:
            for start_at in range(0, 48, 6):
                source.add(list(range(start_at, start_at + 6)))
                wait_until(lambda n=start_at + 6: len(ids(location)) >= n, 120, "rows")
            old_version = max(log_versions(location))
            assert old_version >= 4, old_version

            # Another writer replaces the log with a new table's, two versions long.
            shutil.rmtree(Path(location, "_delta_log"))
            for part in Path(location).glob("*.parquet"):
                part.unlink()
            schema = pa.schema([pa.field("id", pa.int32())])
            write_deltalake(location, pa.table({"id": pa.array([1000], pa.int32())}, schema))
            write_deltalake(
                location, pa.table({"id": pa.array([1001], pa.int32())}, schema), mode="append"
            )

            # Rows keep coming until the query commits into the new log or stops (a failed
            # commit stops it at once; test_realtime_failed_commit.py: with no more rows).
            fed = iter(range(48, 10_000, 6))

            def committed_or_stopped() -> bool:
                if query.exception() is not None or len(log_versions(location)) > 2:
                    return True
                start_at = next(fed)
                source.add(list(range(start_at, start_at + 6)))
                return False

            wait_until(committed_or_stopped, 120, "the query to commit into the new log or stop")
        finally:
            query.stop()

    # The new log holds none of the query's app transactions: its rolls do not continue
    # them, and the query stops, typed (a restart replays into the new table).
    assert "do not continue its app transactions" in str(query.exception()), query.exception()
    versions = log_versions(location)
    assert versions == list(range(len(versions))), versions  # 0, 1, 2, ...: no gap
    table = DeltaTable(location)
    assert table.version() == versions[-1]
    assert {1000, 1001} <= set(table.to_pyarrow_table().column("id").to_pylist())
