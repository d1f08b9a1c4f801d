"""A delta-spark session in the reference venv that runs small jobs sent over stdin.

Run by the reference venv's Python (``_client.ReferenceSpark`` starts it), never imported by
the reference side with project code: it needs only pyspark and delta-spark. The test process
imports it too, for :func:`canonical`, so both sides turn Spark values into the same JSON.

Protocol, one JSON object a line. Request: ``{"code": "..."}`` — Python run with ``spark``
(the delta-spark session), ``DeltaTable`` and the names earlier jobs defined in scope; an
expression's value is the result, otherwise the variable ``result``. Reply: ``{"ok": true,
"result": ...}`` (a DataFrame comes back as ``{"schema": [...], "rows": [...]}``, rows sorted)
or ``{"ok": false, "error": {"type", "java_class", "condition", "message"}}``. The first line
the server writes is ``{"ready": true, ...}`` once the session is up; ``{"stop": true}`` ends it.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import os
import sys
import traceback
from typing import Any


def canonical(value: Any) -> Any:
    """A Spark value (from ``collect()``) as plain JSON that compares equal across sides."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"$float": repr(value)} if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime.datetime):
        return {"$timestamp": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, (bytes, bytearray)):
        return {"$binary": bytes(value).hex()}
    if isinstance(value, dict):
        entries = [[canonical(k), canonical(v)] for k, v in value.items()]
        return {"$map": sorted(entries, key=sort_key)}
    if isinstance(value, (list, tuple)):  # a Row is a tuple: its values, in field order
        return [canonical(v) for v in value]
    if type(value).__name__ == "VariantVal":
        return {"$variant": json.loads(value.toJson())}
    return {"$repr": repr(value)}


def sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def schema_fields(schema: Any) -> list[list[Any]]:
    """A schema as ``[name, type, nullable]`` per top-level field (Spark's simple strings)."""
    return [[f.name, f.dataType.simpleString(), f.nullable] for f in schema.fields]


def frame(df: Any) -> dict[str, Any]:
    """A DataFrame's schema and its rows, sorted (a table has no row order)."""
    rows = [canonical(row) for row in df.collect()]
    return {"schema": schema_fields(df.schema), "rows": sorted(rows, key=sort_key)}


def _result(value: Any) -> Any:
    if hasattr(value, "collect") and hasattr(value, "schema"):
        return frame(value)
    return canonical(value)


def _error(exc: BaseException) -> dict[str, Any]:
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    java_class = None
    if java is not None:
        try:
            java_class = java.getClass().getName()
        except Exception:  # the JVM may be gone
            java_class = None
    condition = None
    for getter in ("getCondition", "getErrorClass"):
        if hasattr(exc, getter):
            try:
                condition = getattr(exc, getter)()
            except Exception:
                condition = None
            break
    return {
        "type": type(exc).__name__,
        "java_class": java_class,
        "condition": condition,
        "message": str(exc)[:4000],
        "traceback": traceback.format_exc()[-4000:],
    }


def _run(code: str, scope: dict[str, Any]) -> Any:
    try:
        compiled = compile(code, "<reference job>", "eval")
    except SyntaxError:
        scope["result"] = None
        exec(compile(code, "<reference job>", "exec"), scope)
        return scope["result"]
    return eval(compiled, scope)


def main() -> None:
    conf = json.loads(sys.argv[1])
    # The protocol owns the original stdout; anything else written to fd 1 (Spark, Ivy, a
    # job's print) goes to stderr, which the client sends to a log file.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import delta.exceptions  # noqa: F401  (maps Delta's Java conflicts to Python classes)
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(conf.pop("master", "local[2]")).appName("reference")
    for key, val in conf.items():
        builder = builder.config(key, val)
    spark = builder.getOrCreate()
    scope: dict[str, Any] = {"spark": spark, "DeltaTable": DeltaTable, "frame": frame}
    versions = {"spark": spark.version, "delta": _delta_version()}
    protocol.write(json.dumps({"ready": True, **versions}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("stop"):
            break
        try:
            reply = {"ok": True, "result": _result(_run(request["code"], scope))}
        except Exception as exc:
            reply = {"ok": False, "error": _error(exc)}
        protocol.write(json.dumps(reply) + "\n")
    spark.stop()


def _delta_version() -> str:
    from importlib.metadata import version

    return version("delta-spark")


if __name__ == "__main__":
    main()
