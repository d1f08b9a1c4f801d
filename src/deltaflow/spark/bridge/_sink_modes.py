"""The output modes a stream's Delta sink honours (the bridge's ``sink.check``)."""

from __future__ import annotations

from deltaflow.errors import InvalidOptionError

# Output modes a Delta sink can honour: complete overwrites, append appends, and update
# appends too when the query emits each row once (no per-key state: a stateless query,
# the one output mode Spark's real-time mode takes). An update per key would need an
# upsert, which is MERGE's job (foreachBatch), as in delta-spark.
_SINK_OUTPUT_MODES = ("append", "complete", "update")


def check_output_mode(path: str, mode: str, per_key: list[str]) -> None:
    """Refuse an output mode the Delta sink cannot honour: ``per_key`` names the query's
    operators that re-emit rows per key (a streaming aggregation, ``(flat)MapGroupsWithState``,
    ``transformWithState``), which update mode would write as duplicates."""
    if mode not in _SINK_OUTPUT_MODES:
        raise InvalidOptionError(
            f"A Delta sink takes output mode 'append', 'complete' or 'update' (of a query"
            f" without aggregations), not {mode!r}.",
            option="outputMode",
            valid=_SINK_OUTPUT_MODES,
        )
    if mode == "update" and per_key:
        raise InvalidOptionError(
            f"The stream into {path} runs in update output mode with"
            f" {', '.join(sorted(set(per_key)))}, which re-emits a key's row on every change:"
            " a Delta table has no per-key update. Use outputMode('complete') (the table is"
            " rewritten each batch), outputMode('append') with a watermark (each key written"
            " once, when final), or .foreachBatch(...) with"
            " DeltaTable.forPath(spark, path).merge(...) to upsert by key.",
            option="outputMode",
            valid=("append", "complete"),
        )
