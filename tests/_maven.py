"""Jars from Maven Central for tests and benchmarks, resolved once with the Ivy pyspark ships.

The Ivy CLI (``pyspark/jars/ivy-*.jar``, run as ``java -jar``; Maven Central is its default
public resolver) resolves a set of modules into an Ivy cache under ``cache_dir`` and the
resulting class path is recorded in a JSON file beside it, so later runs start without touching
the network and without Spark's per-session ``spark.jars.packages`` resolution. Maven Central
is the only registry reached; when it cannot be reached, :class:`ReferenceUnavailable` says so
(tests skip on it); any other failure is raised as an error.

Entry points: :func:`resolve` (modules, global excludes, a cache folder -> jar files or None),
:func:`pyspark_jars`, :func:`artifact` (a jar file's artifact name, to leave out what pyspark
already ships). Used by ``tests/reference/_kafka.py`` (Spark's Kafka connector, a broker) and
``tests/_s3a.py`` (Hadoop's S3A and the AWS SDK modules it needs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import quoteattr

from tests.reference._env import _UNREACHABLE, ReferenceUnavailable, _locked

_RESOLVE_TIMEOUT = 600.0


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def ivy_jar() -> Path:
    found = sorted(pyspark_jars().glob("ivy-*.jar"))
    if not found:
        raise RuntimeError(f"pyspark ships no Ivy jar in {pyspark_jars()}")
    return found[-1]


def artifact(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[\w.\-]*$", "", jar.stem)


def _ivy_file(modules: Sequence[str], excludes: Sequence[str]) -> str:
    deps = []
    for module in modules:
        org, name, rev = module.split(":")
        deps.append(
            f"<dependency org={quoteattr(org)} name={quoteattr(name)} rev={quoteattr(rev)}"
            ' conf="default->default"/>'
        )
    for exclude in excludes:
        org, name = exclude.split(":")
        deps.append(f"<exclude org={quoteattr(org)} module={quoteattr(name)}/>")
    return (
        '<ivy-module version="2.0"><info organisation="deltaflow" module="test-jars"/>'
        '<configurations><conf name="default"/></configurations>'
        f"<dependencies>{''.join(deps)}</dependencies></ivy-module>"
    )


def resolve(
    name: str,
    modules: Sequence[str],
    cache_dir: Path,
    excludes: Sequence[str] = (),
) -> list[Path] | None:
    """The class path of ``modules`` (``org:module:version``, their default confs, transitive,
    less ``excludes`` ``org:module``), resolved by Ivy from Maven Central into
    ``cache_dir/ivy`` and recorded as ``cache_dir/<name>.json``; None when Maven Central does
    not have one of them."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    listing = cache_dir / f"{name}.json"
    with _locked(f"{cache_dir.name}-{name}"):
        if listing.exists():
            jars = [Path(j) for j in json.loads(listing.read_text())]
            if jars and all(j.exists() for j in jars):
                return jars
        out = listing.with_suffix(".classpath")
        ivy_xml = listing.with_suffix(".ivy.xml")
        ivy_xml.write_text(_ivy_file(modules, excludes))
        started = time.monotonic()
        done = subprocess.run(
            [
                "java",
                "-jar",
                str(ivy_jar()),
                "-ivy",
                str(ivy_xml),
                "-confs",
                "default",
                "-cache",
                str(cache_dir / "ivy" / "cache"),
                "-cachepath",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=_RESOLVE_TIMEOUT,
            check=False,
        )
        ivy_xml.unlink()
        output = (done.stdout + done.stderr)[-4000:]
        if done.returncode != 0 or not out.exists():
            if _UNREACHABLE.search(output):
                raise ReferenceUnavailable(
                    f"resolving {', '.join(modules)} from Maven Central failed:\n{output}"
                )
            if "not found" in output:
                return None
            raise RuntimeError(f"Ivy failed to resolve {', '.join(modules)}:\n{output}")
        jars = [Path(j) for j in out.read_text().strip().split(os.pathsep) if j]
        out.unlink()
        listing.write_text(json.dumps([str(j) for j in jars]))
        print(
            f"maven: resolving {name} took {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        return jars
