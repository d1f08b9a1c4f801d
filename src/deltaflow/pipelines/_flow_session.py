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
A setting Spark cannot change at runtime (a static or core conf) is a
:class:`GraphValidationError` when the graph resolves, dry run included.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """Every setting must be one a session can change at runtime."""
    fixed = sorted(k for k in confs if not spark.conf.isModifiable(k))
    if fixed:
        raise GraphValidationError(
            f"flow {flow!r}: spark_conf sets {', '.join(fixed)}, which Spark fixes when the"
            " application starts, so it cannot differ per flow. Set it for the whole"
            " application (spark-submit --conf / deltaflow.session(conf=...)) instead.",
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
