"""An update through a Spark Connect server (``deltaflow pipelines run --remote sc://...``).

The runner stays in the client: it loads the pipeline's files, resolves the graph, starts
each flow's query on the server and waits for it, and keeps the event log. What it learns
from a query's plan in a classic session (the datasets a flow reads, whether a
materialized view can refresh incrementally) it reads over Connect from the plan the
server analysed, as text (``EXPLAIN EXTENDED``'s analysed plan): the datasets a flow reads
by name or by path; a materialized view is recomputed in full on every refresh (its
incremental plan needs the JVM plan's nodes; the event log says why).

Features that run Python beside the query in the driver cannot: ``foreachBatch`` runs its
function in a Python worker of the *server*, away from the update's state (AUTO CDC flows,
``expect_or_fail`` rules, continuous updates), and a flow's own ``spark_conf`` needs a
clone of the update's session. Those are refused as the graph resolves (dry run
included) with :class:`NotOnConnectError`, naming the feature and what to do. The pipeline's
storage must be a path both the client and the server reach (the client writes the event
log and reads stream checkpoints; the server writes the tables): one machine, a shared
mount, or an object store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from deltaflow.pipelines.errors import NotOnConnectError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from deltaflow.pipelines._declarations import AnyFlow
    from deltaflow.pipelines._graph import Graph


def is_connect(spark: object) -> bool:
    """True for a Spark Connect session or DataFrame."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def refuse(feature: str, flow: str | None, what_to_do: str = "") -> NotOnConnectError:
    """The error for ``feature``, which an update through Spark Connect cannot run."""
    what = f"flow {flow!r}: {feature}" if flow else feature
    then = f"{what_to_do}, or run" if what_to_do else "Run"
    return NotOnConnectError(
        f"{what[0].upper()}{what[1:]} cannot run through a Spark Connect server. {then}"
        " this pipeline with a classic session (without --remote / SPARK_REMOTE).",
        feature=feature,
        flow=flow,
    )


# An analysed plan's line: the operator, then its arguments. The names a plan gives the
# relations deltaflow cares about (the same ones `_analysis._relation_name` reads from
# the JVM plan's nodes):
#   SubqueryAlias spark_catalog.db.name          (a catalog table, by name)
#   View (`spark_catalog`.`db`.`name`, [...])    (a view)
#   ... delta.`file:/path/to/table` ...           (a Delta table by path)
#   StreamingRelation ... path=/landing ...       (a file stream's path)
# A streaming plan's lines start with `~`; a view's own plan (indented below it) is not
# looked into when the view is a dataset: the view is the input.
_ALIAS = re.compile(r"^SubqueryAlias\s+(\S+)")
_VIEW = re.compile(r"^View\s+\(([^,]+),")
_DELTA_PATH = re.compile(r"delta\.`([^`]+)`")
_STREAM_PATH = re.compile(r"\bpath=([^,\]\)\s]+)")


def analysed_plan_text(df: DataFrame) -> list[tuple[int, str]]:
    """The lines of ``df``'s analysed plan, as the server prints it: each one's depth
    (the width of the tree's drawing before it) and its text without the drawing."""
    text = df._explain_string(extended=True)  # type: ignore[attr-defined]
    lines = text.splitlines()
    try:
        start = lines.index("== Analyzed Logical Plan ==") + 1
    except ValueError:
        return []
    out = []
    for line in lines[start:]:
        if line.startswith("== "):
            break
        text = re.sub(r"^[\s:|+\-~]*", "", line)
        out.append((len(line) - len(text), text))
    return out


def plan_reads(
    graph: Graph, df: DataFrame, locations: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """As ``_analysis._plan_reads``, from the analysed plan's text: the datasets of
    ``graph`` ``df`` reads by name, and those it reads by path."""
    from deltaflow.table import _uri

    by_name: list[str] = []
    by_path: list[str] = []
    inside_view: int | None = None  # the depth of a dataset's view being skipped
    for depth, line in analysed_plan_text(df):
        if inside_view is not None:
            if depth > inside_view:
                continue
            inside_view = None
        named = _ALIAS.match(line) or _VIEW.match(line)
        if named is not None:
            name = named.group(1).replace("`", "").split(".")[-1]
            dataset = graph.dataset(name)
            if dataset is not None and dataset.name not in by_name:
                by_name.append(dataset.name)
            if dataset is not None and line.startswith("View "):
                inside_view = depth
            continue
        for path in [*_DELTA_PATH.findall(line), *_STREAM_PATH.findall(line)]:
            try:
                located = locations.get(_uri.normalize_uri(path))
            except Exception:  # not a URI: another source's option
                continue
            if located is not None and located not in by_path:
                by_path.append(located)
    return by_name, by_path


def refuse_flow(graph: Graph, flow: AnyFlow) -> None:
    """Raise :class:`NotOnConnectError` if ``flow`` needs what Connect cannot do."""
    from deltaflow.pipelines._declarations import AutoCdcFlow, AutoCdcSnapshotFlow
    from deltaflow.pipelines._expectations import has_fail_rule
    from deltaflow.pipelines._flow_session import flow_confs

    if isinstance(flow, (AutoCdcFlow, AutoCdcSnapshotFlow)):
        raise refuse("AUTO CDC (applied per micro-batch in the driver's foreachBatch)", flow.name)
    target = graph.dataset(flow.target)
    rules = (target.expectations if target is not None else ()) + getattr(flow, "expectations", ())
    if has_fail_rule(rules):
        raise refuse(
            "an expect_or_fail rule (checked per micro-batch in the driver's foreachBatch)",
            flow.name,
            "Use expect or expect_or_drop",
        )
    if flow_confs(flow, target):
        raise refuse(
            "spark_conf (a flow's own settings run in a clone of the driver's session)",
            flow.name,
            "Set the settings on the server or in the spec's configuration",
        )
