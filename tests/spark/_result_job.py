"""Run a test's child job (``tests/spark/_*_job.py``) in its own Python and Spark, and
read the one JSON result it prints as ``RESULT <json>`` on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def run_result_job(
    job: str, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 420
) -> tuple[Any, str]:
    """The ``RESULT`` of ``tests/spark/<job>`` run with ``args`` in ``cwd`` (its warehouse
    and catalog go there), and its stderr; fails with the stderr's tail when the job
    failed or printed no result. ``env`` is added to this process's environment, with the
    repository on ``PYTHONPATH`` and this interpreter for Spark's Python workers."""
    full_env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / job), *args],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :]), proc.stderr
