"""delta-spark's DataFrameWriter behaviour for ``format("delta")``, checked in the caller.

The connector's provider runs every save mode and ``partitionBy`` itself. What
``install()`` still adds, on the driver, before any job runs (it goes when the
connector's errors reach PySpark callers typed by themselves):

- ``error`` / ``errorifexists``: raise :class:`TableAlreadyExistsError` if a table
  exists at the path; ``ignore``: do nothing if a table exists (the provider decides
  again at commit time, so a table created meanwhile is still refused);
- ``partitionBy(cols)``: passed as the ``partitionBy`` option (the Python sink and the
  Python writer read it; the provider reads both forms);
- schema enforcement, option checks and app-transaction deduplication run on the
  driver too (``plan_write``), so their errors reach the caller as deltaflow's
  typed errors instead of a pyspark exception wrapping a Python traceback, and a
  write that would be skipped starts no job at all;
- deltaflow errors raised in executors or in the commit (which run in Python
  workers) travel back inside the JVM's error text and are re-raised typed.

Other formats go through untouched. The patch is installed by ``register()``
(and so by ``session()``), is idempotent, and keeps every original method.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from deltaflow.errors import DeltaflowError, from_wire, to_wire
from deltaflow.table import _uri

log = logging.getLogger("deltaflow.write")

_STATE = "_deltaflow_state"
_INSTALLED = "_deltaflow_installed"
SAVE_MODE_OPTION = "__deltaflow_save_mode"


class RemoteDeltaflowError(Exception):
    """A deltaflow error raised in a Python worker, marked to survive the trip to the driver."""

    def __init__(self, error: DeltaflowError) -> None:
        super().__init__(f"{type(error).__name__}: {error} {to_wire(error)}")


def unpack_remote_error(exc: BaseException) -> DeltaflowError | None:
    """The deltaflow error a pyspark exception carries, if a worker marked one in it."""
    return from_wire(str(exc))


def writer_state(writer: Any, key: str, **fields: Any) -> dict[str, Any]:
    """The record of a (stream) writer's calls kept on the writer under ``key``: format,
    partition columns, options, and ``fields`` (their defaults), made on first use."""
    state = writer.__dict__.get(key)
    if state is None:
        state = {"format": None, "partition_by": None, **fields, "options": {}}
        writer.__dict__[key] = state
    return state


def recording_methods(
    state_of: Callable[[Any], dict[str, Any]],
    original_format: Any,
    original_option: Any,
    original_options: Any,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``format``, ``option`` and ``options`` for a (stream) writer class: each records
    the call in ``state_of(writer)`` and makes the original one."""

    def format(self: Any, source: str) -> Any:
        state_of(self)["format"] = source
        return original_format(self, source)

    def option(self: Any, key: str, value: Any) -> Any:
        remember_option(state_of(self), key, value)
        return original_option(self, key, value)

    def options(self: Any, **opts: Any) -> Any:
        for key, value in opts.items():
            remember_option(state_of(self), key, value)
        return original_options(self, **opts)

    return format, option, options


def partition_columns(cols: tuple[Any, ...]) -> list[Any]:
    """``partitionBy``'s arguments as a list: ``("a", "b")`` or ``(["a", "b"],)``."""
    if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
        return list(cols[0])
    return list(cols)


def _state(writer: Any) -> dict[str, Any]:
    return writer_state(writer, _STATE, mode=None, path=None)


def install() -> None:
    from pyspark.sql.readwriter import DataFrameWriter

    if getattr(DataFrameWriter, _INSTALLED, False):
        return
    original_format = DataFrameWriter.format
    original_mode = DataFrameWriter.mode
    original_partition_by = DataFrameWriter.partitionBy
    original_option = DataFrameWriter.option
    original_options = DataFrameWriter.options
    original_save = DataFrameWriter.save

    format, option, options = recording_methods(
        _state, original_format, original_option, original_options
    )

    def mode(self: Any, saveMode: str | None) -> Any:
        if saveMode is not None:
            _state(self)["mode"] = saveMode
        return original_mode(self, saveMode)

    def partitionBy(self: Any, *cols: Any) -> Any:
        # Deferred: Spark refuses partitionBy for Python sources, so the JVM call is
        # made at save() time, and only for other formats.
        state = _state(self)
        state["partition_by"] = partition_columns(cols)
        if state.get("implied_format") not in (None, "delta"):
            # Inside parquet(..., partitionBy=...) and friends, which never call save().
            original_partition_by(self, *state["partition_by"])
        return self

    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        partitionBy: Any = None,
        **options: Any,
    ) -> None:
        state = _state(self)
        if format is not None:
            self.format(format)
        if mode is not None:
            self.mode(mode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        if (state["format"] or "").lower() != "delta":
            if state["partition_by"]:
                original_partition_by(self, *state["partition_by"])
            original_save(self, path)
            return
        _save_delta(self, state, path, original_option, original_save)

    for name in _DIRECT_WRITES:
        setattr(DataFrameWriter, name, _direct_write(name, original_partition_by))
    DataFrameWriter.format = format
    DataFrameWriter.mode = mode
    DataFrameWriter.option = option
    DataFrameWriter.options = options
    DataFrameWriter.partitionBy = partitionBy
    DataFrameWriter.save = save
    setattr(DataFrameWriter, _INSTALLED, True)


# DataFrameWriter methods that write without save(): the deferred partitionBy must
# reach the JVM before them, or the files would silently be written unpartitioned.
_DIRECT_WRITES = ("parquet", "orc", "json", "csv", "text", "saveAsTable")


def _direct_write(name: str, original_partition_by: Any) -> Any:
    from pyspark.sql.readwriter import DataFrameWriter

    original = getattr(DataFrameWriter, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = _state(self)
        implied = name if name != "saveAsTable" else kwargs.get("format") or state["format"]
        state["implied_format"] = (implied or "").lower() or None
        if state["partition_by"] and state["implied_format"] not in (None, "delta"):
            original_partition_by(self, *state["partition_by"])
        return original(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = original.__doc__
    return method


def remember_option(state: dict[str, Any], key: str, value: Any) -> None:
    """Keep a writer option in the Python-side ``state`` (batch and stream writers)."""
    from pyspark.sql.utils import to_str

    if value is None:
        return
    if key.lower() == "path":
        state["path"] = value
    state["options"][key] = to_str(value)


def _save_delta(
    writer: Any,
    state: dict[str, Any],
    path: str | None,
    original_option: Any,
    original_save: Any,
) -> None:
    from deltaflow.spark._options import parse_write_options
    from deltaflow.spark.write._writer import plan_write

    location = path or state["path"]
    mode = (state["mode"] or "errorifexists").lower()
    mode = {"errorifexists": "error", "default": "error"}.get(mode, mode)
    options = dict(state["options"])
    if state["partition_by"]:
        options["partitionBy"] = ",".join(state["partition_by"])
        original_option(writer, "partitionBy", options["partitionBy"])
    if location:
        options["path"] = location
    parsed = parse_write_options(options)
    uri = _uri.normalize_uri(parsed.path)
    # The same checks the source runs while Spark plans the job; here they raise typed.
    plan = plan_write(uri, writer._df.schema.jsonValue(), mode, parsed)
    if plan.skip:
        # mode ignore on an existing table, or an app transaction already committed
        finish_skipped_batch(writer._df)
        return
    # The connector's provider runs every save mode itself (Spark's Parquet writer,
    # or the Python source for what the JVM does not write yet).
    try:
        original_save(writer, path)
    except Exception as exc:
        error = unpack_remote_error(exc)
        if error is None:
            raise
        raise error from exc


def finish_skipped_batch(df: Any) -> None:
    """Run a skipped ``foreachBatch`` micro-batch of a stateful query into Spark's ``noop``.

    Spark 4.3 fails a stateful query (STATE_STORE_COMMIT_VALIDATION_FAILED) when a
    ``foreachBatch`` function returns without running its batch, because the batch's
    state stores commit only when every partition is processed. A write skipped as a
    replay (``txnAppId`` / ``txnVersion`` already in the log) or by mode ``ignore`` must
    still run it; anything else that is skipped runs nothing, as in delta-spark. (The
    JVM stream sink runs every replayed batch, without asking: it only ever sees
    micro-batches, and replays are rare.)
    """
    if _runs_state_stores(df):
        log.info("deltaflow write skipped: running the stateful micro-batch into noop")
        df.write.format("noop").mode("overwrite").save()


def _runs_state_stores(df: Any) -> bool:
    """Whether ``df`` is a micro-batch (``foreachBatch`` hands over a LogicalRDD of the
    planned batch) whose RDD lineage reads or writes state stores."""
    try:
        logical = df._jdf.queryExecution().logical()
        if not logical.getClass().getName().endswith(".LogicalRDD"):
            return False
        return "StateStore" in str(logical.rdd().toDebugString())
    except Exception:  # Spark Connect, or a JVM that moved these classes
        log.debug("deltaflow write: could not inspect the skipped DataFrame", exc_info=True)
        return False
