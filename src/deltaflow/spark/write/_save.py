"""delta-spark's DataFrameWriter behaviour for ``format("delta")``, checked in the caller.

The connector's provider runs every save mode and ``partitionBy`` itself. What the
writer patch (:mod:`deltaflow.spark._patches`) still adds through :func:`save_delta`, on
the driver, before any job runs (it goes when the
connector's errors reach PySpark callers typed by themselves):

- ``error`` / ``errorifexists``: raise :class:`TableAlreadyExistsError` if a table
  exists at the path; ``ignore``: do nothing if a table exists (the provider decides
  again at commit time, so a table created meanwhile is still refused);
- ``partitionBy(cols)``: passed as the ``partitionBy`` option (the Python sink and the
  Python writer read it; the provider reads both forms);
- schema enforcement, option checks and app-transaction deduplication run on the
  driver too (``plan_write``), so their errors reach the caller as deltaflow's
  typed errors instead of a pyspark exception wrapping a Python traceback, and a
  write that would be skipped starts no job at all;
- deltaflow errors raised in executors or in the commit (which run in Python
  workers) travel back inside the JVM's error text and are re-raised typed.
"""

from __future__ import annotations

import logging
from typing import Any

from deltaflow.errors import unpack_remote_error
from deltaflow.table import _uri

log = logging.getLogger("deltaflow.write")


def save_delta(
    writer: Any,
    state: dict[str, Any],
    path: str | None,
    original_option: Any,
    original_save: Any,
) -> None:
    from deltaflow.spark._options import AUTO_MERGE_CONF, parse_write_options
    from deltaflow.spark.write._plan import plan_write

    location = path or state["path"]
    mode = (state["mode"] or "errorifexists").lower()
    mode = {"errorifexists": "error", "default": "error"}.get(mode, mode)
    options = dict(state["options"])
    if state["partition_by"]:
        options["partitionBy"] = ",".join(state["partition_by"])
        original_option(writer, "partitionBy", options["partitionBy"])
    if location:
        options["path"] = location
    # The session's schema auto-merge is mergeSchema's default (the connector hands it to
    # the plan the same way).
    auto_merge = writer._df.sparkSession.conf.get(AUTO_MERGE_CONF, None)
    if auto_merge is not None:
        options.setdefault(AUTO_MERGE_CONF, auto_merge)
    parsed = parse_write_options(options)
    uri = _uri.normalize_uri(parsed.path)
    # The same checks the source runs while Spark plans the job; here they raise typed.
    plan = plan_write(uri, writer._df.schema.jsonValue(), mode, parsed)
    if plan.skip:
        # mode ignore on an existing table, or an app transaction already committed
        finish_skipped_batch(writer._df)
        return
    # The connector's provider runs every save mode itself (Spark's Parquet writer,
    # or the Python source for what the JVM does not write yet).
    try:
        original_save(writer, path)
    except Exception as exc:
        error = unpack_remote_error(exc)
        if error is None:
            raise
        raise error from exc


def finish_skipped_batch(df: Any) -> None:
    """Run a skipped ``foreachBatch`` micro-batch of a stateful query into Spark's ``noop``.

    Spark 4.3 fails a stateful query (STATE_STORE_COMMIT_VALIDATION_FAILED) when a
    ``foreachBatch`` function returns without running its batch, because the batch's
    state stores commit only when every partition is processed. A write skipped as a
    replay (``txnAppId`` / ``txnVersion`` already in the log) or by mode ``ignore`` must
    still run it; anything else that is skipped runs nothing, as in delta-spark. (The
    JVM stream sink runs every replayed batch, without asking: it only ever sees
    micro-batches, and replays are rare.)
    """
    if _runs_state_stores(df):
        log.info("deltaflow write skipped: running the stateful micro-batch into noop")
        df.write.format("noop").mode("overwrite").save()


def _runs_state_stores(df: Any) -> bool:
    """Whether ``df`` is a micro-batch (``foreachBatch`` hands over a LogicalRDD of the
    planned batch) whose RDD lineage reads or writes state stores."""
    try:
        logical = df._jdf.queryExecution().logical()
        if not logical.getClass().getName().endswith(".LogicalRDD"):
            return False
        return "StateStore" in str(logical.rdd().toDebugString())
    except Exception:  # Spark Connect, or a JVM that moved these classes
        log.debug("deltaflow write: could not inspect the skipped DataFrame", exc_info=True)
        return False
