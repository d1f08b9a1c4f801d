"""Hadoop's S3A for tests and benchmarks: ``hadoop-aws`` matching the wheel's Hadoop and the
few AWS SDK v2 modules it needs, from Maven Central, resolved once.

Not part of deltaflow (users bring S3A with their cluster: README, "Object stores"); the
tests use it to run the JVM path against SeaweedFS. The set is the one
``docs/notes/s3a-research.md`` measured (36 jars, about 13 MB): the SDK ``bundle`` (686 MB)
is excluded and the modules S3A uses (``s3``, ``sts``, ``s3-transfer-manager``) are named
instead; jars pyspark already ships (netty, httpclient, commons-*, slf4j) are left out, as is
``wildfly-openssl`` (only for ``fs.s3a.ssl.channel.mode=openssl``). Resolved with
``tests/_maven.py`` into ``~/.cache/deltaflow/jars/``; sessions then load the files with
``spark.jars`` and the driver/executor class paths, no per-session Ivy resolution.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from deltaflow.testing._seaweedfs import S3A_CLASS  # noqa: F401  (the tests name it here)
from tests import _maven

# The AWS SDK v2 version each hadoop-aws pins (hadoop-project's aws-java-sdk-v2.version).
SDK_VERSIONS = {"3.5.0": "2.35.4", "3.4.2": "2.29.52"}
EXCLUDES = (
    "software.amazon.awssdk:bundle",
    "org.wildfly.openssl:wildfly-openssl",
    "commons-logging:commons-logging",
)


class NoJarSet(RuntimeError):
    """No tested S3A jar set for this Hadoop (Spark 4.0's 3.4.1: Maven Central has no
    ``s3-transfer-manager`` at the SDK version it pins)."""


def cache_dir() -> Path:
    return Path.home() / ".cache" / "deltaflow" / "jars"


def hadoop_version() -> str:
    """The Hadoop version the pyspark wheel ships (``hadoop-client-api-<v>.jar``)."""
    found = sorted(_maven.pyspark_jars().glob("hadoop-client-api-*.jar"))
    if not found:
        raise RuntimeError(f"no hadoop-client-api jar in {_maven.pyspark_jars()}")
    match = re.search(r"hadoop-client-api-(.+)\.jar$", found[-1].name)
    assert match is not None
    return match.group(1)


def s3a_jars() -> list[Path]:
    """hadoop-aws and the SDK modules it needs, less what pyspark ships (resolved once)."""
    hadoop = hadoop_version()
    sdk = SDK_VERSIONS.get(hadoop)
    if sdk is None:
        raise NoJarSet(
            f"no tested S3A jar set for Hadoop {hadoop}: add the AWS SDK version its"
            " hadoop-aws pins (hadoop-project's aws-java-sdk-v2.version) to SDK_VERSIONS"
        )
    modules = [
        f"org.apache.hadoop:hadoop-aws:{hadoop}",
        *(f"software.amazon.awssdk:{m}:{sdk}" for m in ("s3", "sts", "s3-transfer-manager")),
    ]
    jars = _maven.resolve(f"s3a-{hadoop}", modules, cache_dir(), EXCLUDES)
    if jars is None:
        raise RuntimeError(f"Maven Central lacks one of {modules}")
    shipped = {_maven.artifact(j) for j in _maven.pyspark_jars().glob("*.jar")}
    return [j for j in jars if _maven.artifact(j) not in shipped]


def s3a_conf(endpoint: str, access_key: str, secret_key: str, region: str) -> dict[str, str]:
    """Spark settings: the S3A jars on every class path, ``fs.s3a.*`` for a path-style,
    plain-HTTP endpoint, and ``s3://`` mapped to S3A (as EMR's users write it)."""
    from deltaflow.testing._seaweedfs import s3a_settings

    jars = [str(j) for j in s3a_jars()]
    return s3a_settings(jars, endpoint, access_key, secret_key, region)


def s3a_jars_or_skip() -> list[str]:
    """:func:`s3a_jars` as strings, or the calling test skipped with the reason no S3A jar
    set can be had (Maven Central unreachable, or no tested set for this pyspark's Hadoop)."""
    import pytest

    from tests.reference._env import ReferenceUnavailable

    try:
        return [str(j) for j in s3a_jars()]
    except ReferenceUnavailable as unreachable:
        pytest.skip(f"Maven Central is unreachable, so no S3A jars: {unreachable}")
    except NoJarSet as missing:
        pytest.skip(f"no S3A jar set is tested for this pyspark's Hadoop: {missing}")


def s3a_conf_or_skip(store: Any) -> dict[str, str]:
    """:func:`s3a_conf` for ``store`` (the tests' SeaweedFS), or the test skipped as
    :func:`s3a_jars_or_skip` says."""
    from deltaflow.testing._seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, s3a_settings

    return s3a_settings(s3a_jars_or_skip(), store.endpoint, ACCESS_KEY, SECRET_KEY, REGION)


def with_s3a(base: dict[str, str], s3a: dict[str, str]) -> dict[str, str]:
    """``base`` (e.g. ``deltaflow.spark_conf()``) with ``s3a``'s settings added; the jar
    lists and class paths joined, not replaced."""
    merged = {**base, **s3a}
    for key, sep in (
        ("spark.jars", ","),
        ("spark.driver.extraClassPath", ":"),
        ("spark.executor.extraClassPath", ":"),
    ):
        if base.get(key) and s3a.get(key):
            merged[key] = base[key] + sep + s3a[key]
    return merged


if __name__ == "__main__":
    # `make demo STORAGE=s3`: the jar list (comma-separated) for the demo's --s3a-jars, or
    # nothing (and why, on stderr) where no S3A jar set can be had: the demo then keeps
    # to deltaflow's Python path on S3, as on a cluster without hadoop-aws.
    import sys

    try:
        print(",".join(str(j) for j in s3a_jars()))
    except Exception as unavailable:  # offline, or no tested set for this Hadoop
        print(f"no S3A jars for the demo: {unavailable}", file=sys.stderr)
