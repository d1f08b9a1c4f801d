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

from tests import _maven

# The AWS SDK v2 version each hadoop-aws pins (hadoop-project's aws-java-sdk-v2.version).
SDK_VERSIONS = {"3.5.0": "2.35.4", "3.4.2": "2.29.52"}
EXCLUDES = (
    "software.amazon.awssdk:bundle",
    "org.wildfly.openssl:wildfly-openssl",
    "commons-logging:commons-logging",
)
S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"


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
    jars = s3a_jars()
    classpath = ":".join(str(j) for j in jars)
    hadoop = {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": region,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": access_key,
        "fs.s3a.secret.key": secret_key,
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3.impl": S3A_CLASS,
        "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    return {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        **{f"spark.hadoop.{k}": v for k, v in hadoop.items()},
    }


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
