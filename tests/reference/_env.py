"""The reference environment: the newest delta-spark and the pyspark it supports, on demand.

deltaflow's own venv runs the newest pyspark, which delta-spark may not support yet, so the
reference lives in a venv of its own under ``~/.cache/deltaflow/reference/`` (or
``$DELTAFLOW_REFERENCE_CACHE``), created once from PyPI with the ordinary ``pip``. delta-spark's
jars come from Maven Central through Spark's own Ivy resolver (the one
``configure_spark_with_delta_pip`` uses) into an Ivy cache pinned beside the venv; after the
first resolution the resolved jar files are recorded and later sessions load them with
``spark.jars`` without touching the network.

Creation takes a file lock: two pytest workers (``-n 2``) may ask at once, and the second
waits for the first instead of building a second copy. A half-built venv (an interrupted
first run) has no completion marker and is rebuilt.

Entry points: :func:`reference_python` (the venv's interpreter), :func:`reference_jars` (the
resolved jar files), :func:`reference_spark_conf` (the Spark settings a delta-spark session
needs), :class:`ReferenceUnavailable` (raised, with the registry's own error, only when PyPI
or Maven Central could not be reached). To move to a newer delta-spark, change
``DELTA_SPARK_VERSION`` and ``PYSPARK_VERSION`` together (docs/contributing.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# The newest delta-spark on both registries: PyPI has 4.4.1, but Maven Central has no 4.4.1
# jars (its newest is 4.4.0, 2026-11-28), and the Python package must match its jars.
# delta-spark 4.4.0 declares pyspark>=4.0.1,<=4.2.0: 4.2.0 is the newest pyspark it supports.
DELTA_SPARK_VERSION = "4.4.0"
PYSPARK_VERSION = "4.2.0"

# Spark settings every delta-spark session needs (delta-spark's README and docs).
DELTA_SPARK_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_COMPLETE = ".complete"
# Seconds a first creation may take: the pyspark wheel alone is ~430 MB.
_INSTALL_TIMEOUT = 1800.0
_RESOLVE_TIMEOUT = 600.0

# What pip, Ivy and the JVM say when the network, not the request, failed. A failure that
# matches none of these is a real error and is raised as such, never turned into a skip.
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|ConnectTimeout|Read timed out|Network is unreachable"
    r"|Connection refused|UnknownHostException|ConnectException|SocketTimeoutException"
    r"|NoRouteToHostException"
)


class ReferenceUnavailable(RuntimeError):
    """PyPI or Maven Central could not be reached, so the reference cannot be built here."""


def cache_root() -> Path:
    """Where every reference environment lives (``$DELTAFLOW_REFERENCE_CACHE`` overrides)."""
    configured = os.environ.get("DELTAFLOW_REFERENCE_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "deltaflow" / "reference"
    root.mkdir(parents=True, exist_ok=True)
    return root


def environment_dir() -> Path:
    """This version pair's folder: the venv in ``venv/``, the resolved jars listed in
    ``jars.json``. The Python minor version is part of the name (a venv is bound to it)."""
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return cache_root() / f"delta-spark-{DELTA_SPARK_VERSION}_pyspark-{PYSPARK_VERSION}_{python}"


def ivy_dir() -> Path:
    """The Ivy cache delta-spark's jars resolve into, shared by every version pair."""
    return cache_root() / "ivy"


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    lock_path = cache_root() / f".{name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(command: list[str], timeout: float, what: str) -> None:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        if _UNREACHABLE.search(output):
            raise ReferenceUnavailable(f"{what}: the registry is unreachable here:\n{output}")
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{output}")
    print(f"reference: {what} took {time.monotonic() - started:.0f} s", file=sys.stderr)


def reference_python() -> Path:
    """The reference venv's interpreter, with ``delta-spark`` and ``pyspark`` installed.

    Built on first use (``python -m venv`` + ``pip install``), then reused; raises
    :class:`ReferenceUnavailable` when PyPI cannot be reached."""
    env = environment_dir()
    python = env / "venv" / "bin" / "python"
    if (env / _COMPLETE).exists():
        return python
    with _locked(env.name):
        if (env / _COMPLETE).exists():
            return python
        shutil.rmtree(env, ignore_errors=True)
        env.mkdir(parents=True)
        _run([sys.executable, "-m", "venv", str(env / "venv")], 300.0, "creating the venv")
        _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                f"delta-spark=={DELTA_SPARK_VERSION}",
                f"pyspark=={PYSPARK_VERSION}",
            ],
            _INSTALL_TIMEOUT,
            f"pip install delta-spark=={DELTA_SPARK_VERSION} pyspark=={PYSPARK_VERSION}",
        )
        (env / _COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return python


# Run by the reference venv's Python: start a delta-spark session the way delta-spark's
# README does (configure_spark_with_delta_pip adds the Maven coordinates; Ivy resolves them
# into the pinned cache) and print the local jar files spark-submit resolved.
_RESOLVE_SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
from delta import configure_spark_with_delta_pip
builder = (SparkSession.builder.master("local[1]").appName("deltaflow-reference-resolve")
           .config("spark.ui.enabled", "false").config("spark.jars.ivy", sys.argv[1]))
spark = configure_spark_with_delta_pip(builder).getOrCreate()
jars = spark.sparkContext.getConf().get("spark.jars", "")
spark.stop()
print("JARS=" + json.dumps([j for j in jars.split(",") if j]))
"""


def reference_jars() -> list[Path]:
    """delta-spark's jar files (delta-spark, delta-storage and what they need beyond Spark),
    resolved from Maven Central once and then read from the cache."""
    env = environment_dir()
    listing = env / "jars.json"
    python = reference_python()
    with _locked(env.name + ".jars"):
        if listing.exists():
            jars = [Path(j) for j in json.loads(listing.read_text())]
            if jars and all(j.exists() for j in jars):
                return jars
        started = time.monotonic()
        done = subprocess.run(
            [str(python), "-c", _RESOLVE_SCRIPT, str(ivy_dir())],
            capture_output=True,
            text=True,
            timeout=_RESOLVE_TIMEOUT,
            check=False,
        )
        found = re.search(r"^JARS=(.*)$", done.stdout, re.MULTILINE)
        if done.returncode != 0 or not found:
            output = (done.stdout + done.stderr)[-4000:]
            if _UNREACHABLE.search(output):
                raise ReferenceUnavailable(
                    f"resolving delta-spark {DELTA_SPARK_VERSION}'s jars from Maven Central "
                    f"failed:\n{output}"
                )
            raise RuntimeError(f"starting a delta-spark session failed:\n{output}")
        jars = [Path(j.removeprefix("file:")) for j in json.loads(found.group(1))]
        # io.delta_delta-spark_<spark minor>_<scala>-<version>.jar since delta-spark 4.1.
        if not any("delta-spark_" in j.name for j in jars):
            raise RuntimeError(f"delta-spark's jar is missing from the resolved jars: {jars}")
        listing.write_text(json.dumps([str(j) for j in jars]))
        print(f"reference: resolving jars took {time.monotonic() - started:.0f} s", file=sys.stderr)
        return jars


def reference_spark_conf() -> dict[str, str]:
    """The settings a delta-spark session in the reference venv needs, jars included (local
    files: no network at session start)."""
    return {**DELTA_SPARK_CONF, "spark.jars": ",".join(str(j) for j in reference_jars())}


if __name__ == "__main__":
    # `python -m tests.reference._env` builds (or finds) the environment and prints it.
    print(reference_python())
    for jar in reference_jars():
        print(jar)
