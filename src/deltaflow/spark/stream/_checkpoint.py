"""Where a stream's checkpoint may live, and the typed error when Hadoop cannot open it.

Spark writes a query's offsets, commits and state through Hadoop's file systems, never
through deltaflow's object-store path (delta-rs, pyarrow). The pyspark wheel has Hadoop's
local and HDFS file systems but no ``hadoop-aws``, so a ``checkpointLocation`` on
``s3://`` fails inside ``start()`` with Hadoop's ``No FileSystem for scheme "s3"``. That
error becomes :class:`~deltaflow.spark.errors.CheckpointLocationError`, which says where
a checkpoint can go instead. A cluster that adds ``hadoop-aws`` itself (``s3a://``) is not
refused: only the failure is translated.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

from deltaflow.spark.errors import CheckpointLocationError
from deltaflow.table import _uri

_NO_FILE_SYSTEM = re.compile(r'No FileSystem for scheme "([A-Za-z0-9+.-]+)"')
_SESSION_DEFAULT = "spark.sql.streaming.checkpointLocation"


def checkpoint_location(spark: Any, options: Mapping[str, str]) -> tuple[str | None, str]:
    """The query's checkpoint location and where it was set (its option, else the
    session's default root)."""
    for key, value in options.items():
        if key.lower() == "checkpointlocation":
            return value, "the checkpointLocation option"
    try:
        default = spark.conf.get(_SESSION_DEFAULT, None)
    except Exception:  # a session without the key, or a stopped one: nothing to name
        default = None
    return default, _SESSION_DEFAULT


@contextlib.contextmanager
def refused_checkpoint(spark: Any, options: Mapping[str, str]) -> Iterator[None]:
    """Around ``DataStreamWriter.start``: Hadoop's refusal of the checkpoint's file
    system as a :class:`CheckpointLocationError`; every other error passes untouched."""
    try:
        yield
    except Exception as exc:
        error = checkpoint_error(spark, options, exc)
        if error is None:
            raise
        raise error from exc


def checkpoint_error(
    spark: Any, options: Mapping[str, str], exc: BaseException
) -> CheckpointLocationError | None:
    found = _NO_FILE_SYSTEM.search(str(exc))
    if found is None:
        return None
    location, source = checkpoint_location(spark, options)
    scheme = found.group(1)
    if location is None or urlparse(location).scheme.lower() != scheme.lower():
        return None  # the scheme is the table's or another path's, not the checkpoint's
    return CheckpointLocationError(
        f"Cannot start the stream: its checkpoint {_uri.shown(location)} (from {source}) is"
        f" on {scheme}://, which Spark's Hadoop layer cannot open here (the pyspark wheel"
        " has no hadoop-aws). Spark keeps stream checkpoints through Hadoop, while deltaflow"
        " reaches object stores only for Delta tables. Keep the tables on the object store"
        " and put the checkpoint on a local disk that outlives the process, a mounted shared"
        " file system, or HDFS: .option('checkpointLocation', '/var/lib/deltaflow/"
        "checkpoints/<query>'). On a cluster the driver writes it, so a driver-local disk"
        " works as long as the driver's machine is kept.",
        checkpoint_location=location,
        scheme=scheme,
    )
