"""Every pyspark patch deltaflow still installs, in one table, with a version guard.

The connector (Spark's own extension points) does the work; these patches only add what a
PySpark caller cannot get from the JVM yet. Each row says which methods of which class a
module replaces and why; :func:`install` checks the pyspark version and that every method
is still where the patch expects it (failing loudly, naming the method, when an internal
moved), remembers the originals and runs the modules' installers; :func:`uninstall` puts
the originals back. Classic (py4j) sessions only: Spark Connect classes are not patched.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from deltaflow.spark.errors import PysparkCompatibilityError

# The pyspark versions these patches were written and tested against.
SUPPORTED_PYSPARK = ((4, 2), (5, 0))  # from, up to (excluded)
_FLAG_PREFIX = "_deltaflow"


@dataclass(frozen=True)
class Patch:
    cls: str  # module.Class
    methods: tuple[str, ...]
    module: str  # the deltaflow.spark module whose install function applies it
    installer: str
    why: str


PATCHES = (
    Patch(
        "pyspark.sql.readwriter.DataFrameReader",
        ("format", "schema", "option", "options", "load"),
        "read._compat",
        "install",
        "typed errors (missing table, bad version or option) where the caller called"
        " load(); a user-specified schema goes to the Python source",
    ),
    Patch(
        "pyspark.sql.readwriter.DataFrameWriter",
        (
            *("format", "mode", "option", "options", "partitionBy", "save"),
            *("parquet", "orc", "json", "csv", "text", "saveAsTable"),
        ),
        "write._compat",
        "install",
        "typed errors and skipped duplicate app transactions before any job;"
        " partitionBy as an option the Python writer reads",
    ),
    Patch(
        "pyspark.sql.session.SparkSession",
        ("sql",),
        "catalog._create",
        "install_sql_create",
        "CREATE TABLE t (columns) USING delta and INSERT into catalog tables, until"
        " issue 12's catalog extension",
    ),
    Patch(
        "pyspark.sql.readwriter.DataFrameWriter",
        ("insertInto",),
        "catalog._writes",
        "install",
        "insertInto a catalog table by its location, until issue 12's catalog extension",
    ),
    Patch(
        "pyspark.sql.streaming.readwriter.DataStreamWriter",
        ("toTable",),
        "stream._writer",
        "install_to_table",
        "toTable(name) as start(location) for Delta catalog tables, until issue 12",
    ),
    Patch(
        "pyspark.sql.streaming.readwriter.DataStreamWriter",
        ("format", "option", "options", "partitionBy", "start"),
        "stream._partitions",
        "install",
        "partitionBy as an option for the Python sink, which Spark refuses it for;"
        " the typed error of a Delta sink setting start() refused",
    ),
)

_originals: dict[tuple[str, str], Any] = {}


def _class(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def check() -> None:
    """Raise :class:`PysparkCompatibilityError` unless every patch can apply."""
    import pyspark

    version = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
    low, high = SUPPORTED_PYSPARK
    if not low <= version < high:
        raise PysparkCompatibilityError(
            f"pyspark {pyspark.__version__} is not supported by this deltaflow (needs"
            f" >= {low[0]}.{low[1]}, < {high[0]}.{high[1]}): pip install 'pyspark>=4.2,<5'.",
            where="pyspark",
        )
    for patch in PATCHES:
        cls = _class(patch.cls)
        for method in patch.methods:
            if not callable(getattr(cls, method, None)):
                raise PysparkCompatibilityError(
                    f"{patch.cls}.{method} is gone in pyspark {pyspark.__version__}: deltaflow"
                    f" patches it ({patch.why}). Report this with the pyspark version.",
                    where=f"{patch.cls}.{method}",
                )


def install() -> None:
    """Check, remember the originals, then apply every patch (idempotent)."""
    check()
    for patch in PATCHES:
        cls = _class(patch.cls)
        for method in patch.methods:
            _originals.setdefault((patch.cls, method), cls.__dict__.get(method))
    for patch in PATCHES:
        module = importlib.import_module(f"deltaflow.spark.{patch.module}")
        getattr(module, patch.installer)()


def uninstall() -> None:
    """Put back every original method and forget that the patches were installed."""
    for (cls_path, method), original in _originals.items():
        cls = _class(cls_path)
        if original is None:
            if method in cls.__dict__:
                delattr(cls, method)
        else:
            setattr(cls, method, original)
    for cls_path in {p.cls for p in PATCHES}:
        cls = _class(cls_path)
        for name in [n for n in vars(cls) if n.startswith(_FLAG_PREFIX)]:
            delattr(cls, name)
    _originals.clear()
