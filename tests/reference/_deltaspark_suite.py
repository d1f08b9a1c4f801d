"""Runs delta-spark's own Python API tests against deltaflow, through the import shim.

delta-spark's tests (``python/delta/tests`` of delta-io/delta: ``test_deltatable.py`` and
``test_sql.py``, 48 tests) are not in any package a registry serves: neither the
``delta-spark`` wheel nor its sdist on PyPI holds them, and nothing else this project's
machines reach does. So they are not downloaded here; :func:`find_suite` looks for a copy
the developer put in place (``DELTAFLOW_DELTA_SPARK_TESTS``, or
``~/.cache/deltaflow/reference/delta-spark-tests/``), and the test using it skips,
saying so, when there is none. ``docs/benchmarks.md`` says how to put them there.

The tests run unchanged, in a subprocess whose ``PYTHONPATH`` is the shim
(``tests/reference/delta_shim``: a ``delta`` package whose ``delta.tables`` is
``deltaflow.tables``, ``delta.exceptions`` is ``deltaflow.exceptions``, and whose
``DeltaTestCase`` starts its session with ``deltaflow.spark_conf()``) and deltaflow.
pyspark's own inherited ``test_assert_classic_mode`` is left out: it is not delta-spark's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import deltaflow

SUITE_FILES = ("test_deltatable.py", "test_sql.py")
SUITE_SIZE = 48  # delta-spark 4.4's tests in those two files
ENV_VAR = "DELTAFLOW_DELTA_SPARK_TESTS"
CACHE_DIR = Path.home() / ".cache" / "deltaflow" / "reference" / "delta-spark-tests"
SHIM = Path(__file__).resolve().parent / "delta_shim"
# How long the whole suite may take (13 min measured at load ~20 on 2 cores).
TIMEOUT_SECONDS = 3600


@dataclass(frozen=True)
class SuiteResult:
    passed: tuple[str, ...]
    failed: dict[str, str]  # test name -> the first line of its failure
    skipped: tuple[str, ...]
    output: str


def find_suite() -> Path | None:
    """The directory holding delta-spark's test files, or None."""
    candidates = [Path(os.environ[ENV_VAR])] if os.environ.get(ENV_VAR) else []
    candidates.append(CACHE_DIR)
    for root in candidates:
        if not root.is_dir():
            continue
        for name in SUITE_FILES:
            found = sorted(root.rglob(name))
            if found:
                folder = found[0].parent
                if all((folder / n).is_file() for n in SUITE_FILES):
                    return folder
    return None


def run_suite(folder: Path, workdir: Path) -> SuiteResult:
    """Run the suite's files from ``folder`` against deltaflow; parse pytest's JUnit XML."""
    run_dir = workdir / "delta-tests"
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in SUITE_FILES:
        shutil.copy(folder / name, run_dir / name)
    report = workdir / "report.xml"
    source_root = str(Path(deltaflow.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SHIM), source_root]),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "-o", "addopts=", "-o", "timeout=0", "--rootdir", str(run_dir),
        "-k", "not test_assert_classic_mode", f"--junitxml={report}", *SUITE_FILES,
    ]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    if not report.exists():
        raise RuntimeError(f"delta-spark's suite did not run:\n{done.stdout}\n{done.stderr}")
    return _parse(report, done.stdout + done.stderr)


def _parse(report: Path, output: str) -> SuiteResult:
    passed, skipped, failed = [], [], {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            passed.append(name)
        elif outcome.tag == "skipped":
            skipped.append(name)
        else:
            failed[name] = (
                (outcome.get("message") or "").splitlines()[0][:300]
                if outcome.get("message")
                else outcome.tag
            )
    return SuiteResult(tuple(passed), failed, tuple(skipped), output)


def main() -> None:
    """``python -m tests.reference._deltaspark_suite``: run it and print the outcome."""
    folder = find_suite()
    if folder is None:
        raise SystemExit(f"delta-spark's tests not found (set {ENV_VAR} or fill {CACHE_DIR})")
    with tempfile.TemporaryDirectory() as work:
        result = run_suite(folder, Path(work))
    print(f"{len(result.passed)} passed, {len(result.failed)} failed")
    for name, reason in sorted(result.failed.items()):
        print(f"FAILED {name}: {reason}")


if __name__ == "__main__":
    main()
