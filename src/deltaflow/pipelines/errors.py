"""Errors raised while declaring, validating and running a pipeline."""

from __future__ import annotations

from deltaflow.errors import DeltaflowError


class PipelineError(DeltaflowError):
    """An error about one pipeline."""


class DefinitionError(PipelineError, ValueError):
    """A declaration is invalid: a wrong argument, a duplicate name, a flow into a dataset
    that cannot take it. ``dataset`` names the dataset or flow, ``location`` where it was
    declared (``path:line``). Nothing ran; fix the declaration."""

    def __init__(self, message: str, *, dataset: str | None, location: str) -> None:
        super().__init__(message, dataset=dataset, location=location)


class NoActivePipelineError(PipelineError, RuntimeError):
    """A dataset or flow was declared outside a pipeline definition (no graph is being
    collected). Load the file with ``deltaflow pipelines run`` / ``dry-run``, or collect
    the declarations in tests with ``deltaflow.pipelines.collect()``."""

    def __init__(self, message: str, *, declaration: str) -> None:
        super().__init__(message, declaration=declaration)
