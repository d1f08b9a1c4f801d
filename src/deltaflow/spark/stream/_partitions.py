"""``df.writeStream.format("delta").partitionBy(...)``: kept for the Python data source sink.

The connector's JVM sink (``io.deltaflow.spark.DeltaSink``) takes ``partitionBy`` as
Spark hands it over. Spark refuses ``partitionBy`` for a Python sink, though, which is
what runs with ``deltaflow.write.nativeWrite=false`` or for object-store tables. So
``install()`` defers ``DataStreamWriter.partitionBy`` for Delta sinks and passes the
columns as the ``partitionBy`` option at ``start()``, which every Delta sink reads; other
formats get the JVM call as before. ``start()`` of a Delta sink also raises the typed
error of a setting the connector refused (``deltaflow.typed_error``) instead of the Py4J
error around it. Classic (py4j) sessions only; idempotent. The ``partitionBy`` part goes
when the Python sink does.
"""

from __future__ import annotations

from typing import Any

from deltaflow.errors import typed_error
from deltaflow.spark.write._compat import partition_columns, recording_methods, writer_state

_STATE = "_deltaflow_stream_state"
_INSTALLED = "_deltaflow_stream_installed"


def _state(writer: Any) -> dict[str, Any]:
    return writer_state(writer, _STATE)


def install() -> None:
    """Patch ``DataStreamWriter`` (format, option(s), partitionBy, start); idempotent."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if getattr(DataStreamWriter, _INSTALLED, False):
        return
    original_format = DataStreamWriter.format
    original_option = DataStreamWriter.option
    original_options = DataStreamWriter.options
    original_partition_by = DataStreamWriter.partitionBy
    original_start = DataStreamWriter.start

    format, option, options = recording_methods(
        _state, original_format, original_option, original_options
    )

    def partitionBy(self: Any, *cols: Any) -> Any:
        # Deferred: the JVM hears of it at start(), as an option for Delta sinks.
        _state(self)["partition_by"] = partition_columns(cols)
        return self

    def start(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: Any = None,
        queryName: str | None = None,
        **options: Any,
    ) -> Any:
        state = _state(self)
        if format is not None:
            self.format(format)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        columns = state["partition_by"]
        if columns and (state["format"] or "").lower() == "delta":
            original_option(self, "partitionBy", ",".join(columns))
        elif columns:
            original_partition_by(self, *columns)
        if (state["format"] or "").lower() != "delta":
            return original_start(self, path, outputMode=outputMode, queryName=queryName)
        try:
            return original_start(self, path, outputMode=outputMode, queryName=queryName)
        except Exception as exc:
            # The connector checks a Delta sink's settings inside start(): raise its
            # typed error rather than the Py4J error around it.
            error = typed_error(exc)
            if error is None or error is exc:
                raise
            raise error from exc

    methods: dict[str, Any] = {
        "format": format,
        "option": option,
        "options": options,
        "partitionBy": partitionBy,
        "start": start,
    }
    for name, method in methods.items():
        method.__doc__ = getattr(DataStreamWriter, name).__doc__
        setattr(DataStreamWriter, name, method)
    setattr(DataStreamWriter, _INSTALLED, True)
