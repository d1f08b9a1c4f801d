"""A ``deltaflow sql-server`` for tests, started through ``_sql_server.start`` with the JSON
keywords in argv[1]. It prints ``READY`` once it listens, then answers each ``sessions``
line on stdin with ``SESSIONS <open> <opened in all>`` (``_sql_server.jdbc_sessions``);
it stops at end of input."""

from __future__ import annotations

import json
import os
import sys

from deltaflow.spark import _sql_server


def main() -> None:
    keywords = json.loads(sys.argv[1])
    password_env = keywords.pop("tls_keystore_password_env", None)
    if password_env:
        keywords["tls_keystore_password"] = os.environ[password_env]
    spark = _sql_server.start(**keywords)
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "sessions":
            online, total = _sql_server.jdbc_sessions(spark)
            print(f"SESSIONS {online} {total}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
