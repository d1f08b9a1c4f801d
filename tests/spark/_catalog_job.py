"""A ``deltaflow.session()`` in its own process that runs SQL statements and prints each
one's rows (``ROWS <json>``), or the typed error that stopped it (``ERROR <json>``, exit 3).

Usage: ``python _catalog_job.py <warehouse> <statement> [<statement> ...]``. The catalog
tests run it before and after other hosts, to see what a restart keeps, and beside them:
a statement ``WAIT <name>`` prints ``WAITING <name>`` and holds the session open until the
test writes the line ``<name>`` to its stdin (so another process can act in between); a
closed stdin (the test gone) ends the job.
"""

from __future__ import annotations

import json
import sys

import deltaflow


def main(argv: list[str]) -> int:
    warehouse, *statements = argv
    spark = deltaflow.session(
        app_name="catalog-job", master="local[1]", conf={"spark.sql.warehouse.dir": warehouse}
    )
    try:
        for statement in statements:
            if statement.startswith("WAIT "):
                name = statement[len("WAIT ") :]
                print(f"WAITING {name}", flush=True)
                signal = sys.stdin.readline()  # blocks until the test resumes it
                if signal.strip() != name:
                    print("ERROR " + json.dumps({"type": "resume", "fields": {}}), flush=True)
                    return 3
                continue
            try:
                rows = [
                    [None if v is None else str(v) for v in row]
                    for row in spark.sql(statement).collect()
                ]
            except Exception as exc:
                error = deltaflow.typed_error(exc)
                fields = {k: str(v) for k, v in (error._fields if error else {}).items()}
                kind = type(error).__name__ if error else f"{type(exc).__name__}: {exc}"
                print("ERROR " + json.dumps({"type": kind, "fields": fields}), flush=True)
                return 3
            print("ROWS " + json.dumps(rows), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
