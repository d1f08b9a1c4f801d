"""The errors ``deltaflow maintain`` raises."""

from __future__ import annotations

from deltaflow.errors import DeltaflowError


class MaintainError(DeltaflowError):
    """Base of the maintenance service's errors."""


class MaintainRootError(MaintainError, ValueError):
    """A root to search for tables cannot be used; ``kind`` says why: ``missing``,
    ``not_a_directory`` or ``unreachable`` (an object store that cannot be listed with the
    environment's settings)."""

    def __init__(self, message: str, *, path: str, kind: str) -> None:
        super().__init__(message, path=path, kind=kind)


class MaintenanceFailedError(MaintainError):
    """A pass left some tables unmaintained; ``tables`` names them, ``details`` says what
    failed on each (``action: error``). The other tables were still processed."""

    def __init__(self, message: str, *, tables: tuple[str, ...], details: tuple[str, ...]) -> None:
        super().__init__(message, tables=tables, details=details)
