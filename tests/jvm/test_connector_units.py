"""The JVM sources' own unit tests (jvm/src/test/scala), compiled and run on this JRE."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from deltaflow.spark import _jar


def test_connector_unit_tests_pass(tmp_path: Path) -> None:
    jar = _jar.jar_path()
    sources = sorted(str(p) for p in (_jar.sources_dir() / "test" / "scala").rglob("*.scala"))
    assert sources, "no JVM test sources found"
    classpath = os.pathsep.join([str(jar), str(_jar.pyspark_jars_dir() / "*")])
    _jar.scalac(sources, classpath, tmp_path)
    result = subprocess.run(
        [
            _jar.java_executable(),
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
    assert result.stdout.strip().endswith("6 passed, 0 failed"), result.stdout
