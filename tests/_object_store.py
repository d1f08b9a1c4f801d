"""The tests' real S3 server: SeaweedFS, started by ``deltaflow.testing._seaweedfs``.

That module is shared with ``make demo STORAGE=s3``; this one only names it for the tests.
:func:`plan_environment` must run before the first Spark session of a test process.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from deltaflow.testing._seaweedfs import (
    ACCESS_KEY,
    BUCKET,
    REGION,
    SECRET_KEY,
    START_TIMEOUT,
    ObjectStore,
    ObjectStoreStartError,
    free_port,
    plan_environment,
    planned_endpoint,
    s3_environment,
    start_seaweedfs,
    weed_binary,
)

__all__ = [
    "ACCESS_KEY",
    "BUCKET",
    "REGION",
    "SECRET_KEY",
    "START_TIMEOUT",
    "ObjectStore",
    "ObjectStoreStartError",
    "free_port",
    "plan_environment",
    "planned_endpoint",
    "s3_environment",
    "start_seaweedfs",
    "store_fs",
    "weed_binary",
]


def store_fs(store: ObjectStore) -> pafs.S3FileSystem:
    """A pyarrow filesystem straight on ``store`` (this process need not export AWS_*)."""
    return pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=store.endpoint,
        region=REGION,
        scheme="http",
    )
