"""Run by test_delta_table.py: a batch write slow enough to be killed mid-write.

Prints READY once its session is up, then appends rows that each take a moment to
compute (so the write sits in its staging directory for a while) and prints DONE.
"""

from __future__ import annotations

import sys

import deltaflow


def main(path: str) -> None:
    spark = deltaflow.session(app_name="killed-write", master="local[1]")
    try:
        print("READY", flush=True)
        # Each row sleeps 100 ms in the JVM: a few seconds of staged, uncommitted files.
        df = spark.range(0, 600, 1, 2).selectExpr(
            "id", "reflect('java.lang.Thread', 'sleep', cast(100 as bigint)) AS note"
        )
        df.write.format("delta").mode("append").save(path)
        print("DONE", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
