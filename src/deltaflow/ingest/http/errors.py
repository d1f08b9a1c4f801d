"""Errors of the HTTP ingest service (``deltaflow serve``).

Request-level problems never raise out of the server: they become 4xx/5xx JSON bodies
(see ``_http_app``). These types cover configuration and start-up, where the operator
has to act, and the commit path, where a client may retry.
"""

from __future__ import annotations

from deltaflow.errors import DeltaflowError, InvalidOptionError


class ServeConfigError(InvalidOptionError):
    """The service configuration (file or flags) is invalid; ``option`` names the key."""


class IngestCommitError(DeltaflowError):
    """A group of requests could not be committed; nothing of it is in the table.

    Retryable: the client may resend the same request (with the same idempotency key).
    """

    retryable = True

    def __init__(self, message: str, *, table: str, table_uri: str) -> None:
        super().__init__(message, table=table, table_uri=table_uri)
