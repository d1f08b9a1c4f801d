"""Errors raised by the ``cloudFiles`` landing-zone source."""

from __future__ import annotations

from deltaflow.errors import DeltaflowError


class CloudFilesError(DeltaflowError):
    """Base class of the landing-zone source's errors."""


class NewColumnsError(CloudFilesError):
    """Files carry columns the stream's schema lacks.

    In ``addNewColumns`` mode the new schema was recorded as ``schema_version`` under
    ``schema_location`` before this was raised: restarting the query reads the new
    columns. In ``failOnNewColumns`` mode nothing was recorded (``schema_version`` is
    None): change the mode or give the stream a schema with the columns.
    """

    def __init__(
        self,
        message: str,
        *,
        columns: tuple[str, ...],
        file_path: str,
        schema_location: str,
        schema_version: int | None,
        mode: str,
    ) -> None:
        super().__init__(
            message,
            columns=columns,
            file_path=file_path,
            schema_location=schema_location,
            schema_version=schema_version,
            mode=mode,
        )


class SchemaInferenceError(CloudFilesError):
    """No schema was given and none could be inferred (e.g. the landing zone is empty)."""

    def __init__(self, message: str, *, source_path: str, schema_location: str) -> None:
        super().__init__(message, source_path=source_path, schema_location=schema_location)


class MalformedRecordError(CloudFilesError):
    """A record could not be read and the stream's schema has no rescued-data column to
    keep it in (a user schema without ``_rescued_data STRING``)."""

    def __init__(self, message: str, *, file_path: str, record_index: int) -> None:
        super().__init__(message, file_path=file_path, record_index=record_index)
