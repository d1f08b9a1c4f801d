"""deltaflow errors that are also the pyspark exceptions delta-spark raises in their place.

delta-spark's Python API reaches the JVM, so its refusals arrive as pyspark's captured
exceptions: ``AnalysisException`` when ``DeltaTable.create(...).tableName(t)`` names a
table that exists or ``replace`` one that does not, ``ParseException`` for a column type
that does not parse, ``UnsupportedOperationException`` for an identity column that is
not BIGINT. Code written for delta-spark catches those. deltaflow's builder runs in
Python, so it raises classes that are both: the typed deltaflow error (with its fields)
and the pyspark exception. Only the driver-side Python API raises them; this module
imports pyspark and is imported where a Spark session already runs.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors.exceptions.base import (
    UnsupportedOperationException as _BaseUnsupportedOperationException,
)
from pyspark.errors.exceptions.captured import AnalysisException, ParseException

from deltaflow.errors import DeltaflowError, InvalidOptionError
from deltaflow.table.errors import GeneratedColumnError, TableAlreadyExistsError, TableNotFoundError


class _AsCaptured:
    """State pyspark's exceptions read: the captured ones normally wrap a JVM throwable
    (none here, so ``getCondition()`` answers None), the base ones an error class."""

    def _capture(self, message: str, error_class: str | None = None) -> None:
        self._desc = message
        self._stackTrace = ""
        self._cause = None
        self._origin = None
        self._message = message
        self._errorClass = error_class
        self._messageParameters: dict[str, str] = {}
        self._contexts: list[Any] = []

    def __str__(self) -> str:
        return DeltaflowError.__str__(self)  # type: ignore[arg-type]


class TableAlreadyExistsAnalysisError(_AsCaptured, TableAlreadyExistsError, AnalysisException):
    """A :class:`TableAlreadyExistsError` that is pyspark's ``AnalysisException``."""

    def __init__(self, message: str, *, table_uri: str) -> None:
        TableAlreadyExistsError.__init__(self, message, table_uri=table_uri)
        self._capture(message)


class TableNotFoundAnalysisError(_AsCaptured, TableNotFoundError, AnalysisException):
    """A :class:`TableNotFoundError` that is pyspark's ``AnalysisException``."""

    def __init__(self, message: str, *, table_uri: str) -> None:
        TableNotFoundError.__init__(self, message, table_uri=table_uri)
        self._capture(message)


class DataTypeParseError(_AsCaptured, InvalidOptionError, ParseException):
    """An :class:`InvalidOptionError` (a column type that does not parse) that is
    pyspark's ``ParseException``."""

    def __init__(self, message: str, *, option: str, valid: tuple[str, ...] = ()) -> None:
        InvalidOptionError.__init__(self, message, option=option, valid=valid)
        self._capture(message)


class UnsupportedColumnError(_AsCaptured, GeneratedColumnError, _BaseUnsupportedOperationException):
    """A :class:`GeneratedColumnError` that is pyspark's ``UnsupportedOperationException``
    (delta-spark's answer to an identity column of a type other than BIGINT)."""

    def __init__(self, message: str, **fields: Any) -> None:
        GeneratedColumnError.__init__(self, message, **fields)
        self._capture(message, fields.get("error_class"))
