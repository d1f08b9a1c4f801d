"""Errors the console raises (configuration and requests outside the roots)."""

from __future__ import annotations

from deltaflow.errors import DeltaflowError


class ConsoleConfigError(DeltaflowError, ValueError):
    """The console cannot start as asked; ``option`` names the flag at fault."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message, option=option)


class ConsoleRequestError(DeltaflowError):
    """A request the console refuses; ``status`` and ``code`` become the JSON error."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message, status=status, code=code)
