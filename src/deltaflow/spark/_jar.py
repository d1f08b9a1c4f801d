"""Build the JVM connector's jar from its Scala sources with the compiler pyspark ships.

The pyspark wheel carries every Spark jar and the Scala 2.13 compiler
(``pyspark/jars/scala-compiler-*.jar``, used by ``spark-shell``), so deltaflow's
connector is compiled on the user's machine, on a plain JRE: no JDK, no Maven, no
network. ``jar_path()`` returns a jar built from exactly the sources shipped with
this deltaflow for exactly the installed pyspark, building it on first use.

Where the sources are: ``deltaflow/_jvm/src`` inside an installed wheel, or the
repository's ``jvm/`` in an editable install. Where the jar goes: next to the
package (``deltaflow/_jvm/``) when that directory is writable, else the user's
cache (``$XDG_CACHE_HOME/deltaflow`` or ``~/.cache/deltaflow``). Its name carries a
key hashed from the sources, the pyspark version and the Scala version, so a new
pyspark or an edited source builds a new jar and an unchanged one is reused.

One source tree serves every Spark 4.x. Where Spark's internal APIs differ between
minors, the code that differs lives in version directories beside ``main/scala``, and
:func:`scala_sources` picks the ones for the installed Spark: ``main/scala-spark-4.0``
is compiled only on Spark 4.0.x, ``main/scala-spark-4.1+`` on 4.1 and newer, and
``main/scala-spark-4.1-4.2`` on 4.1.x and 4.2.x. Each variant of a file defines the same
names, so the common code calls them without knowing the version.

Run ``python -m deltaflow.spark._jar`` to build it ahead of time (``make`` does).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from deltaflow.spark.errors import JvmBuildError

# The Scala binary version the sources are written for: Spark 4's.
SCALA_BINARY_VERSION = "2.13"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_SHIPPED_SOURCES = _PACKAGE_DIR / "_jvm" / "src"
_REPO_SOURCES = _PACKAGE_DIR.parent.parent / "jvm" / "src"
_JAR_PREFIX = "deltaflow-spark"
# scalac on 2 cores compiles the connector in 20-40 s; a second process waits for the first.
_LOCK_WAIT_SECONDS = 600.0
_STALE_SECONDS = 7 * 24 * 3600


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def sources_dir() -> Path:
    """The connector's source tree (``main/scala``, ``main/resources``)."""
    for candidate in (_SHIPPED_SOURCES, _REPO_SOURCES):
        if (candidate / "main" / "scala").is_dir():
            return candidate
    raise JvmBuildError(
        "deltaflow's JVM sources are missing: neither "
        f"{_SHIPPED_SOURCES} nor {_REPO_SOURCES} exists. Reinstall deltaflow"
        " (pip install --force-reinstall deltaflow).",
        step="sources",
    )


def _source_files(root: Path, part: str) -> list[Path]:
    base = root / part
    return sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []


# A version directory's name: scala-spark-<major.minor>, with `+` (and newer) or
# `-<major.minor>` (up to that minor, inclusive).
_VERSION_DIR = re.compile(r"^scala-spark-(\d+)\.(\d+)(?:(\+)|-(\d+)\.(\d+))?$")


def spark_minor() -> tuple[int, int]:
    """The installed pyspark's (major, minor)."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


def _selects(name: str, version: tuple[int, int]) -> bool:
    found = _VERSION_DIR.match(name)
    if found is None:
        return False
    low = (int(found[1]), int(found[2]))
    if found[3]:
        return version >= low
    high = (int(found[4]), int(found[5])) if found[4] else low
    return low <= version <= high


def scala_sources(root: Path, version: tuple[int, int]) -> list[Path]:
    """The ``.scala`` files compiled for Spark ``version``: ``main/scala`` and every
    version directory (``main/scala-spark-*``) whose range holds ``version``."""
    main = root / "main"
    versioned = sorted(d.name for d in main.iterdir() if d.is_dir() and _selects(d.name, version))
    parts = ["main/scala", *(f"main/{name}" for name in versioned)]
    return [p for part in parts for p in _source_files(root, part) if p.suffix == ".scala"]


def _scala_jars(jars: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name in ("scala-compiler", "scala-library", "scala-reflect"):
        matches = sorted(jars.glob(f"{name}-{SCALA_BINARY_VERSION}.*.jar"))
        if not matches:
            others = sorted(p.name for p in jars.glob(f"{name}-*.jar"))
            raise JvmBuildError(
                f"pyspark at {jars.parent} ships no {name} {SCALA_BINARY_VERSION}.x jar"
                f" (found: {', '.join(others) or 'none'}). deltaflow's connector is written"
                f" for Scala {SCALA_BINARY_VERSION} (Spark 4); install pyspark>=4.0,<5.",
                step="compiler",
            )
        found[name] = matches[-1]
    return found


def build_key() -> str:
    """A hash of the sources, the pyspark version and the Scala compiler jar's name."""
    import pyspark

    root = sources_dir()
    digest = hashlib.sha256()
    digest.update(pyspark.__version__.encode())
    digest.update(_scala_jars(pyspark_jars_dir())["scala-compiler"].name.encode())
    # Every file under main/ (the version directories of other Sparks too: cheap, and
    # the pyspark version above already tells which of them this jar holds).
    for path in _source_files(root, "main"):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _output_dirs() -> list[Path]:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deltaflow"
    return [_PACKAGE_DIR / "_jvm", cache]


def jar_path(build: bool = True) -> Path:
    """The connector jar for this deltaflow and pyspark, built now if it is missing."""
    name = f"{_JAR_PREFIX}-{build_key()}.jar"
    for directory in _output_dirs():
        if (directory / name).is_file():
            return directory / name
    if not build:
        raise JvmBuildError(
            f"deltaflow's connector jar {name} is not built yet: run"
            f" `{sys.executable} -m deltaflow.spark._jar`.",
            step="missing",
        )
    return _build(name)


def _writable_dir() -> Path:
    for directory in _output_dirs():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory):
                return directory
        except OSError:
            continue
    raise JvmBuildError(
        "no writable directory for deltaflow's connector jar: tried "
        + ", ".join(str(d) for d in _output_dirs())
        + ". Set XDG_CACHE_HOME to a writable directory.",
        step="output",
    )


def java_executable() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise JvmBuildError(
            "Java is not installed (no `java` on PATH, JAVA_HOME unset). Spark and"
            " deltaflow's connector need Java 17 or newer: `sudo apt-get install -y"
            " openjdk-17-jre-headless` (Debian/Ubuntu) or `brew install openjdk@17` (macOS).",
            step="java",
        )
    return found


def _build(name: str) -> Path:
    directory = _writable_dir()
    target = directory / name
    lock = directory / f".{name}.lock"
    deadline = time.monotonic() + _LOCK_WAIT_SECONDS
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if target.is_file():
                return target
            if time.monotonic() > deadline:
                raise JvmBuildError(
                    f"another process has been building {target} for over"
                    f" {_LOCK_WAIT_SECONDS:.0f} s; if none is, delete {lock}.",
                    step="lock",
                ) from None
            time.sleep(0.5)
    try:
        if not target.is_file():
            _compile_into(target)
            _remove_stale(directory, keep=target)
        return target
    finally:
        os.close(fd)
        lock.unlink(missing_ok=True)


def scalac(files: list[str], classpath: str, out: Path) -> None:
    """Compile Scala ``files`` into ``out`` with the compiler pyspark ships, on this JRE."""
    scala = _scala_jars(pyspark_jars_dir())
    command = [
        java_executable(),
        "-Xss8m",
        "-Xmx1g",
        "-cp",
        os.pathsep.join(str(p) for p in scala.values()),
        "scala.tools.nsc.Main",
        "-nowarn",
        "-release",
        "17",
        "-classpath",
        classpath,
        "-d",
        str(out),
        *files,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise JvmBuildError(
            f"scalac failed to compile {len(files)} files:\n"
            + (result.stdout + result.stderr)[-4000:],
            step="compile",
        )


def _compile_into(target: Path) -> None:
    root = sources_dir()
    scala_files = [str(p) for p in scala_sources(root, spark_minor())]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deltaflow-scalac-") as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        scalac(scala_files, str(pyspark_jars_dir() / "*"), classes)
        staging = target.with_name(target.name + f".{os.getpid()}.tmp")
        with zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: deltaflow\n")
            for path in sorted(classes.rglob("*")):
                if path.is_file():
                    jar.write(path, str(path.relative_to(classes)))
            resources = root / "main" / "resources"
            for path in _source_files(root, "main/resources"):
                jar.write(path, str(path.relative_to(resources)))
        os.replace(staging, target)
    print(
        f"deltaflow: built {target.name} in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )


def _remove_stale(directory: Path, keep: Path) -> None:
    # A running JVM may still read an older jar (its sources changed under it): only
    # jars unused for a week go.
    cutoff = time.time() - _STALE_SECONDS
    for old in directory.glob(f"{_JAR_PREFIX}-*.jar"):
        if old != keep and old.stat().st_atime < cutoff:
            old.unlink(missing_ok=True)


if __name__ == "__main__":
    print(jar_path())
