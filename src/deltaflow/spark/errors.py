"""Errors raised by the Spark layer: streaming source and sink, DeltaTable maintenance."""

from __future__ import annotations

from deltaflow.errors import DeltaflowError


class StreamingError(DeltaflowError):
    """An error of a streaming query over the Delta table at ``table_uri``."""


class ChangeCommitError(StreamingError):
    """The source table's commit ``version`` removed or rewrote data (UPDATE, DELETE,
    MERGE, overwrite), which an append-only stream cannot represent.

    Terminal: restarting fails at the same version until the query is told how to
    treat such commits (``skipChangeCommits``) or starts after ``version``.
    """

    def __init__(self, message: str, *, table_uri: str, version: int) -> None:
        super().__init__(message, table_uri=table_uri, version=version)


class LogVersionMissingError(StreamingError):
    """The commit file of ``version`` is gone (log cleanup) although the stream still
    needs it; ``earliest`` is the oldest version whose commit file is left, if known."""

    def __init__(
        self, message: str, *, table_uri: str, version: int, earliest: int | None = None
    ) -> None:
        super().__init__(message, table_uri=table_uri, version=version, earliest=earliest)


class SourceSchemaChangedError(StreamingError):
    """Commit ``version`` changed the source's schema. ``additive`` is true when it only
    added columns: a restart of the query picks them up. Otherwise the new schema cannot
    be read with the old one and the query needs a new checkpoint."""

    def __init__(self, message: str, *, table_uri: str, version: int, additive: bool) -> None:
        super().__init__(message, table_uri=table_uri, version=version, additive=additive)


class SourceTableReplacedError(StreamingError):
    """The table at ``table_uri`` is not the one the checkpoint was reading: its table id
    changed from ``expected_id`` to ``found_id`` (dropped and re-created)."""

    def __init__(self, message: str, *, table_uri: str, expected_id: str, found_id: str) -> None:
        super().__init__(message, table_uri=table_uri, expected_id=expected_id, found_id=found_id)


class StreamIdentityError(StreamingError):
    """The streaming sink cannot find a stable identity for its query (needed for
    exactly-once commits): no readable checkpoint metadata and no ``txnAppId``."""

    def __init__(self, message: str, *, table_uri: str, checkpoint_location: str | None) -> None:
        super().__init__(message, table_uri=table_uri, checkpoint_location=checkpoint_location)


class CheckpointLocationError(StreamingError):
    """A stream's ``checkpoint_location`` is on a file system Spark's Hadoop layer cannot
    open here (``scheme``, e.g. ``s3``: the pyspark wheel has no ``hadoop-aws``). Spark
    keeps checkpoints through Hadoop, not through deltaflow's object-store path. Terminal:
    give the query a checkpoint on a local, mounted or HDFS path."""

    def __init__(self, message: str, *, checkpoint_location: str, scheme: str) -> None:
        super().__init__(message, checkpoint_location=checkpoint_location, scheme=scheme)


class RealTimeModeError(StreamingError):
    """A stream over the Delta table at ``table_uri`` asked real-time mode
    (``trigger(realTime=...)``) for ``feature``, which it cannot do here (a Spark without
    real-time mode, or a read option the real-time source does not support). Terminal:
    the message names the trigger or option to use instead."""

    def __init__(self, message: str, *, table_uri: str, feature: str) -> None:
        super().__init__(message, table_uri=table_uri, feature=feature)


class RealTimeEpochError(StreamingError):
    """Real-time epoch ``epoch`` into the Delta table at ``table_uri`` ended short in
    ``partition``: its last task attempt read ``rows`` rows, fewer than the ``visible``
    rows of the epoch an earlier attempt had already committed (or logged in the row log).
    A task retried near the epoch's deadline reads less, because Spark fixes the deadline
    once for every attempt. The epoch is not committed, so nothing is written twice; the
    query stops. Restarting it from its checkpoint replays the epoch (``retryable``)."""

    retryable = True

    def __init__(
        self, message: str, *, table_uri: str, epoch: int, partition: int, rows: int, visible: int
    ) -> None:
        super().__init__(
            message,
            table_uri=table_uri,
            epoch=epoch,
            partition=partition,
            rows=rows,
            visible=visible,
        )


class UnsupportedTriggerError(StreamingError):
    """A stream from or into the Delta table at ``table_uri`` was started with
    ``trigger`` (continuous processing), which deltaflow's source and sink do not take.
    Terminal: ``alternative`` is the trigger to use (``trigger(realTime=...)`` for low
    latency)."""

    def __init__(self, message: str, *, table_uri: str, trigger: str, alternative: str) -> None:
        super().__init__(message, table_uri=table_uri, trigger=trigger, alternative=alternative)


class RetentionTooShortError(DeltaflowError, ValueError):
    """VACUUM was asked to keep removed files for ``retention_hours``, less than the table's
    ``minimum_hours`` (``delta.deletedFileRetentionDuration``, 168 by default), which could
    delete files that running readers or lagging streams still need. Terminal."""

    def __init__(
        self, message: str, *, table_uri: str, retention_hours: float, minimum_hours: float
    ) -> None:
        super().__init__(
            message,
            table_uri=table_uri,
            retention_hours=retention_hours,
            minimum_hours=minimum_hours,
        )


class RestoreFilesMissingError(DeltaflowError):
    """RESTORE of ``table_uri`` to ``version`` needs data files that are gone (VACUUM
    deleted them after the retention): ``missing`` of them, ``path`` the first. Nothing
    was committed. Terminal: restore a later version whose files still exist."""

    def __init__(
        self, message: str, *, table_uri: str, version: int, path: str, missing: int
    ) -> None:
        super().__init__(message, table_uri=table_uri, version=version, path=path, missing=missing)


class SqlSyntaxError(DeltaflowError, ValueError):
    """A Delta SQL statement (``VACUUM``, ``OPTIMIZE``, ``RESTORE``, ...) that deltaflow's SQL
    parser recognised by its first words but could not parse: ``position`` is the offset
    in ``statement`` where it stopped, ``expected`` what it wanted there. Terminal."""

    def __init__(self, message: str, *, statement: str, position: int, expected: str) -> None:
        super().__init__(message, statement=statement, position=position, expected=expected)


class MultipleSourceRowMatchingTargetRowError(DeltaflowError):
    """A MERGE into ``table_uri`` had several source rows match one target row that a
    WHEN MATCHED clause would update or delete (delta-spark's
    ``DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE``). Nothing was committed.
    Terminal: deduplicate the source on the merge keys, then retry."""

    def __init__(self, message: str, *, table_uri: str) -> None:
        super().__init__(message, table_uri=table_uri)


class JvmBuildError(DeltaflowError):
    """deltaflow's JVM connector could not be built or found; ``step`` says where it failed
    (``java``, ``compiler``, ``sources``, ``compile``, ``output``, ``lock``, ``missing``)."""

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message, step=step)


class SessionNotConfiguredError(DeltaflowError):
    """A Spark session was started without deltaflow's connector on its classpath or
    without its settings; ``missing`` names the settings that are absent or wrong."""

    def __init__(self, message: str, *, missing: tuple[str, ...]) -> None:
        super().__init__(message, missing=missing)


class BridgeError(DeltaflowError):
    """The JVM connector's call into the Python side failed outside deltaflow's own
    error types (``operation`` names the call)."""

    def __init__(self, message: str, *, operation: str) -> None:
        super().__init__(message, operation=operation)


class PysparkCompatibilityError(DeltaflowError):
    """The installed pyspark is not one deltaflow supports (``where`` is ``"pyspark"``,
    ``version`` the installed one, ``supported`` the range, e.g. ``">=4.0,<5"``), or a
    method a patch replaces is not where it was (``where`` names it)."""

    def __init__(
        self, message: str, *, where: str, version: str | None = None, supported: str | None = None
    ) -> None:
        super().__init__(message, where=where, version=version, supported=supported)


class MetastoreInUseError(DeltaflowError):
    """The catalog's embedded Derby metastore (``metastore``, its directory) is held by
    another process (``holder_pid``, ``holder``: its command line). Embedded Derby admits
    one process at a time: stop that one, give this one its own warehouse, or share a
    metastore database (``DELTAFLOW_METASTORE_URL``)."""

    retryable = True  # free again once the holder stops

    def __init__(self, message: str, *, metastore: str, holder_pid: str, holder: str) -> None:
        super().__init__(message, metastore=metastore, holder_pid=holder_pid, holder=holder)


class SqlServerConfigError(DeltaflowError, ValueError):
    """``deltaflow sql-server`` was asked to start in a way that is unsafe or cannot work
    (a non-loopback address without authentication, a missing keystore, ...); ``option``
    names the setting to change. Nothing was started."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message, option=option)
