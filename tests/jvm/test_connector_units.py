"""The JVM sources' own unit tests (jvm/src/test/scala), compiled and run on this JRE."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from deltaflow.spark import _jar

_OPENED_PACKAGES = ("java.lang", "java.lang.invoke", "java.nio", "java.util", "sun.nio.ch")


def test_connector_unit_tests_pass(tmp_path: Path) -> None:
    jar = _jar.jar_path()
    sources = sorted(str(p) for p in (_jar.sources_dir() / "test" / "scala").rglob("*.scala"))
    assert sources, "no JVM test sources found"
    classpath = os.pathsep.join([str(jar), str(_jar.pyspark_jars_dir() / "*")])
    _jar.scalac(sources, classpath, tmp_path)
    result = subprocess.run(
        [
            _jar.java_executable(),
            # As Spark opens them for itself (its launcher's JavaModuleOptions): Kryo, used by
            # a serializer test, reaches into java.nio's buffers.
            *(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in _OPENED_PACKAGES),
            "-cp",
            os.pathsep.join([str(tmp_path), classpath]),
            "io.deltaflow.spark.ConnectorTests",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("21 passed, 0 failed"), result.stdout


def test_version_directories_are_chosen_by_the_spark_minor(tmp_path: Path) -> None:
    for part in ("scala", "scala-spark-4.0", "scala-spark-4.1+", "scala-spark-4.1-4.2", "other"):
        (tmp_path / "main" / part).mkdir(parents=True)
        (tmp_path / "main" / part / f"{part}.scala").write_text("")

    def chosen(version: tuple[int, int]) -> list[str]:
        return [p.parent.name for p in _jar.scala_sources(tmp_path, version)]

    assert chosen((4, 0)) == ["scala", "scala-spark-4.0"]
    assert chosen((4, 1)) == ["scala", "scala-spark-4.1+", "scala-spark-4.1-4.2"]
    assert chosen((4, 2)) == ["scala", "scala-spark-4.1+", "scala-spark-4.1-4.2"]
    assert chosen((4, 3)) == ["scala", "scala-spark-4.1+"]


def test_every_spark_minor_gets_one_variant_of_each_versioned_file() -> None:
    # A file that varies by version must exist, under the same relative path, for every
    # supported minor: otherwise the common code calls a name one Spark's jar lacks.
    root = _jar.sources_dir()
    variants = {}
    for minor in range(0, 4):
        files = [p for p in _jar.scala_sources(root, (4, minor)) if p.parent != root / "main"]
        versioned = sorted(
            str(p.relative_to(root / "main" / p.relative_to(root / "main").parts[0]))
            for p in files
            if p.relative_to(root / "main").parts[0] != "scala"
        )
        assert len(versioned) == len(set(versioned)), f"4.{minor}: two variants of a file"
        variants[minor] = versioned
    assert variants[0], "no versioned sources found"
    assert all(v == variants[0] for v in variants.values()), variants
