"""The root of deltaflow's exception tree.

Every error deltaflow raises derives from :class:`DeltaflowError`. Errors carry
structured fields (table URI, version, ...) so callers and tests can inspect them
without parsing messages, and they pickle cleanly: Spark moves exceptions between
the driver and Python workers, so every field must survive the round trip.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast


class DeltaflowError(Exception):
    """Base class for every error raised by deltaflow.

    Subclasses declare their structured fields as keyword-only constructor
    arguments; ``retryable`` marks transient failures that the same call may
    survive when repeated.
    """

    retryable: bool = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self._fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (type(self), self.message, self._fields))

    def __str__(self) -> str:
        return self.message


def _rebuild_error(cls: type[DeltaflowError], message: str, fields: dict[str, Any]) -> Any:
    # Fields go to __new__ too: a class may pick a subclass from them
    # (ConcurrentWriteError's kind -> delta-spark's exception class).
    error = cls.__new__(cls, message, **fields)
    DeltaflowError.__init__(error, message, **fields)
    return error


class InvalidOptionError(DeltaflowError, ValueError):
    """An option key or value is not valid; ``option`` names it, ``valid`` lists choices."""

    def __init__(self, message: str, *, option: str, valid: tuple[str, ...] = ()) -> None:
        super().__init__(message, option=option, valid=valid)


class UserCodeError(DeltaflowError):
    """A user-supplied function (transform, foreachBatch) raised; ``__cause__`` is the original."""

    def __init__(self, message: str, *, batch_id: int | None = None) -> None:
        super().__init__(message, batch_id=batch_id)


# Spark hands a Python worker's exception to the driver as text only. A deltaflow error
# crossing that boundary carries its class name, message and fields as JSON between
# these markers. JSON, not pickle: exception text can echo user data, and unpickling
# text an attacker could shape would run their code on the driver.
_WIRE_MARK = re.compile(r"\[deltaflow-error:([A-Za-z0-9+/=]+)\]")


class RemoteDeltaflowError(Exception):
    """A deltaflow error raised in a Python worker, marked to survive the trip to the driver.

    Spark passes a worker's exception on as text only; the marker (:func:`to_wire`) in
    that text lets the driver raise the original typed error again
    (:func:`unpack_remote_error`, :func:`typed_error`).
    """

    def __init__(self, error: DeltaflowError) -> None:
        super().__init__(f"{type(error).__name__}: {error} {to_wire(error)}")


def unpack_remote_error(exc: BaseException) -> DeltaflowError | None:
    """The deltaflow error a pyspark exception carries, if a worker marked one in it."""
    return from_wire(str(exc))


_Function = TypeVar("_Function", bound=Callable[..., Any])


def carry_errors(function: _Function) -> _Function:
    """``function`` (run in a Python worker) with its deltaflow errors packed so that they
    reach the driver, and the query's exception, typed: Spark passes a worker's error on
    as text only (see :func:`unpack_remote_error`)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DeltaflowError as exc:
            raise RemoteDeltaflowError(exc) from exc

    return cast(_Function, wrapper)


def error_answer(exc: DeltaflowError) -> dict[str, Any]:
    """``exc`` as the connector reads an error answer (``DeltaflowException.fromAnswer``)."""
    return {
        "type": type(exc).__name__,
        "message": exc.message,
        "fields": {k: str(v) for k, v in exc._fields.items()},
        "wire": to_wire(exc),
    }


def to_wire(error: DeltaflowError) -> str:
    """``error`` as a marker string that survives Spark's worker-to-driver error text."""
    payload = {
        "type": type(error).__name__,
        "message": error.message,
        "fields": {k: _jsonable(v) for k, v in error._fields.items()},
    }
    packed = base64.b64encode(json.dumps(payload).encode()).decode("ascii")
    return f"[deltaflow-error:{packed}]"


def from_wire(text: str) -> DeltaflowError | None:
    """The deltaflow error a marker in ``text`` describes; None if there is none.

    Only subclasses of :class:`DeltaflowError` are rebuilt, by class name.
    """
    match = _WIRE_MARK.search(text)
    if match is None:
        return None
    try:
        payload = json.loads(base64.b64decode(match.group(1)))
        cls = _error_classes().get(payload["type"])
        if cls is None:
            return None
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in payload["fields"].items()}
        return _rebuild_error(cls, str(payload["message"]), fields)  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError):
        return None


def typed_error(exc: BaseException) -> DeltaflowError | None:
    """The deltaflow error behind ``exc``: ``exc`` itself if it is one, else the error a
    deltaflow marker in its text (or in any exception it was raised from) describes.

    Spark wraps what the connector raises (py4j errors, ``StreamingQueryException``,
    ``AnalysisException``, JDBC errors); each keeps the marker in its text::

        try:
            query.awaitTermination()
        except Exception as exc:
            error = deltaflow.typed_error(exc)  # e.g. ConcurrentWriteError, or None
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, DeltaflowError):
            return current
        found = from_wire(str(current)) or _spark_refusal(str(current))
        if found is not None:
            return found
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


# Spark refuses a real-time query into a sink outside its fixed list in the writer's
# start(), before any deltaflow code sees the trigger: the refusal is recognised here.
_ALLOWLIST_REFUSAL = "OPERATOR_OR_SINK_NOT_IN_ALLOWLIST"
_ALLOWLIST_SETTING = "spark.sql.streaming.realTimeMode.allowlistCheck"
_DELTAFLOW_SINKS = ("io.deltaflow.spark.DeltaTable", "io.deltaflow.spark.DeltaSink")


def _spark_refusal(text: str) -> DeltaflowError | None:
    """The typed error for a Spark refusal of a deltaflow sink that deltaflow cannot raise
    itself (Spark's real-time sink allowlist), or None."""
    if _ALLOWLIST_REFUSAL not in text or not any(s in text for s in _DELTAFLOW_SINKS):
        return None
    from deltaflow.spark.errors import RealTimeModeError

    return RealTimeModeError(
        "Spark's real-time mode refused the Delta sink: it checks a real-time query's sink"
        " against a fixed list of its own sinks when the query starts. Set"
        f" spark.conf.set({_ALLOWLIST_SETTING!r}, 'false') before start() (deltaflow's sink"
        " then checks the query's operators itself on every epoch; see docs/realtime.md),"
        " or use a micro-batch trigger.",
        table_uri="",
        feature="allowlistCheck",
    )


@contextlib.contextmanager
def raising_typed(*, keep_cause: bool = True) -> Iterator[None]:
    """Inside the block, an exception that carries a deltaflow error (Spark's wrappers, py4j,
    Connect's ``UnknownException`` text) is raised as that typed error. ``keep_cause=False``
    drops the wrapper from the traceback (a Connect client's wrapper is only its text)."""
    try:
        yield
    except Exception as exc:
        error = typed_error(exc)
        if error is None or error is exc:
            raise
        if keep_cause:
            raise error from exc
        raise error from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _error_classes() -> dict[str, type[DeltaflowError]]:
    # Import the layers that define errors so every subclass is registered.
    import deltaflow.spark.errors
    import deltaflow.table.errors  # noqa: F401

    found: dict[str, type[DeltaflowError]] = {}
    pending: list[type[DeltaflowError]] = [DeltaflowError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found
