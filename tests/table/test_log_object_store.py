"""Reading the Delta log's commit files from an object store that does not answer: a typed,
retryable ObjectStoreError (a stream's next offset while the S3 gateway restarts), not
pyarrow's OSError."""

from __future__ import annotations

import pytest

from deltaflow import ObjectStoreError
from deltaflow.table import _log


@pytest.fixture
def silent_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 1 (tcpmux): nothing here listens on it. A port found free a moment ago is not
    # safe: once a SeaweedFS another test process started took it, and answered
    # (``credentials`` instead of ``unreachable``).
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")


@pytest.mark.parametrize("read", [lambda uri: _log.read_commit_text(uri, 3), _log.last_checkpoint])
def test_an_unanswering_store_is_a_retryable_typed_error(silent_s3, read):
    with pytest.raises(ObjectStoreError) as caught:
        read("s3://bucket/table")
    assert caught.value.table_uri == "s3://bucket/table"
    assert caught.value.kind == "unreachable"
    assert caught.value.retryable


def test_a_missing_local_commit_is_still_none(tmp_path):
    assert _log.read_commit_text(str(tmp_path), 0) is None
    assert _log.last_checkpoint(str(tmp_path)) is None


def test_a_data_file_read_failing_on_an_executor_carries_a_typed_error(silent_s3):
    """What a Python worker on an executor raises when the store fails mid-scan: a marked
    error whose text the driver turns back into the ObjectStoreError."""
    import pyarrow as pa

    import deltaflow
    from deltaflow.errors import RemoteDeltaflowError
    from deltaflow.spark.read._reader import FileTask, ReadLayout, read_tasks

    schema = pa.schema([("id", pa.int64())])
    layout = ReadLayout(schema, schema, (0,), {})
    task = FileTask("s3://bucket/table/part-0.parquet", 100, {})
    with pytest.raises(RemoteDeltaflowError) as caught:
        list(read_tasks("s3://bucket/table", [task], layout))
    error = deltaflow.typed_error(Exception(str(caught.value)))
    assert isinstance(error, ObjectStoreError)
    assert (error.table_uri, error.kind) == ("s3://bucket/table", "unreachable")
