"""Ship the JVM connector's sources (``jvm/src/main``) inside the package, and its jar too
when pyspark is importable while the wheel is built (``python -m build --no-isolation``).

Without pyspark at build time the wheel carries the sources only, and
``deltaflow.spark_conf()`` compiles the jar on first use with the Scala compiler of the
pyspark installed next to it (``deltaflow/spark/_jar.py``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithConnector(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads jvm/ in the checkout (deltaflow/spark/_jar.py)
        target = Path(self.build_lib) / "deltaflow" / "_jvm"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(HERE / "jvm" / "src" / "main", target / "src" / "main")
        try:
            import pyspark  # noqa: F401
        except ImportError:
            print("deltaflow: pyspark not importable; the jar is built on first use")
            return
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]);"
            " from deltaflow.spark import _jar; print(_jar.jar_path())"
        )
        subprocess.run([sys.executable, "-c", code, self.build_lib], check=True)


setup(cmdclass={"build_py": BuildWithConnector})
