"""dbt for the tests: a virtual environment of its own, created on first use under
``~/.cache/deltaflow/`` (``$XDG_CACHE_HOME`` respected) and reused after.

dbt-core 1.11 with dbt-spark 1.11 installs cleanly beside pyspark 4.3 (dbt-core 1.12 does
not install here), but its pins would move packages in the project's own environment, so
it lives apart, like a reference system. The ``thrift`` method needs only that
environment; the ``session`` method runs PySpark in dbt's process, so it runs dbt with this
environment's packages after the project's (pyspark, deltalake, deltaflow).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

REQUIREMENTS = ("dbt-core~=1.11.0", "dbt-spark[PyHive]~=1.11.0")
PROJECT = Path(__file__).parent / "project"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deltaflow"


def environment() -> Path:
    """The dbt environment's directory, created (pip, from PyPI) when missing."""
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    root = _cache_root() / f"dbt-1.11-py{version}"
    done = root / ".deltaflow-complete"
    if done.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second test process waits for the first
        if done.exists():
            return root
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=600)
        subprocess.run(
            [str(root / "bin" / "pip"), "install", "--quiet", *REQUIREMENTS],
            check=True,
            timeout=1800,
        )
        done.write_text("\n".join(REQUIREMENTS) + "\n")
    return root


def _site_packages(root: Path) -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(root / "lib" / version / "site-packages")


def run(
    args: list[str],
    profiles_dir: Path,
    *,
    cwd: Path,
    in_process_spark: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 1200,
) -> subprocess.CompletedProcess[str]:
    """``dbt <args>`` on the test project with ``profiles_dir``'s profiles.yml, in ``cwd``
    (where a Spark in dbt's process puts its files); output captured.
    ``in_process_spark``: the ``session`` method, run by dbt's Python with the project's
    packages (pyspark, deltalake, deltaflow) before dbt's own."""
    root = environment()
    environ = {
        **os.environ,
        # dbt's logs and artifacts go to cwd, never into the project's folder
        "DBT_LOG_PATH": str(cwd / "logs"),
        "DBT_TARGET_PATH": str(cwd / "target"),
        **(env or {}),
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
        "DBT_USE_COLORS": "false",
    }
    if in_process_spark:
        ours = sysconfig.get_paths()["purelib"]
        path = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        environ["PYTHONPATH"] = os.pathsep.join([*path, ours, _site_packages(root)])
        command = [str(root / "bin" / "python"), "-c", "from dbt.cli.main import cli; cli()"]
    else:
        command = [str(root / "bin" / "dbt")]
    return subprocess.run(
        [*command, *args, "--profiles-dir", str(profiles_dir), "--project-dir", str(PROJECT)],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
