"""The root of deltaflow's exception tree.

Every error deltaflow raises derives from :class:`DeltaflowError`. Errors carry
structured fields (table URI, version, ...) so callers and tests can inspect them
without parsing messages, and they pickle cleanly: Spark moves exceptions between
the driver and Python workers, so every field must survive the round trip.
"""

from __future__ import annotations

from typing import Any


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
    error = cls.__new__(cls)
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
