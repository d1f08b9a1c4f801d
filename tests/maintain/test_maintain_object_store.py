"""``deltaflow maintain`` on tables under an ``s3://`` prefix, against a real S3 server
(SeaweedFS, ``tests/_object_store.py``): tables are found by listing the prefix, and
compaction, checkpoints and VACUUM run on them as on a local disk."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow import maintain
from deltaflow.table import _uri
from tests import _object_store

pytestmark = pytest.mark.slow


@pytest.fixture
def store(object_store):
    _object_store.plan_environment()  # the maintain code reads the store from AWS_*
    return object_store


def test_maintain_finds_and_compacts_tables_under_an_s3_prefix(store):
    root = store.uri("lake")
    events, healthy = f"{root}/bronze/events", f"{root}/healthy"
    options = store.storage_options
    retention = {"delta.deletedFileRetentionDuration": "interval 0 hours"}
    for i in range(12):
        data = pa.table({"id": [i, i + 1000], "p": [i % 2, i % 2]})
        write_deltalake(
            events,
            data,
            mode="append",
            partition_by=["p"],
            configuration=retention,
            storage_options=options,
        )
    write_deltalake(healthy, pa.table({"id": [1], "p": [0]}), storage_options=options)
    before = DeltaTable(events, storage_options=options).to_pyarrow_table()["id"].to_pylist()

    assert maintain.find_tables([root]) == [events, healthy]
    options_ = maintain.MaintainOptions(min_small_files=5)
    report = maintain.run_pass([root], options_)

    report.raise_for_failures()
    ran = {(a.table, a.action) for a in report.ran()}
    assert (events, "OPTIMIZE") in ran
    assert (events, "CHECKPOINT") in ran
    assert not [a for a in report.ran() if a.table == healthy]
    table = DeltaTable(events, storage_options=options)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == sorted(before)
    assert len(table.file_uris()) == 2  # one file per partition
    # The compacted-away files are past their (zero) retention: vacuumed in this pass or
    # the next; then only the live files remain in the bucket.
    second = maintain.run_pass([root], options_)
    second.raise_for_failures()
    assert (events, "VACUUM") in ran | {(a.table, a.action) for a in second.ran()}
    fs, path = _uri.filesystem(events)
    stored = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    data_files = [f for f in stored if f.path.endswith(".parquet") and "_delta_log" not in f.path]
    assert len(data_files) == 2


def test_a_missing_s3_prefix_is_a_typed_error_naming_it(store):
    root = store.uri("nothing-here")
    with pytest.raises(maintain.MaintainRootError) as caught:
        maintain.run_pass([root])
    assert (caught.value.kind, caught.value.path) == ("missing", root)
