"""Errors raised by the Delta table layer (snapshots, commits, schemas)."""

from __future__ import annotations

from typing import Any

from deltaflow.errors import DeltaflowError


class TableError(DeltaflowError):
    """An error about one Delta table; ``table_uri`` names it."""


class TableNotFoundError(TableError, FileNotFoundError):
    """No Delta table (no ``_delta_log``) exists at ``table_uri``."""

    def __init__(self, message: str, *, table_uri: str) -> None:
        super().__init__(message, table_uri=table_uri)


class TableAlreadyExistsError(TableError, FileExistsError):
    """A write in mode ``error`` found a table at ``table_uri``."""

    def __init__(self, message: str, *, table_uri: str) -> None:
        super().__init__(message, table_uri=table_uri)


class LocationNotEmptyError(TableAlreadyExistsError):
    """A new managed table's location (``table_uri``) already holds files: another
    table's log or other data. The create was refused before anything was written, as
    Spark's ``LOCATION_ALREADY_EXISTS`` (``error_class``); ``table_name`` is the table."""

    def __init__(
        self,
        message: str,
        *,
        table_uri: str,
        table_name: str,
        error_class: str = "LOCATION_ALREADY_EXISTS",
    ) -> None:
        TableError.__init__(
            self, message, table_uri=table_uri, table_name=table_name, error_class=error_class
        )


class VersionNotFoundError(TableError, ValueError):
    """A requested version or timestamp is outside the table's history."""

    def __init__(
        self,
        message: str,
        *,
        table_uri: str,
        version: int | None = None,
        timestamp: str | None = None,
        earliest: int | None = None,
        latest: int | None = None,
    ) -> None:
        super().__init__(
            message,
            table_uri=table_uri,
            version=version,
            timestamp=timestamp,
            earliest=earliest,
            latest=latest,
        )


class UnsupportedFeatureError(TableError, NotImplementedError):
    """The table uses a Delta protocol feature deltaflow cannot honour yet."""

    def __init__(self, message: str, *, table_uri: str, feature: str) -> None:
        super().__init__(message, table_uri=table_uri, feature=feature)


class SchemaMismatchError(TableError, ValueError):
    """Data does not match the table schema; ``columns`` lists the offending columns."""

    def __init__(self, message: str, *, table_uri: str, columns: tuple[str, ...]) -> None:
        super().__init__(message, table_uri=table_uri, columns=columns)


class ReplaceWhereViolationError(TableError, ValueError):
    """A ``replaceWhere`` overwrite received rows that do not satisfy its predicate."""

    def __init__(self, message: str, *, table_uri: str, predicate: str) -> None:
        super().__init__(message, table_uri=table_uri, predicate=predicate)


class ConcurrentWriteError(TableError):
    """A commit lost a race with another writer and could not be reconciled.

    ``kind`` follows delta-spark's exception names (``ConcurrentAppend``,
    ``ConcurrentDeleteRead``, ``ConcurrentDeleteDelete``, ``MetadataChanged``,
    ``ConcurrentTransaction``, ``ProtocolChanged``). Retrying the whole operation
    on a fresh snapshot usually succeeds, hence ``retryable``.

    Constructing one gives the delta-spark class of its ``kind``
    (``ConcurrentWriteError(..., kind="ConcurrentAppend")`` is a
    :class:`ConcurrentAppendException`), so every place that raises a conflict, and
    every error rebuilt from the wire, lets ``except ConcurrentAppendException:`` work
    as with delta-spark while ``except ConcurrentWriteError:`` still catches them all.
    """

    retryable = True

    def __new__(cls, *args: Any, **fields: Any) -> ConcurrentWriteError:
        if cls is ConcurrentWriteError:
            kind = fields.get("kind")
            cls = _CONFLICT_CLASSES.get(kind, DeltaConcurrentModificationException)
        return super().__new__(cls, *args)

    def __init__(
        self, message: str, *, table_uri: str, kind: str, read_version: int | None, attempts: int
    ) -> None:
        super().__init__(
            message, table_uri=table_uri, kind=kind, read_version=read_version, attempts=attempts
        )


# delta-spark's ``delta.exceptions`` classes (``io.delta.exceptions`` in Scala), re-exported
# by ``deltaflow.exceptions``. They live here, not above ``table/``, because this layer
# raises them. As in delta-spark's Scala hierarchy, every one is a
# DeltaConcurrentModificationException; ours are also ConcurrentWriteErrors.


class DeltaConcurrentModificationException(ConcurrentWriteError):
    """A commit conflicted with a concurrent one: the base of every Delta conflict."""


class ConcurrentWriteException(DeltaConcurrentModificationException):
    """A concurrent transaction wrote data after this one read the table."""


class MetadataChangedException(DeltaConcurrentModificationException):
    """The table's metadata changed between this transaction's read and its commit."""


class ProtocolChangedException(DeltaConcurrentModificationException):
    """The table's protocol changed between this transaction's read and its commit."""


class ConcurrentAppendException(DeltaConcurrentModificationException):
    """Files were added that this transaction would have read."""


class ConcurrentDeleteReadException(DeltaConcurrentModificationException):
    """This transaction read data that a concurrent transaction deleted."""


class ConcurrentDeleteDeleteException(DeltaConcurrentModificationException):
    """This transaction deleted data that a concurrent transaction deleted too."""


class ConcurrentTransactionException(DeltaConcurrentModificationException):
    """Concurrent transactions both updated the same idempotent (app) transaction, or a
    commit lost the race for a version too many times in a row."""


# ConcurrentWriteError.kind -> its delta-spark class.
_CONFLICT_CLASSES: dict[Any, type[ConcurrentWriteError]] = {
    "ConcurrentWrite": ConcurrentWriteException,
    "MetadataChanged": MetadataChangedException,
    "ProtocolChanged": ProtocolChangedException,
    "ConcurrentAppend": ConcurrentAppendException,
    "ConcurrentDeleteRead": ConcurrentDeleteReadException,
    "ConcurrentDeleteDelete": ConcurrentDeleteDeleteException,
    "ConcurrentTransaction": ConcurrentTransactionException,
}


class CorruptTableError(TableError):
    """A file the log references is missing or unreadable (e.g. a deletion vector)."""

    def __init__(self, message: str, *, table_uri: str, path: str) -> None:
        super().__init__(message, table_uri=table_uri, path=path)


class ChangeDataNotRecordedError(TableError, ValueError):
    """Change data of ``table_uri`` was asked for the range [``start``, ``end``], but
    ``delta.enableChangeDataFeed`` was off at ``version`` (delta-spark's
    ``DELTA_MISSING_CHANGE_DATA``). Terminal: read a range in which the feed was on."""

    def __init__(self, message: str, *, table_uri: str, version: int, start: int, end: int) -> None:
        super().__init__(message, table_uri=table_uri, version=version, start=start, end=end)


class ChangeDataFilesMissingError(TableError):
    """A file that holds the change data of ``version`` is gone (VACUUM removed it), so
    the change feed of that version cannot be read any more. Terminal."""

    def __init__(self, message: str, *, table_uri: str, version: int, path: str) -> None:
        super().__init__(message, table_uri=table_uri, version=version, path=path)


class ObjectStoreError(TableError, OSError):
    """The object store holding ``table_uri`` refused or failed a request.

    ``kind`` is ``credentials`` (no credentials, or ones the store rejects: terminal until
    the settings change), ``unreachable`` (no answer from the endpoint: ``retryable``) or
    ``other``. The message says which settings deltaflow's object-store path reads.
    """

    def __init__(self, message: str, *, table_uri: str, kind: str) -> None:
        super().__init__(message, table_uri=table_uri, kind=kind)

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return bool(getattr(self, "kind", None) == "unreachable")


class ConstraintViolationError(SchemaMismatchError):
    """Rows break a CHECK constraint or a NOT NULL column of ``table_uri``.

    ``kind`` is ``check`` (``constraint`` is its name, ``expression`` its SQL) or
    ``notNull`` (``constraint`` is the column path); ``values`` shows a violating row's
    values of the columns involved (``columns``); ``rows`` counts the violating rows when
    known (ALTER TABLE checking existing data). Nothing was written or changed. Terminal:
    fix the data or the constraint. A :class:`SchemaMismatchError`, which NOT NULL
    violations were reported as before CHECK constraints existed.
    """

    def __init__(
        self,
        message: str,
        *,
        table_uri: str,
        constraint: str,
        kind: str,
        expression: str,
        values: str,
        columns: tuple[str, ...] = (),
        rows: int | None = None,
    ) -> None:
        TableError.__init__(
            self,
            message,
            table_uri=table_uri,
            columns=tuple(columns),
            constraint=constraint,
            kind=kind,
            expression=expression,
            values=values,
            rows=rows,
        )


class InvalidConstraintError(TableError, ValueError):
    """A CHECK constraint that cannot be added to ``table_uri``: its expression does not
    parse, is not boolean, names unknown columns, or the name is taken."""

    def __init__(self, message: str, *, table_uri: str, constraint: str, expression: str) -> None:
        super().__init__(message, table_uri=table_uri, constraint=constraint, expression=expression)


class GeneratedColumnError(TableError, ValueError):
    """A generated or identity column declared or used against Delta's rules: an invalid
    generation expression, an identity column of the wrong type, an explicit value for a
    ``GENERATED ALWAYS AS IDENTITY`` column, an UPDATE of an identity column. ``column``
    names it, ``table_uri`` the table; ``error_class`` is delta-spark's error class for
    the same refusal when it has one (``DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED``,
    ``DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED``). Nothing was written.
    Terminal: fix the statement."""

    def __init__(
        self,
        message: str,
        *,
        table_uri: str,
        column: str,
        reason: str,
        error_class: str | None = None,
    ) -> None:
        super().__init__(
            message, table_uri=table_uri, column=column, reason=reason, error_class=error_class
        )
