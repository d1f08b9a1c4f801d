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


class GraphValidationError(PipelineError, ValueError):
    """The graph cannot run: ``problem`` is ``cycle`` (flows read each other),
    ``missing_input`` (a flow reads a table that does not exist), ``schema_conflict``
    (two flows write one column with different types), ``no_schema``,
    ``not_a_dataframe`` or ``bad_spark_conf`` (a flow's ``spark_conf`` sets a conf Spark
    fixes at startup); ``flow`` names the flow. Found by the dry run before anything
    ran; fix the declarations."""

    def __init__(self, message: str, *, flow: str, problem: str) -> None:
        super().__init__(message, flow=flow, problem=problem)


class RealTimeFlowError(GraphValidationError):
    """A flow asks for real-time mode (``spark_conf={"pipelines.trigger": "RealTime"}``)
    where it cannot run: ``problem`` says why (``real_time_not_continuous``,
    ``real_time_not_enabled``, ``real_time_stateful``, ``real_time_materialized_view``,
    ...), ``alternative`` what to do instead. Found when the graph is analysed, before
    any flow runs; terminal."""

    def __init__(self, message: str, *, flow: str, problem: str, alternative: str) -> None:
        PipelineError.__init__(self, message, flow=flow, problem=problem, alternative=alternative)


class UserQueryError(PipelineError):
    """A dataset's query function raised while the pipeline analysed or ran it;
    ``__cause__`` is the original exception, ``flow`` the flow."""

    def __init__(self, message: str, *, flow: str) -> None:
        super().__init__(message, flow=flow)


class ExpectationViolationError(PipelineError):
    """An ``expect_or_fail`` rule was broken: ``flow`` failed (other flows go on),
    ``expectation`` / ``constraint`` name the rule, ``record`` is one offending row as
    JSON, ``failed_records`` how many broke it. Nothing of that batch was written."""

    def __init__(
        self,
        message: str,
        *,
        flow: str,
        dataset: str,
        expectation: str,
        constraint: str,
        record: str,
        failed_records: int,
    ) -> None:
        super().__init__(
            message,
            flow=flow,
            dataset=dataset,
            expectation=expectation,
            constraint=constraint,
            record=record,
            failed_records=failed_records,
        )


class FlowFailedError(PipelineError):
    """An update finished with failed flows: ``failed`` maps each failed flow to its
    error message; ``update_id`` names the update in the event log."""

    def __init__(self, message: str, *, update_id: str, failed: dict[str, str]) -> None:
        super().__init__(message, update_id=update_id, failed=failed)


class SpecError(PipelineError, ValueError):
    """``spark-pipeline.yml`` is missing or invalid: ``path`` is the file (or the directory
    searched), ``field`` the offending field when there is one."""

    def __init__(self, message: str, *, path: str, field: str | None) -> None:
        super().__init__(message, path=path, field=field)


class PipelineStorageError(PipelineError, ValueError):
    """The pipeline's ``storage`` (a URI) cannot hold what the update must keep there, named
    by ``setting``: the streaming checkpoints of a pipeline stored on an object store need
    ``pipelines.checkpointRoot`` on a local, mounted or HDFS path. Terminal."""

    def __init__(self, message: str, *, storage: str, setting: str) -> None:
        super().__init__(message, storage=storage, setting=setting)


class NotOnConnectError(PipelineError, NotImplementedError):
    """A pipeline feature that needs a classic (in-process) Spark session was asked of an
    update running through a Spark Connect server (``deltaflow pipelines run --remote``):
    ``feature`` names it, ``flow`` the flow that uses it (None: the whole update). Run the
    pipeline with a classic session (no ``--remote``), or drop the feature."""

    def __init__(self, message: str, *, feature: str, flow: str | None) -> None:
        super().__init__(message, feature=feature, flow=flow)
