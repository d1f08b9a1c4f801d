"""Per-flow ``spark_conf``: each flow that carries settings runs in a session of its own.

Spark SQL settings belong to a session, and an update runs several flows at once on
one session, so setting a flow's confs on it (and restoring them afterwards) would leak
them into whatever else runs meanwhile. Instead a flow with ``spark_conf`` gets a clone
of the update's session (Spark's ``cloneSession``: the same SparkContext, a copy of the
SQL settings, temporary views and current database) with its settings applied, and its
query is re-planned there. A stream started from that DataFrame clones the session
again when it starts (Spark does this for every stream), so its micro-batches, and the
writes of a ``foreachBatch`` function, see the flow's settings; nothing else does.

Settings are the dataset's (``@dp.table(spark_conf=...)``, ``create_streaming_table``)
then the flow's own (``append_flow(spark_conf=...)``), the flow's winning on a clash.
A setting Spark cannot change at runtime (a static or core conf), or a value it
rejects, is a :class:`GraphValidationError` when the graph resolves, dry run included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from deltaflow.pipelines._declarations import AnyFlow, Dataset
from deltaflow.pipelines.errors import GraphValidationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def flow_confs(flow: AnyFlow, target: Dataset | None) -> dict[str, str]:
    """The settings ``flow`` runs with: its target dataset's, then its own."""
    confs = dict(target.spark_conf) if target is not None else {}
    confs.update(getattr(flow, "spark_conf", None) or {})
    return confs


def check_confs(spark: SparkSession, flow: str, confs: Mapping[str, str]) -> None:
    """Every setting must be one a session takes at runtime, with a value it accepts:
    each is tried on a scratch clone of ``spark``, so the answer is Spark's own (a
    static or core conf is refused; a key Spark does not know is fine, as with
    ``spark.conf.set``)."""
    if not confs:
        return
    scratch = spark._jsparkSession.cloneSession().conf()
    refused = []
    for key, value in confs.items():
        try:
            scratch.set(key, value)
        except Exception as exc:
            java = getattr(exc, "java_exception", None)  # py4j: Spark's own message
            reason = str(java.getMessage() if java is not None else exc).strip()
            refused.append(f"{key}={value!r} ({reason.splitlines()[0][:200] if reason else exc})")
    if refused:
        raise GraphValidationError(
            f"flow {flow!r}: spark_conf sets what a session cannot take at runtime:"
            f" {'; '.join(refused)}. Set startup confs for the whole application"
            " (spark-submit --conf / deltaflow.session(conf=...)), or fix the value.",
            flow=flow,
            problem="bad_spark_conf",
        )


def session_for(spark: SparkSession, confs: Mapping[str, str]) -> SparkSession:
    """``spark`` itself when there are no settings; else a clone with them applied."""
    if not confs:
        return spark
    from pyspark.sql import SparkSession

    clone = SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())
    # The current database is the update's (the clone's copy may predate the switch).
    clone.catalog.setCurrentDatabase(spark.catalog.currentDatabase())
    for key, value in confs.items():
        clone.conf.set(key, value)
    return clone


def rebind(df: DataFrame, session: SparkSession) -> DataFrame:
    """``df``'s query planned in ``session`` (analysed again there, with its settings)."""
    if df.sparkSession is session:
        return df
    from pyspark.sql import DataFrame

    jvm = session.sparkContext._jvm
    assert jvm is not None
    plan = df._jdf.queryExecution().logical()
    jdf = jvm.org.apache.spark.sql.classic.Dataset.ofRows(session._jsparkSession, plan)
    return DataFrame(jdf, session)


@contextlib.contextmanager
def active(spark: SparkSession) -> Iterator[None]:
    """``spark`` as the JVM thread's active session while a stream starts by table name.

    The update's flows start from threads of their own (the scheduler's, the continuous
    driver's), whose JVM thread may have no active session. Seen from the continuous
    driver's thread: ``toTable`` then resolves the name through a catalog that is not
    the session's own (deltaflow's catalog, found through the active session's
    settings), loads the table as if named by path, without its streaming write, and
    fails with "doesn't support streaming write". The thread's previous active session
    is put back afterwards."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    sessions = jvm.org.apache.spark.sql.SparkSession
    before = sessions.getActiveSession()
    sessions.setActiveSession(spark._jsparkSession)
    try:
        yield
    finally:
        if before.isDefined():
            sessions.setActiveSession(before.get())
        else:
            sessions.clearActiveSession()
