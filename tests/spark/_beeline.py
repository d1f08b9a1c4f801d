"""The pyspark wheel's beeline, run against a Thrift endpoint (``deltaflow sql-server`` or
Spark's own Thrift server) for the JDBC tests."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.spark.test_hosts import SPARK_HOME, spark_env


def jdbc_url(port: int, database: str = "default") -> str:
    return f"jdbc:hive2://127.0.0.1:{port}/{database}"


def beeline(
    url: str,
    statements: str | Sequence[str],
    *args: str,
    force: bool = False,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``statements`` (one string, or a list joined with ``;``) run by beeline on one
    connection to ``url``, output as CSV; ``args`` go to beeline (``-n user``, ...).

    ``force=True`` goes on after a failing statement. beeline honours ``--force`` only for a
    script file (with ``-e`` it stops at the first failure), so the statements are then run
    from one."""
    text = statements if isinstance(statements, str) else ";\n".join(statements) + ";"
    command = [str(SPARK_HOME / "bin" / "beeline"), "-u", url, *args]
    command += ["--outputformat=csv2", "--silent=true"]
    with tempfile.TemporaryDirectory(prefix="beeline-") as home:
        if force:
            script = Path(home, "statements.sql")
            script.write_text(text + "\n")
            command += ["--force=true", "-f", str(script)]
        else:
            command += ["-e", text]
        return subprocess.run(
            command,
            cwd=home,
            env=spark_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
