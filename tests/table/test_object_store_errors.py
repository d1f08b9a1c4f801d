"""How an object store's failure text is classified: digits that only look like a status."""

from __future__ import annotations

import pytest

from deltaflow.table._object_store import object_store_error

URI = "s3://deltaflow/t"


@pytest.mark.parametrize(
    "text",
    [
        # delta-rs's text for a silent endpoint whose port and retry time hold "403".
        "Generic S3 error: Error performing list request: Error performing GET"
        " http://127.0.0.1:40312/deltaflow?list-type=2 in 4.0387s, after 10 retries:"
        " tcp connect error: Connection refused (os error 111)",
        "error sending request for url (http://127.0.0.1:54031/deltaflow): client error"
        " (Connect): tcp connect error: Connection refused",
    ],
)
def test_a_port_or_a_duration_holding_403_is_not_a_refusal(text: str) -> None:
    error = object_store_error(URI, OSError(text), "commit to")
    assert error is not None
    assert (error.kind, error.retryable) == ("unreachable", True)


@pytest.mark.parametrize(
    "text",
    [
        "Generic S3 error: Client error with status 403: <Error><Code>AccessDenied</Code>",
        "AWS Error UNKNOWN (HTTP status 403) during HeadObject operation",
        "HTTP response code: 403",
    ],
)
def test_a_403_status_is_a_credentials_error(text: str) -> None:
    error = object_store_error(URI, OSError(text), "read the Delta log of")
    assert error is not None
    assert (error.kind, error.retryable) == ("credentials", False)
