"""Loading a pipeline's library files into a :class:`~._graph.Graph`.

Python files run as modules with ``spark`` in their namespace (as ``spark-pipelines``
does), their decorators registering with the graph being collected: deltaflow's
(``from deltaflow import pipelines as dp``) and ``pyspark.pipelines``' (an SDP project's
``from pyspark import pipelines as dp``, through :mod:`._sdp`). The pipeline's
``configuration`` is set on the session while they load. SQL files declare
datasets with Lakeflow's statements:

    CREATE [OR REFRESH] MATERIALIZED VIEW name [(CONSTRAINT c EXPECT (cond) [ON VIOLATION
        {DROP ROW | FAIL UPDATE}], ...)] [COMMENT '...'] AS query
    CREATE [OR REFRESH] STREAMING TABLE name [(...)] [COMMENT '...'] [AS query]
    CREATE [TEMPORARY] VIEW name AS query
    CREATE FLOW name AS AUTO CDC INTO target FROM STREAM(source) KEYS (...) ...
    APPLY CHANGES INTO LIVE.target FROM STREAM(LIVE.source) KEYS (...) ...

A streaming table's query reads streams with ``STREAM(t)`` / ``STREAM t``, which Spark's
SQL understands; one without a query is the target of AUTO CDC flows (:mod:`._sql_cdc`),
its column list may hold column definitions besides constraints.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _sql_cdc
from deltaflow.pipelines._declarations import (
    Dataset,
    DatasetKind,
    Expectation,
    ExpectationAction,
    Flow,
    SourceLocation,
)
from deltaflow.pipelines._graph import Graph, GraphBuilder, collect
from deltaflow.pipelines._sdp import registering
from deltaflow.pipelines._spec import PipelineSpec
from deltaflow.pipelines.errors import DefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def load_graph(spark: SparkSession, spec: PipelineSpec) -> Graph:
    """Every dataset and flow the spec's libraries declare."""
    files = spec.library_files()
    if not files:
        raise DefinitionError(
            f"pipeline {spec.name!r}: its libraries ({', '.join(spec.libraries) or 'none'})"
            f" match no .py or .sql file under {spec.root}.",
            dataset=None,
            location=str(spec.root),
        )
    with collect() as builder, registering(spark, builder), configured(spark, spec):
        for file in files:
            if file.suffix == ".py":
                _load_python(spark, file, spec.root)
            else:
                _load_sql(spark, file, builder)
    return builder.graph()


@contextlib.contextmanager
def configured(spark: SparkSession, spec: PipelineSpec) -> Iterator[None]:
    """The pipeline's ``configuration`` set on the session while its files load (and put
    back after), so a file reads it at import time (``SRC = spark.conf.get("x")`` at
    module level), as under Lakeflow and ``spark-pipelines``; the update sets it again
    for the queries."""
    before = {key: spark.conf.get(key, None) for key in spec.configuration}
    for key, value in spec.configuration.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _load_python(spark: SparkSession, file: Path, root: Path) -> None:
    name = f"deltaflow_pipeline_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise DefinitionError(f"cannot load {file} as Python", dataset=None, location=str(file))
    module = importlib.util.module_from_spec(module_spec)
    module.__dict__["spark"] = spark
    added = str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))  # library files may import helpers next to them
    try:
        module_spec.loader.exec_module(module)
    except DefinitionError:
        raise
    except Exception as exc:
        raise DefinitionError(
            f"loading {file} failed: {type(exc).__name__}: {exc}",
            dataset=None,
            location=str(file),
        ) from exc
    finally:
        if added:
            sys.path.remove(str(root))


_CREATE = re.compile(
    r"""^\s*CREATE\s+(?:OR\s+REFRESH\s+|OR\s+REPLACE\s+)?
        (?P<kind>MATERIALIZED\s+VIEW|STREAMING\s+TABLE|(?:TEMPORARY\s+|TEMP\s+)?VIEW)\s+
        (?P<name>`[^`]+`|[\w.]+)\s*""",
    re.IGNORECASE | re.VERBOSE,
)
_CONSTRAINT = re.compile(
    r"""CONSTRAINT\s+(?P<name>`[^`]+`|\w+)\s+EXPECT\s*\((?P<cond>.*)\)\s*
        (?:ON\s+VIOLATION\s+(?P<action>DROP\s+ROW|FAIL\s+UPDATE))?\s*$""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)
_COMMENT = re.compile(r"^\s*COMMENT\s+'((?:[^'\\]|\\.)*)'\s*", re.IGNORECASE)
_AS = re.compile(r"^\s*AS\s+", re.IGNORECASE)
_USING = re.compile(r"^\s*USING\s+(\w+)\s*", re.IGNORECASE)


def _load_sql(spark: SparkSession, file: Path, builder: GraphBuilder) -> None:
    declare_sql_text(spark, file.read_text(encoding="utf-8"), file, builder)


def declare_sql_text(spark: SparkSession, text: str, file: Path, builder: GraphBuilder) -> None:
    """Declare the datasets and flows of SQL ``text``, from ``file``."""
    for offset, statement in split_statements(text):
        line = text.count("\n", 0, offset) + 1
        _declare_sql(spark, statement, SourceLocation(str(file), line), builder)


def _declare_sql(
    spark: SparkSession, statement: str, where: SourceLocation, builder: GraphBuilder
) -> None:
    if _sql_cdc.is_auto_cdc(statement):
        _sql_cdc.declare(statement, where)
        return
    head = _CREATE.match(statement)
    if head is None:
        raise DefinitionError(
            f"{where}: a pipeline SQL file holds CREATE MATERIALIZED VIEW / STREAMING TABLE /"
            " VIEW ... AS and CREATE FLOW ... AS AUTO CDC INTO / APPLY CHANGES INTO"
            f" statements; got: {statement.strip()[:80]!r}",
            dataset=None,
            location=str(where),
        )
    kind_text = " ".join(head.group("kind").upper().split())
    kind: DatasetKind = (
        "materialized_view"
        if kind_text == "MATERIALIZED VIEW"
        else "streaming_table"
        if kind_text == "STREAMING TABLE"
        else "temporary_view"
    )
    name = head.group("name").strip("`")
    rest = statement[head.end() :]
    expectations: tuple[Expectation, ...] = ()
    columns: str | None = None
    if rest.startswith("("):
        inner, rest = _parenthesised(rest, where)
        expectations, columns = _constraints(inner, where)
    using = _USING.match(rest)
    if using:
        # `USING delta` (what Spark's own runner needs to make the table a Delta table).
        if using.group(1).lower() != "delta":
            raise DefinitionError(
                f"{where}: {name!r} is USING {using.group(1)}; pipeline tables are Delta"
                " tables (say USING delta, or leave it out).",
                dataset=name,
                location=str(where),
            )
        rest = rest[using.end() :]
    comment = None
    found = _COMMENT.match(rest)
    if found:
        comment, rest = found.group(1).replace("\\'", "'"), rest[found.end() :]
    dataset = Dataset(
        name=name,
        kind=kind,
        location=where,
        comment=comment,
        expectations=expectations,
        schema=columns,
    )
    as_kw = _AS.match(rest)
    if as_kw is None and kind == "streaming_table" and not rest.strip():
        builder.add_dataset(dataset)  # a target for AUTO CDC / append flows
        return
    if as_kw is None:
        raise DefinitionError(
            f"{where}: expected AS <query> after {name!r}", dataset=name, location=str(where)
        )
    query = rest[as_kw.end() :].strip()
    builder.add_dataset(dataset)
    builder.add_flow(Flow(name=name, target=name, func=_sql_query(spark, query), location=where))


def _sql_query(spark: SparkSession, query: str) -> Any:
    def run() -> DataFrame:
        return spark.sql(query)

    return run


def _parenthesised(text: str, where: SourceLocation) -> tuple[str, str]:
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return text[1:i], text[i + 1 :]
    raise DefinitionError(f"{where}: unbalanced parentheses", dataset=None, location=str(where))


def _constraints(inner: str, where: SourceLocation) -> tuple[tuple[Expectation, ...], str | None]:
    """The column list's ``CONSTRAINT ... EXPECT`` rules, and its column definitions as a
    DDL schema (None when there are none)."""
    out, columns = [], []
    for part in _split_top_level(inner):
        text = part.strip()
        if not re.match(r"CONSTRAINT\s", text, re.IGNORECASE):
            columns.append(text)
            continue
        found = _CONSTRAINT.match(text)
        if found is None:
            raise DefinitionError(
                f"{where}: only CONSTRAINT name EXPECT (condition) [ON VIOLATION DROP ROW |"
                f" FAIL UPDATE] is supported in the column list; got {text!r}",
                dataset=None,
                location=str(where),
            )
        action_text = (found.group("action") or "").upper()
        action: ExpectationAction = (
            "drop" if action_text.startswith("DROP") else "fail" if action_text else "warn"
        )
        out.append(Expectation(found.group("name").strip("`"), found.group("cond"), action))
    return tuple(out), (", ".join(columns) if columns else None)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start, quote = [], 0, 0, None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch in "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def split_statements(text: str) -> list[tuple[int, str]]:
    """``text`` split at top-level semicolons (not in quotes or comments), with each
    statement's offset; empty statements dropped."""
    out: list[tuple[int, str]] = []
    start, i, quote = 0, 0, None
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif ch == ";":
            out.append((start, text[start:i]))
            start = i + 1
        i += 1
    out.append((start, text[start:]))
    result = []
    for offset, statement in out:
        stripped = _strip_comments(statement)
        if stripped.strip():
            lead = len(statement) - len(statement.lstrip())
            result.append((offset + lead, stripped.strip()))
    return result


def _strip_comments(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
