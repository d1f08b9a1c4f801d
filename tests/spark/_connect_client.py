"""A Spark Connect client process for tests: runs the code snippets it reads from stdin
(one JSON line each: ``{"code": ...}``) against ``sc://127.0.0.1:<port>`` and answers
one JSON line each: ``{"result": ...}`` (the snippet's ``result`` variable, as JSON) or
``{"error": {"type", "fields", "message"}}`` (the exception, typed through
``deltaflow.typed_error`` when it carries a deltaflow error).

Started by ``tests/spark/test_connect_delta_table.py`` in a mount namespace where the
server's table directory is an empty tmpfs: the client cannot open table storage.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "asDict"):
        return _jsonable(value.asDict(recursive=True))
    return repr(value)


def _condition(exc: BaseException) -> str | None:
    getter = getattr(exc, "getCondition", None)
    try:
        return getter() if getter else None
    except Exception:
        return None


def main() -> None:
    port, tables = sys.argv[1], sys.argv[2]
    import pyspark.sql.functions as F

    import deltaflow
    from deltaflow.tables import DeltaTable

    spark = deltaflow.session(remote=f"sc://127.0.0.1:{port}")
    namespace: dict[str, Any] = {
        "spark": spark, "F": F, "DeltaTable": DeltaTable, "deltaflow": deltaflow,
        "tables": tables, "os": os,
    }  # fmt: skip
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        namespace.pop("result", None)
        try:
            exec(request["code"], namespace)
            answer: dict[str, Any] = {"result": _jsonable(namespace.get("result"))}
        except Exception as exc:
            typed = deltaflow.typed_error(exc) or exc
            answer = {
                "error": {
                    "type": type(typed).__name__,
                    "mro": [c.__name__ for c in type(typed).__mro__],
                    "fields": _jsonable(getattr(typed, "_fields", {})),
                    "message": str(typed)[:2000],
                    "condition": _condition(exc),
                    "traceback": traceback.format_exc()[-3000:],
                }
            }
        print(json.dumps(answer), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
