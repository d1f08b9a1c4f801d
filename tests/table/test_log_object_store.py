"""Reading the Delta log's commit files from an object store that does not answer: a typed,
retryable ObjectStoreError (a stream's next offset while the S3 gateway restarts), not
pyarrow's OSError."""

from __future__ import annotations

import pytest

from deltaflow import ObjectStoreError
from deltaflow.table import _log
from tests._object_store import free_port


@pytest.fixture
def silent_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
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
