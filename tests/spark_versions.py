"""The core suite on the newest patch of each older Spark 4.x minor (``make test-spark-versions``).

deltaflow compiles its connector against whatever pyspark is installed, so it serves every
Spark 4.x; the full suite runs on the newest pyspark (the project's ``.venv``), and this
script runs the core suite (:data:`CORE_TESTS`) once per version in :data:`OLDER_SPARK`,
each in a side virtualenv of its own:

``~/.cache/deltaflow/spark-versions/<version>/venv`` (``$XDG_CACHE_HOME`` honoured) holds
that pyspark and deltaflow's other dependencies (``pyproject.toml``'s ``dependencies`` and
``dev`` extras), installed from PyPI with pip the first time and reused while the
requirement list is unchanged (a stamp file holds its hash). deltaflow itself is not
installed there: the tests import this checkout's ``src/`` through ``PYTHONPATH``, and the
connector jar is built for that pyspark by ``deltaflow.spark._jar`` (keyed by sources and
pyspark version, so the jars of every version sit side by side in ``src/deltaflow/_jvm``).

Usage: ``python tests/spark_versions.py [VERSION ...] [-- PYTEST ARGS]``; with no version,
every one in :data:`OLDER_SPARK`. Exit status 0 only when every version passed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # deltaflow's own dependencies include tomli there
    import tomli as tomllib

# The newest patch of each Spark 4.x minor older than the one in the project's .venv
# (`pip index versions pyspark`, 2026-11-28). Bump a patch when a newer one ships.
OLDER_SPARK = ("4.0.5", "4.1.4", "4.2.1")

# The core suite: batch read and write, SQL and SQL DML, DeltaTable DML, streaming source
# and sink (a path and a catalog table), a pipeline. 180 tests, ~380-420 CPU-seconds per
# version: ~4 minutes on 2 quiet cores (docs/architecture.md, "Every Spark 4.x").
CORE_TESTS = (
    "tests/spark/test_session.py",
    "tests/spark/test_patches.py",
    "tests/spark/test_read.py",
    "tests/spark/test_write.py",
    "tests/spark/test_sql.py",
    "tests/spark/test_sql_dml.py",
    "tests/spark/test_delta_table.py",
    "tests/spark/test_merge.py",
    "tests/spark/test_stream_source.py",
    "tests/spark/test_streaming.py",
    "tests/spark/test_stream_to_table.py",
    "tests/pipelines/test_runner.py",
)

ROOT = Path(__file__).resolve().parents[1]


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "deltaflow" / "spark-versions"


def requirements(version: str) -> list[str]:
    """deltaflow's dependencies and dev extras, with pyspark pinned to ``version``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    pinned = [r for r in wanted if not r.replace(" ", "").lower().startswith("pyspark")]
    return [f"pyspark=={version}", *pinned]


def _venv_python_version(home: Path) -> str | None:
    """The Python version a virtualenv was made with (its ``pyvenv.cfg``), if it has one."""
    config = home / "pyvenv.cfg"
    if not config.is_file():
        return None
    for line in config.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return value.strip()
    return None


def ensure_venv(version: str) -> Path:
    """The side virtualenv for pyspark ``version``, created or updated when needed.

    One process at a time per version (a lock file beside the venv). The venv is made
    afresh when it is missing, broken (no ``bin/python``) or made with another Python
    than the one running this script; its packages are (re)installed from PyPI when the
    requirement list changed or an earlier install did not finish (no stamp)."""
    home = cache_root() / version / "venv"
    python = home / "bin" / "python"
    wanted = requirements(version)
    digest = hashlib.sha256(json.dumps([sys.version, wanted]).encode()).hexdigest()[:16]
    stamp = home / ".deltaflow-requirements"
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if python.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            return python
        started = time.monotonic()
        if not python.is_file() or _venv_python_version(home) != platform.python_version():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True
            )
        stamp.unlink(missing_ok=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--retries", "10", *wanted],
            check=True,
        )
        stamp.write_text(digest + "\n")
    print(
        f"spark-versions: venv for pyspark {version} ready in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return python


def run_version(version: str, pytest_args: list[str]) -> bool:
    python = ensure_venv(version)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for key in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"):
        env.pop(key, None)  # the side venv's own pyspark and interpreter, not the caller's
    started = time.monotonic()
    subprocess.run([str(python), "-m", "deltaflow.spark._jar"], env=env, cwd=ROOT, check=True)
    command = [
        str(python),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        "--dist",
        "loadfile",
        "--durations=5",
        *CORE_TESTS,
        *pytest_args,
    ]
    print(f"spark-versions: pyspark {version}: {' '.join(command[1:])}", flush=True)
    result = subprocess.run(command, env=env, cwd=ROOT, check=False)
    print(
        f"spark-versions: pyspark {version}: exit {result.returncode}"
        f" in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return result.returncode == 0


def main(argv: list[str]) -> int:
    pytest_args: list[str] = []
    if "--" in argv:
        argv, pytest_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    versions = argv or list(OLDER_SPARK)
    failed = [v for v in versions if not run_version(v, pytest_args)]
    if failed:
        print(f"spark-versions: the core suite failed on pyspark {', '.join(failed)}")
        return 1
    print(f"spark-versions: the core suite passed on pyspark {', '.join(versions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
