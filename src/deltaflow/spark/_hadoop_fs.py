"""Which object-store URIs this session's Hadoop can write (for Spark's own files).

Spark writes stream checkpoints and state through Hadoop. The pyspark wheel opens only
local and HDFS paths; a cluster that brings Hadoop's S3A (or GCS / ABFS connectors) opens
their schemes too, and then a checkpoint can live beside the tables on the object store.
``s3://`` is S3A's when the session maps it (``fs.s3.impl``, as EMR does); otherwise a
``s3://`` location is reached as ``s3a://``, the same bucket and key.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse


def _opens(spark: Any, scheme: str) -> bool:
    try:
        jvm = spark._jvm
        conf = spark._jsc.hadoopConfiguration()
        return jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf) is not None
    except Exception:  # no JVM here (Spark Connect), or no FileSystem for the scheme
        return False


def hadoop_uri(spark: Any, uri: str) -> str | None:
    """``uri`` as this classic session's Hadoop opens it (``s3://`` may become ``s3a://``),
    or None when it cannot (or the session has no JVM to ask: Spark Connect)."""
    scheme = urlparse(uri).scheme.lower()
    if not scheme or scheme == "file":
        return uri
    if _opens(spark, scheme):
        return uri
    if scheme == "s3" and _opens(spark, "s3a"):
        return "s3a" + uri[len(scheme) :]
    return None
