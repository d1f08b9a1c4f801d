"""Every pyspark patch deltaflow still installs: the table, the guard, and the patches.

The connector (Spark's own extension points) does the work; these patches only add what a
PySpark caller cannot get from the JVM yet. Each row of :data:`PATCHES` names the class,
the methods it replaces, the function below that replaces them, and why. :func:`install`
checks the pyspark version and that every method is still where the patch expects it
(failing loudly, naming the method, when an internal moved), remembers the originals and
applies each patch once; :func:`uninstall` puts the originals back. Classic (py4j)
sessions only: Spark Connect classes are not patched.

The patched methods here only record calls and route them; what they decide lives with
the rest of its kind: read checks in :mod:`deltaflow.spark.read._checks`, delta saves in
:mod:`deltaflow.spark.write._save`, catalog statements in :mod:`deltaflow.spark.catalog`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deltaflow.errors import raising_typed
from deltaflow.spark.errors import PysparkCompatibilityError

# The pyspark versions deltaflow serves: its connector compiles against each (the jar is
# built for the installed one), these patches apply to each, and the core suite runs on
# the newest patch of every minor (tests/spark_versions.py). Spark 3.x has no Python data
# source API and Scala 2.12/2.13 jars of another Spark; 5.x is untested.
SUPPORTED_PYSPARK = ((4, 0), (5, 0))  # from, up to (excluded)
_LOW, _HIGH = SUPPORTED_PYSPARK
SUPPORTED_RANGE = f">={_LOW[0]}.{_LOW[1]},<{_HIGH[0]}"  # as pip writes it
_FLAG_PREFIX = "_deltaflow"


@dataclass(frozen=True)
class Patch:
    cls: str  # module.Class
    methods: tuple[str, ...]
    apply: Callable[[Any], dict[str, Callable[..., Any]]]  # class -> replacement methods
    why: str

    @property
    def flag(self) -> str:
        return f"{_FLAG_PREFIX}_{self.apply.__name__.lstrip('_')}"


_originals: dict[tuple[str, str], Any] = {}


# ---- DataFrameReader: typed errors where load() was called ------------------------------


def _state(obj: Any, key: str, **defaults: Any) -> dict[str, Any]:
    """The record of a reader's or writer's calls, kept on the object under ``key``."""
    state = obj.__dict__.get(key)
    if state is None:
        state = {"format": None, "partition_by": None, **defaults, "options": {}}
        obj.__dict__[key] = state
    return state


def _to_str(value: Any) -> str:
    # pyspark's own to_str: booleans as Spark spells them.
    return str(value).lower() if isinstance(value, bool) else str(value)


def _remember_option(state: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        return
    if key.lower() == "path":
        state["path"] = value
    state["options"][key] = _to_str(value)


def _recording(cls: Any, key: str, **defaults: Any) -> dict[str, Callable[..., Any]]:
    """``format``, ``option`` and ``options`` that record the call, then make it."""
    original_format, original_option, original_options = cls.format, cls.option, cls.options

    def format(self: Any, source: str) -> Any:
        _state(self, key, **defaults)["format"] = source
        return original_format(self, source)

    def option(self: Any, key_: str, value: Any) -> Any:
        _remember_option(_state(self, key, **defaults), key_, value)
        return original_option(self, key_, value)

    def options(self: Any, **opts: Any) -> Any:
        for name, value in opts.items():
            _remember_option(_state(self, key, **defaults), name, value)
        return original_options(self, **opts)

    return {"format": format, "option": option, "options": options}


def _is_delta(state: dict[str, Any]) -> bool:
    return (state["format"] or "").lower() == "delta"


def _partition_columns(cols: tuple[Any, ...]) -> list[Any]:
    """``partitionBy``'s arguments as a list: ``("a", "b")`` or ``(["a", "b"],)``."""
    if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
        return list(cols[0])
    return list(cols)


def _reader(cls: Any) -> dict[str, Callable[..., Any]]:
    from deltaflow.spark.read._checks import load_delta

    key = "_deltaflow_read_state"
    original_format, original_schema, original_load = cls.format, cls.schema, cls.load
    methods = _recording(cls, key, schema=None)

    def schema(self: Any, schema: Any) -> Any:
        _state(self, key, schema=None)["schema"] = schema
        return original_schema(self, schema)

    def load(
        self: Any, path: Any = None, format: str | None = None, schema: Any = None, **opts: Any
    ) -> Any:
        if format is not None:
            self.format(format)
        if schema is not None:
            self.schema(schema)
        self.options(**opts)
        state = _state(self, key, schema=None)
        if not _is_delta(state):
            return original_load(self, path)
        return load_delta(self, state, path, original_format, original_load)

    return {**methods, "schema": schema, "load": load}


# ---- DataFrameWriter: delta-spark's save modes, checked before any job ------------------

_WRITE_STATE = "_deltaflow_write_state"
# DataFrameWriter methods that write without save(): the deferred partitionBy must
# reach the JVM before them, or the files would silently be written unpartitioned.
_DIRECT_WRITES = ("parquet", "orc", "json", "csv", "text", "saveAsTable")


def _writer(cls: Any) -> dict[str, Callable[..., Any]]:
    from deltaflow.spark.write._save import save_delta

    original_mode, original_partition_by = cls.mode, cls.partitionBy
    original_option, original_save = cls.option, cls.save

    def state_of(writer: Any) -> dict[str, Any]:
        return _state(writer, _WRITE_STATE, mode=None, path=None)

    def mode(self: Any, saveMode: str | None) -> Any:
        if saveMode is not None:
            state_of(self)["mode"] = saveMode
        return original_mode(self, saveMode)

    def partitionBy(self: Any, *cols: Any) -> Any:
        # Deferred: Spark refuses partitionBy for Python sources, so the JVM call is
        # made at save() time, and only for other formats.
        state = state_of(self)
        state["partition_by"] = _partition_columns(cols)
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
        state = state_of(self)
        if format is not None:
            self.format(format)
        if mode is not None:
            self.mode(mode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        if not _is_delta(state):
            if state["partition_by"]:
                original_partition_by(self, *state["partition_by"])
            original_save(self, path)
            return
        save_delta(self, state, path, original_option, original_save)

    def direct(name: str) -> Callable[..., Any]:
        original = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            state = state_of(self)
            implied = name if name != "saveAsTable" else kwargs.get("format") or state["format"]
            state["implied_format"] = (implied or "").lower() or None
            # saveAsTable of a Delta table goes through deltaflow's catalog, which takes
            # the partitioning as Spark hands it over.
            if state["partition_by"] and (
                name == "saveAsTable" or state["implied_format"] not in (None, "delta")
            ):
                original_partition_by(self, *state["partition_by"])
            # A Delta table's errors come from deltaflow's catalog and write plan: typed,
            # not the Py4J error around them (other formats' errors are left as they are).
            typed = raising_typed() if name == "saveAsTable" else contextlib.nullcontext()
            with typed:
                return original(self, *args, **kwargs)

        return method

    return {
        **_recording(cls, _WRITE_STATE, mode=None, path=None),
        **{name: direct(name) for name in _DIRECT_WRITES},
        "mode": mode,
        "partitionBy": partitionBy,
        "save": save,
    }


# ---- DataStreamWriter: partitionBy for the Python sink ---------------------------------


def _stream_partitions(cls: Any) -> dict[str, Callable[..., Any]]:
    key = "_deltaflow_stream_state"
    original_option, original_partition_by, original_start = (
        cls.option,
        cls.partitionBy,
        cls.start,
    )

    def partitionBy(self: Any, *cols: Any) -> Any:
        # Deferred: the JVM hears of it at start(), as an option for Delta sinks.
        _state(self, key)["partition_by"] = _partition_columns(cols)
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
        state = _state(self, key)
        if format is not None:
            self.format(format)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        columns = state["partition_by"]
        if columns and _is_delta(state):
            original_option(self, "partitionBy", ",".join(columns))
        elif columns:
            original_partition_by(self, *columns)
        from deltaflow.spark.stream._checkpoint import refused_checkpoint

        with refused_checkpoint(self._spark, state["options"]):
            if not _is_delta(state):
                return original_start(self, path, outputMode=outputMode, queryName=queryName)
            # The connector checks a Delta sink's settings inside start(): its typed error,
            # not the Py4J error around it.
            with raising_typed():
                return original_start(self, path, outputMode=outputMode, queryName=queryName)

    def toTable(
        self: Any,
        tableName: str,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: Any = None,
        queryName: str | None = None,
        **options: Any,
    ) -> Any:
        # The deferred partitionBy reaches the JVM (a table toTable creates is partitioned
        # so); the stream runs through the catalog table's own streaming write, whose
        # refusals come back typed, not as the Py4J error around them.
        state = _state(self, key)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if state["partition_by"]:
            original_partition_by(self, *state["partition_by"])
        with raising_typed():
            return original_to_table(
                self, tableName, format, outputMode, None, queryName, **options
            )

    original_to_table = cls.toTable
    return {
        **_recording(cls, key),
        "partitionBy": partitionBy,
        "start": start,
        "toTable": toTable,
    }


# ---- SparkSession.sql: the connector's typed errors --------------------------------------


def _sql(cls: Any) -> dict[str, Callable[..., Any]]:
    original = cls.sql

    def sql(self: Any, sqlQuery: Any, args: Any = None, **kwargs: Any) -> Any:
        with raising_typed():
            return original(self, sqlQuery, args, **kwargs)

    return {"sql": sql}


_WRITER_V2_METHODS = ("create", "replace", "createOrReplace", "append", "overwrite",
                      "overwritePartitions")  # fmt: skip


def _writer_v2(cls: Any) -> dict[str, Callable[..., Any]]:
    def typed(name: str) -> Callable[..., Any]:
        original = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            with raising_typed():
                return original(self, *args, **kwargs)

        return method

    return {name: typed(name) for name in _WRITER_V2_METHODS}


def _foreach_batch(cls: Any) -> dict[str, Callable[..., Any]]:
    original = cls.foreachBatch

    def foreachBatch(self: Any, func: Callable[[Any, int], None]) -> Any:
        return original(self, guard_batch_function(func))

    return {"foreachBatch": foreachBatch}


def guard_batch_function(func: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
    """``func`` (a ``foreachBatch`` function) with its failures typed.

    Spark reports a failed ``foreachBatch`` function as text (the Python traceback inside
    ``FOREACH_BATCH_USER_FUNCTION_ERROR``). A deltaflow error raised in it (a MERGE's
    conflict, a write's schema mismatch) travels on as itself, and any other exception
    as :class:`~deltaflow.UserCodeError` naming the function and the batch, both marked
    so that :func:`deltaflow.typed_error` finds them in ``query.exception()``.
    """
    from deltaflow.errors import RemoteDeltaflowError, UserCodeError, typed_error

    name = getattr(func, "__qualname__", None) or repr(func)

    @functools.wraps(func)
    def guarded(df: Any, batch_id: int) -> None:
        try:
            func(df, batch_id)
        except RemoteDeltaflowError:
            raise
        except Exception as exc:
            error = typed_error(exc) or UserCodeError(
                f"The foreachBatch function {name} failed in batch {batch_id}:"
                f" {type(exc).__name__}: {exc}",
                batch_id=batch_id,
            )
            raise RemoteDeltaflowError(error) from exc

    return guarded


PATCHES = (
    Patch(
        "pyspark.sql.readwriter.DataFrameReader",
        ("format", "schema", "option", "options", "load"),
        _reader,
        "typed errors (missing table, bad version or option) where the caller called"
        " load(); a user-specified schema goes to the Python source",
    ),
    Patch(
        "pyspark.sql.readwriter.DataFrameWriter",
        ("format", "mode", "option", "options", "partitionBy", "save", *_DIRECT_WRITES),
        _writer,
        "typed errors and skipped duplicate app transactions before any job, and"
        " saveAsTable's typed errors; partitionBy as an option the Python writer reads",
    ),
    Patch(
        "pyspark.sql.streaming.readwriter.DataStreamWriter",
        ("format", "option", "options", "partitionBy", "start", "toTable"),
        _stream_partitions,
        "partitionBy as an option for the Python sink, which Spark refuses it for;"
        " the typed error of a Delta sink setting start() or toTable() refused, and of a"
        " checkpoint location Hadoop cannot open (s3://)",
    ),
    Patch(
        "pyspark.sql.session.SparkSession",
        ("sql",),
        _sql,
        "the typed deltaflow error (e.g. TableNotFoundError) of a statement the connector"
        " refused, not the Py4J error around it",
    ),
    Patch(
        "pyspark.sql.readwriter.DataFrameWriterV2",
        _WRITER_V2_METHODS,
        _writer_v2,
        "writeTo()'s typed errors (the catalog's and the write plan's), not the Py4J error"
        " around them",
    ),
    Patch(
        "pyspark.sql.streaming.readwriter.DataStreamWriter",
        ("foreachBatch",),
        _foreach_batch,
        "a failing foreachBatch function's error reaches query.exception() typed"
        " (UserCodeError, or the deltaflow error it raised), not as a bare traceback",
    ),
)


def _class(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def check_version() -> None:
    """Raise :class:`PysparkCompatibilityError` unless the installed pyspark is one
    deltaflow serves (:data:`SUPPORTED_PYSPARK`). ``spark_conf()`` (so ``session()`` and
    ``configure()``) and ``register()`` call it before anything else."""
    import pyspark

    installed = pyspark.__version__
    try:
        version = tuple(int(p) for p in installed.split(".")[:2])
    except ValueError:
        version = ()
    low, high = SUPPORTED_PYSPARK
    if not low <= version < high:
        raise PysparkCompatibilityError(
            f"pyspark {installed} is not supported by this deltaflow: it serves Spark"
            f" {low[0]}.{low[1]} up to, not including, {high[0]}.{high[1]} (pyspark"
            f"{SUPPORTED_RANGE}). Install one: pip install 'pyspark{SUPPORTED_RANGE}'.",
            where="pyspark",
            version=installed,
            supported=SUPPORTED_RANGE,
        )


def check() -> None:
    """Raise :class:`PysparkCompatibilityError` unless every patch can apply."""
    import pyspark

    check_version()
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
    """Check, remember the originals, then apply every patch once (idempotent)."""
    check()
    for patch in PATCHES:
        cls = _class(patch.cls)
        for method in patch.methods:
            _originals.setdefault((patch.cls, method), cls.__dict__.get(method))
    for patch in PATCHES:
        cls = _class(patch.cls)
        if getattr(cls, patch.flag, False):
            continue
        replacements = patch.apply(cls)
        if set(replacements) != set(patch.methods):
            raise AssertionError(f"{patch.apply.__name__} replaces {sorted(replacements)}")
        for name, replacement in replacements.items():
            replacement.__name__ = name
            replacement.__doc__ = getattr(cls, name).__doc__
            setattr(cls, name, replacement)
        setattr(cls, patch.flag, True)


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
