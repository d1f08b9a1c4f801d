"""The core suite on the newest patch of each older Spark 4.x minor (``make test-spark-versions``).

deltaflow compiles its connector against whatever pyspark is installed, so it serves every
Spark 4.x; the full suite runs on the newest pyspark (the project's ``.venv``), and this
script runs the core suite (:data:`CORE_TESTS`) once per version in :data:`OLDER_SPARK`,
each in a side virtualenv of its own:

``~/.cache/deltaflow/spark-versions/<version>/venv`` (``$XDG_CACHE_HOME`` honoured) holds
that pyspark and py4j, its one dependency, and nothing else: every other package comes from
the environment that runs this script (the project's ``.venv``, which ``make`` built from
``pyproject.toml``), through a ``.pth`` file that appends that environment's site-packages
*after* the side venv's own, so the side venv's pyspark is the one imported. Only pyspark
differs between the two runs, and a side venv costs one ~430 MB pyspark sdist download
and wheel build instead of deltaflow's whole dependency tree (docs/architecture.md, "Every
Spark 4.x"). A probe checks, each run, that the side interpreter imports its own pyspark
and finds the rest. deltaflow itself is not installed there: the tests import this
checkout's ``src/`` through ``PYTHONPATH``, and the connector jar is built for that pyspark
by ``deltaflow.spark._jar`` (keyed by sources and pyspark version, so the jars of every
version sit side by side in ``src/deltaflow/_jvm``).

The side venvs are prepared together (their downloads overlap), then each version builds
its jar and runs its core suite in turn (two pytest processes, as the full suite does).

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
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The newest patch of each Spark 4.x minor older than the one in the project's .venv
# (`pip index versions pyspark`, 2026-11-28). Bump a patch when a newer one ships.
OLDER_SPARK = ("4.0.5", "4.1.4", "4.2.1")

# The core suite: batch read and write, SQL and SQL DML, DeltaTable DML, streaming source
# and sink (a path and a catalog table), a pipeline, real-time mode's source and sink. 180 tests
# before real-time mode was added, ~400-480 CPU-seconds per
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
    # Schema evolution of catalog writes: analyzer internals that differ between minors.
    "tests/spark/test_catalog_schema_evolution.py",
    "tests/pipelines/test_runner.py",
    # Real-time mode (Spark 4.1+; on 4.0 they assert the typed refusal and skip the rest).
    "tests/spark/test_realtime_source.py",
    "tests/spark/test_realtime_sink.py",
)

ROOT = Path(__file__).resolve().parents[1]


# What a side venv holds and how it reaches the rest; part of the stamp, so a venv of an
# earlier layout (one that held every dependency) is made afresh.
LAYOUT = "pyspark+py4j, the caller's site-packages through a .pth"
BASE_PTH = "deltaflow-base-environment.pth"


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "deltaflow" / "spark-versions"


def base_site_dirs() -> list[str]:
    """The site-packages of the environment running this script (the project's ``.venv``)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


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


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


# Run by the side interpreter: which pyspark it imports, and that the caller's packages
# (deltaflow's dependencies and the test tools) are reachable through the .pth.
_PROBE = """
import importlib.metadata, json, pyspark, py4j, pytest, xdist, deltalake, pyarrow, pandas
print(json.dumps([pyspark.__version__, importlib.metadata.version("pyspark"), pyspark.__file__]))
"""


def _probe(python: Path, version: str, home: Path) -> None:
    """Fail, saying why, unless ``python`` imports pyspark ``version`` from ``home``."""
    out = subprocess.run(
        [str(python), "-c", _PROBE], capture_output=True, text=True, env=_side_env()
    )
    if out.returncode != 0:
        raise SystemExit(
            f"spark-versions: the side venv {home} cannot import deltaflow's dependencies"
            f" through {BASE_PTH} ({', '.join(base_site_dirs())}): run this script with the"
            f" project's venv (make test-spark-versions).\n{out.stderr.strip()}"
        )
    imported, installed, where = json.loads(out.stdout)
    if (
        imported != version
        or installed != version
        or not Path(where).resolve().is_relative_to(home.resolve())
    ):
        raise SystemExit(
            f"spark-versions: the side venv {home} imports pyspark {imported} (metadata"
            f" {installed}) from {where}, not pyspark {version} of its own"
        )


def ensure_venv(version: str) -> Path:
    """The side virtualenv for pyspark ``version``, created when needed; its interpreter.

    One process at a time per version (a lock file beside the venv). The venv is made
    afresh when it is missing, broken (no ``bin/python``), made with another Python than
    the one running this script, of an earlier layout, or an install did not finish (the
    stamp is written last). pyspark is installed with the caller's pip (``pip --python``)
    before the ``.pth`` exists, so pip sees an empty venv and installs pyspark's py4j
    there too. The ``.pth`` is rewritten on every call: it names the caller's
    environment."""
    home = cache_root() / version / "venv"
    python = home / "bin" / "python"
    digest = hashlib.sha256(json.dumps([sys.version, LAYOUT, version]).encode()).hexdigest()[:16]
    stamp = home / ".deltaflow-requirements"
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        fresh = not (
            python.is_file()
            and stamp.is_file()
            and stamp.read_text().strip() == digest
            and _venv_python_version(home) == platform.python_version()
        )
        started = time.monotonic()
        if fresh:
            subprocess.run(
                [sys.executable, "-m", "venv", "--clear", "--without-pip", str(home)], check=True
            )
            subprocess.run(
                [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                 "--retries", "10", f"pyspark=={version}"],
                check=True,
            )  # fmt: skip
        pth = _site_packages(python) / BASE_PTH
        lines = "".join(f"{d}\n" for d in base_site_dirs())
        if not pth.is_file() or pth.read_text() != lines:
            pth.write_text(lines)
        _probe(python, version, home)
        if fresh:
            stamp.write_text(digest + "\n")
            print(
                f"spark-versions: venv for pyspark {version} ready in"
                f" {time.monotonic() - started:.0f} s",
                flush=True,
            )
    return python


def prepare(versions: list[str]) -> dict[str, Path]:
    """Every version's side venv, made at once: most of a venv's time is its pyspark
    download, which overlaps well; then each version runs on its own."""
    with ThreadPoolExecutor(max_workers=max(1, len(versions))) as pool:
        return dict(zip(versions, pool.map(ensure_venv, versions), strict=True))


def _side_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for key in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"):
        env.pop(key, None)  # the side venv's own pyspark and interpreter, not the caller's
    return env


def run_version(version: str, pytest_args: list[str], python: Path | None = None) -> bool:
    python = python or ensure_venv(version)
    env = _side_env()
    started = time.monotonic()
    subprocess.run([str(python), "-m", "deltaflow.spark._jar"], env=env, cwd=ROOT, check=True)
    built = time.monotonic()
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
        "--no-loadscope-reorder",  # tests/_schedule.py's longest-first order
        "--durations=5",
        *CORE_TESTS,
        *pytest_args,
    ]
    print(f"spark-versions: pyspark {version}: {' '.join(command[1:])}", flush=True)
    result = subprocess.run(command, env=env, cwd=ROOT, check=False)
    done = time.monotonic()
    print(
        f"spark-versions: pyspark {version}: exit {result.returncode} in {done - started:.0f} s"
        f" (jar {built - started:.0f} s, tests {done - built:.0f} s)",
        flush=True,
    )
    return result.returncode == 0


def main(argv: list[str]) -> int:
    pytest_args: list[str] = []
    if "--" in argv:
        argv, pytest_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    versions = argv or list(OLDER_SPARK)
    started = time.monotonic()
    pythons = prepare(versions)
    print(f"spark-versions: side venvs ready in {time.monotonic() - started:.0f} s", flush=True)
    failed = [v for v in versions if not run_version(v, pytest_args, pythons[v])]
    took = f"in {time.monotonic() - started:.0f} s"
    if failed:
        print(f"spark-versions: the core suite failed on pyspark {', '.join(failed)} {took}")
        return 1
    print(f"spark-versions: the core suite passed on pyspark {', '.join(versions)} {took}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
