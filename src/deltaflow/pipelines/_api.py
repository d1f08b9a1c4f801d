"""The declaration functions, with ``pyspark.pipelines``' names and arguments.

Each one checks its arguments (a :class:`DefinitionError` naming the argument and the
declaration's file and line), builds frozen objects from :mod:`._declarations` and
registers them with the active :class:`~._graph.GraphBuilder`. Nothing here runs a
query or needs a Spark session; decorators return the function they decorate, so a
test can still call it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from deltaflow.pipelines._declarations import (
    AutoCdcFlow,
    AutoCdcSnapshotFlow,
    ColumnLike,
    Dataset,
    DatasetKind,
    Expectation,
    ExpectationAction,
    Flow,
    QueryFunction,
    ScdType,
    Sink,
    SnapshotFunction,
    SourceLocation,
)
from deltaflow.pipelines._graph import active_builder
from deltaflow.pipelines.errors import DefinitionError

F = TypeVar("F", bound=Callable[..., Any])

# Set on a decorated function: the dataset or flow it declared, so an expectation
# decorator applied above it reaches the registered declaration.
_DECLARED = "__deltaflow_declared__"
# Expectations declared below a dataset decorator wait on the function until it runs.
_PENDING = "__deltaflow_expectations__"


# ---- argument checks ----------------------------------------------------------------


def _caller(depth: int = 3) -> SourceLocation:
    frame = sys._getframe(depth)
    return SourceLocation(frame.f_code.co_filename, frame.f_lineno)


def _location_of(func: Callable[..., Any]) -> SourceLocation:
    code = getattr(func, "__code__", None)
    if code is None:
        return SourceLocation(None, None)
    return SourceLocation(code.co_filename, code.co_firstlineno)


def _fail(message: str, name: str | None, where: SourceLocation) -> DefinitionError:
    return DefinitionError(f"{message} (at {where})", dataset=name, location=str(where))


def _text(value: Any, arg: str, decl: str, where: SourceLocation, *, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(f"{decl}: `{arg}` must be a non-empty string, got {value!r}", None, where)
    return value


def _names(value: Any, arg: str, decl: str, where: SourceLocation) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _fail(f"{decl}: `{arg}` must be a list of column names, got {value!r}", None, where)
    for item in value:
        _text(item, arg, decl, where, optional=False)
    return tuple(value)


def _strings(value: Any, arg: str, decl: str, where: SourceLocation) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(f"{decl}: `{arg}` must be a dict of strings, got {value!r}", None, where)
    bad = [k for k, v in value.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise _fail(
            f"{decl}: `{arg}` must map strings to strings; {bad[0]!r} does not"
            " (write values as strings, e.g. 'true')",
            None,
            where,
        )
    return dict(value)


def _schema(value: Any, decl: str, where: SourceLocation) -> Any:
    if value is None or isinstance(value, str) or hasattr(value, "fieldNames"):
        return value
    raise _fail(
        f"{decl}: `schema` must be a DDL string ('id BIGINT, name STRING') or a StructType,"
        f" got {type(value).__name__}",
        None,
        where,
    )


def _columns(value: Any, arg: str, decl: str, where: SourceLocation) -> tuple[ColumnLike, ...]:
    items = [value] if isinstance(value, str) or _is_column(value) else value
    if not isinstance(items, Sequence) or not all(
        (isinstance(c, str) and c.strip()) or _is_column(c) for c in items
    ):
        raise _fail(
            f"{decl}: `{arg}` must be a list of column names or Columns, got {value!r}",
            None,
            where,
        )
    return tuple(items)


def _is_column(value: Any) -> bool:
    return type(value).__name__ == "Column"


def _condition(value: Any, arg: str, decl: str, where: SourceLocation) -> ColumnLike | None:
    if value is None or _is_column(value):
        return cast("ColumnLike | None", value)
    return cast(str, _text(value, arg, decl, where))


def _query_function(func: Any, decl: str) -> QueryFunction:
    if not callable(func):
        raise DefinitionError(
            f"{decl} decorates a function that returns a DataFrame; got {func!r}. Use"
            f" `@{decl}` or `@{decl}(name=...)` above a `def`.",
            dataset=None,
            location="<unknown>",
        )
    return cast(QueryFunction, func)


def _take_expectations(func: Callable[..., Any]) -> tuple[Expectation, ...]:
    return tuple(getattr(func, _PENDING, ()))


def _mark(func: Callable[..., Any], name: str) -> None:
    # A builtin or a partial takes no attributes: its expectations must go below.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(func, _DECLARED, name)


# ---- datasets -------------------------------------------------------------------------


def _declare_query_dataset(
    func: Any, kind: DatasetKind, decl: str, options: dict[str, Any]
) -> QueryFunction:
    query = _query_function(func, decl)
    where = _location_of(query)
    name: str = _text(options.get("name"), "name", decl, where) or getattr(query, "__name__", "")
    spark_conf = _strings(options.get("spark_conf"), "spark_conf", decl, where)
    dataset = Dataset(
        name=name,
        kind=kind,
        location=where,
        comment=_text(options.get("comment"), "comment", decl, where),
        spark_conf=spark_conf,
        table_properties=_strings(options.get("table_properties"), "table_properties", decl, where),
        partition_cols=_names(options.get("partition_cols"), "partition_cols", decl, where),
        cluster_by=_names(options.get("cluster_by"), "cluster_by", decl, where),
        schema=_schema(options.get("schema"), decl, where),
        path=_text(options.get("path"), "path", decl, where),
        format=_text(options.get("format"), "format", decl, where),
        temporary=bool(options.get("private") or options.get("temporary")),
        expectations=_take_expectations(query),
    )
    _refuse_row_filter(options.get("row_filter"), decl, name, where)
    if dataset.partition_cols and dataset.cluster_by:
        raise _fail(
            f"{decl} {name!r}: partition_cols and cluster_by cannot both be set (Delta"
            " tables are either partitioned or clustered)",
            name,
            where,
        )
    if dataset.format not in (None, "delta"):
        raise _fail(
            f"{decl} {name!r}: format {dataset.format!r} is not supported; pipeline tables"
            " are Delta tables (leave `format` out, or write to another format with"
            " create_sink + append_flow)",
            name,
            where,
        )
    builder = active_builder(f"{decl} {name!r}")
    builder.add_dataset(dataset)
    builder.add_flow(
        Flow(name=name, target=name, func=query, location=where, spark_conf=spark_conf)
    )
    _mark(query, name)
    return query


def _refuse_row_filter(row_filter: Any, decl: str, name: str, where: SourceLocation) -> None:
    if row_filter is None:
        return
    raise _fail(
        f"{decl} {name!r}: row_filter is a Unity Catalog feature (a SQL function deciding,"
        " per reader, which rows they see) that deltaflow's tables do not have. Filter in"
        " the query itself (.filter(...) / WHERE), or publish a view over the table that"
        " filters for its readers.",
        name,
        where,
    )


def _dataset_decorator(
    query_function: Any, kind: DatasetKind, decl: str, options: dict[str, Any]
) -> Any:
    if query_function is not None:
        return _declare_query_dataset(query_function, kind, decl, options)

    def decorate(func: F) -> F:
        return cast(F, _declare_query_dataset(func, kind, decl, options))

    return decorate


def table(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: dict[str, str] | None = None,
    table_properties: dict[str, str] | None = None,
    partition_cols: list[str] | None = None,
    cluster_by: list[str] | None = None,
    schema: Any = None,
    format: str | None = None,
    path: str | None = None,
    private: bool = False,
    row_filter: str | None = None,
) -> Any:
    """A streaming table whose flow is the decorated query (a streaming DataFrame).
    ``private``: materialized, but not left in the catalog (see docs/pipelines.md);
    ``row_filter`` (a Unity Catalog feature) is refused."""
    options = dict(locals())
    del options["query_function"]
    return _dataset_decorator(query_function, "streaming_table", "table", options)


def materialized_view(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: dict[str, str] | None = None,
    table_properties: dict[str, str] | None = None,
    partition_cols: list[str] | None = None,
    cluster_by: list[str] | None = None,
    schema: Any = None,
    format: str | None = None,
    path: str | None = None,
    private: bool = False,
    row_filter: str | None = None,
) -> Any:
    """A table holding the result of the decorated batch query, recomputed (or refreshed
    incrementally where the query allows) on every update."""
    options = dict(locals())
    del options["query_function"]
    return _dataset_decorator(query_function, "materialized_view", "materialized_view", options)


def temporary_view(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: dict[str, str] | None = None,
) -> Any:
    """A view other datasets of the pipeline read; nothing is stored."""
    options = dict(locals())
    del options["query_function"]
    return _dataset_decorator(query_function, "temporary_view", "temporary_view", options)


def create_streaming_table(
    name: str,
    *,
    comment: str | None = None,
    spark_conf: dict[str, str] | None = None,
    table_properties: dict[str, str] | None = None,
    partition_cols: list[str] | None = None,
    cluster_by: list[str] | None = None,
    schema: Any = None,
    format: str | None = None,
    path: str | None = None,
    expect_all: dict[str, str] | None = None,
    expect_all_or_drop: dict[str, str] | None = None,
    expect_all_or_fail: dict[str, str] | None = None,
    private: bool = False,
    row_filter: str | None = None,
) -> None:
    """A streaming table without a query of its own: append flows or AUTO CDC flows
    write it. ``expect_all*`` apply to every row any flow writes."""
    where = _caller(2)
    decl = "create_streaming_table"
    _text(name, "name", decl, where, optional=False)
    _refuse_row_filter(row_filter, decl, name, where)
    rules = (
        _expectations(expect_all, "warn", decl, where)
        + _expectations(expect_all_or_drop, "drop", decl, where)
        + _expectations(expect_all_or_fail, "fail", decl, where)
    )
    if partition_cols and cluster_by:
        raise _fail(f"{decl} {name!r}: partition_cols and cluster_by are exclusive", name, where)
    active_builder(f"{decl} {name!r}").add_dataset(
        Dataset(
            name=name,
            kind="streaming_table",
            location=where,
            comment=_text(comment, "comment", decl, where),
            spark_conf=_strings(spark_conf, "spark_conf", decl, where),
            table_properties=_strings(table_properties, "table_properties", decl, where),
            partition_cols=_names(partition_cols, "partition_cols", decl, where),
            cluster_by=_names(cluster_by, "cluster_by", decl, where),
            schema=_schema(schema, decl, where),
            path=_text(path, "path", decl, where),
            format=_text(format, "format", decl, where),
            temporary=bool(private),
            expectations=rules,
        )
    )


def create_sink(name: str, format: str, options: dict[str, str] | None = None) -> None:
    """An external sink (``format`` as in ``df.writeStream.format``) that append flows
    can write to."""
    where = _caller(2)
    _text(name, "name", "create_sink", where, optional=False)
    _text(format, "format", "create_sink", where, optional=False)
    active_builder(f"create_sink {name!r}").add_sink(
        Sink(
            name=name,
            format=format,
            options=_strings(options, "options", "create_sink", where),
            location=where,
        )
    )


# ---- flows ----------------------------------------------------------------------------


def _scd_type(value: Any, decl: str, where: SourceLocation) -> ScdType:
    if value in (1, "1"):
        return 1
    if value in (2, "2"):
        return 2
    raise _fail(f"{decl}: `stored_as_scd_type` must be 1 or 2, got {value!r}", None, where)


def _history_columns(
    scd: ScdType, include: Any, exclude: Any, decl: str, where: SourceLocation
) -> tuple[tuple[ColumnLike, ...] | None, tuple[ColumnLike, ...] | None]:
    if include is not None and exclude is not None:
        raise _fail(
            f"{decl}: give track_history_column_list or track_history_except_column_list, not both",
            None,
            where,
        )
    if (include is not None or exclude is not None) and scd != 2:
        raise _fail(
            f"{decl}: track_history_* lists apply to stored_as_scd_type=2 only", None, where
        )
    return (
        None if include is None else _columns(include, "track_history_column_list", decl, where),
        None
        if exclude is None
        else _columns(exclude, "track_history_except_column_list", decl, where),
    )


def create_auto_cdc_flow(
    target: str,
    source: str,
    keys: list[str] | list[Any],
    sequence_by: ColumnLike,
    ignore_null_updates: bool = False,
    apply_as_deletes: ColumnLike | None = None,
    apply_as_truncates: ColumnLike | None = None,
    column_list: list[str] | list[Any] | None = None,
    except_column_list: list[str] | list[Any] | None = None,
    stored_as_scd_type: int | str = 1,
    track_history_column_list: list[str] | list[Any] | None = None,
    track_history_except_column_list: list[str] | list[Any] | None = None,
    name: str | None = None,
    once: bool = False,
    spark_conf: dict[str, str] | None = None,
) -> None:
    """AUTO CDC: apply the change rows of ``source`` to the streaming table ``target``
    (Lakeflow's ``create_auto_cdc_flow`` / ``apply_changes``)."""
    options = dict(locals())
    declare_auto_cdc_flow(_caller(2), "create_auto_cdc_flow", **options)


def declare_auto_cdc_flow(
    where: SourceLocation,
    decl: str,
    *,
    target: str,
    source: str,
    keys: Any,
    sequence_by: Any,
    ignore_null_updates: bool = False,
    apply_as_deletes: Any = None,
    apply_as_truncates: Any = None,
    column_list: Any = None,
    except_column_list: Any = None,
    stored_as_scd_type: int | str = 1,
    track_history_column_list: Any = None,
    track_history_except_column_list: Any = None,
    name: str | None = None,
    once: bool = False,
    spark_conf: dict[str, str] | None = None,
) -> None:
    """:func:`create_auto_cdc_flow` declared at ``where`` (Python or a SQL file)."""
    _text(target, "target", decl, where, optional=False)
    _text(source, "source", decl, where, optional=False)
    scd = _scd_type(stored_as_scd_type, decl, where)
    if column_list is not None and except_column_list is not None:
        raise _fail(f"{decl}: give column_list or except_column_list, not both", target, where)
    if apply_as_truncates is not None and scd != 1:
        raise _fail(f"{decl}: apply_as_truncates works with SCD type 1 only", target, where)
    sequence = _columns(sequence_by, "sequence_by", decl, where)
    if len(sequence) != 1:
        raise _fail(
            f"{decl}: `sequence_by` is one column or expression (use struct(a, b) to order"
            " by several)",
            target,
            where,
        )
    include, exclude = _history_columns(
        scd, track_history_column_list, track_history_except_column_list, decl, where
    )
    key_columns = _columns(keys, "keys", decl, where)
    if not key_columns:
        raise _fail(f"{decl}: `keys` names at least one column", target, where)
    flow_name = _text(name, "name", decl, where) or target
    active_builder(f"{decl} {flow_name!r}").add_flow(
        AutoCdcFlow(
            name=flow_name,
            target=target,
            source=source,
            keys=key_columns,
            sequence_by=sequence[0],
            location=where,
            ignore_null_updates=bool(ignore_null_updates),
            apply_as_deletes=_condition(apply_as_deletes, "apply_as_deletes", decl, where),
            apply_as_truncates=_condition(apply_as_truncates, "apply_as_truncates", decl, where),
            column_list=None
            if column_list is None
            else _columns(column_list, "column_list", decl, where),
            except_column_list=None
            if except_column_list is None
            else _columns(except_column_list, "except_column_list", decl, where),
            stored_as_scd_type=scd,
            track_history_column_list=include,
            track_history_except_column_list=exclude,
            spark_conf=_strings(spark_conf, "spark_conf", decl, where),
            once=bool(once),
        )
    )


def create_auto_cdc_from_snapshot_flow(
    target: str,
    source: str | SnapshotFunction,
    keys: list[str] | list[Any],
    stored_as_scd_type: int | str = 1,
    track_history_column_list: list[str] | list[Any] | None = None,
    track_history_except_column_list: list[str] | list[Any] | None = None,
    name: str | None = None,
) -> None:
    """AUTO CDC from snapshots (Lakeflow's ``apply_changes_from_snapshot``): ``source``
    is a table read whole on every update, or a function returning the next
    ``(DataFrame, version)`` after the given version, or None when there is none."""
    where = _caller(2)
    decl = "create_auto_cdc_from_snapshot_flow"
    _text(target, "target", decl, where, optional=False)
    if not callable(source):
        _text(source, "source", decl, where, optional=False)
    scd = _scd_type(stored_as_scd_type, decl, where)
    include, exclude = _history_columns(
        scd, track_history_column_list, track_history_except_column_list, decl, where
    )
    key_columns = _columns(keys, "keys", decl, where)
    if not key_columns:
        raise _fail(f"{decl}: `keys` names at least one column", target, where)
    flow_name = _text(name, "name", decl, where) or target
    active_builder(f"{decl} {flow_name!r}").add_flow(
        AutoCdcSnapshotFlow(
            name=flow_name,
            target=target,
            source=source,
            keys=key_columns,
            location=where,
            stored_as_scd_type=scd,
            track_history_column_list=include,
            track_history_except_column_list=exclude,
        )
    )


# ---- expectations ---------------------------------------------------------------------


def _expectations(
    rules: Any, action: ExpectationAction, decl: str, where: SourceLocation
) -> tuple[Expectation, ...]:
    if rules is None:
        return ()
    if not isinstance(rules, Mapping):
        raise _fail(
            f"{decl}: expectations are a dict of {{name: SQL constraint}}, got {rules!r}",
            None,
            where,
        )
    out = []
    for rule_name, constraint in rules.items():
        _text(rule_name, "expectation name", decl, where, optional=False)
        _text(constraint, f"constraint of {rule_name!r}", decl, where, optional=False)
        out.append(Expectation(rule_name, constraint, action))
    return tuple(out)


def _expect_decorator(rules: Any, action: ExpectationAction, decl: str) -> Callable[[F], F]:
    expectations = _expectations(rules, action, decl, _caller(3))

    def decorate(func: F) -> F:
        declared = getattr(func, _DECLARED, None)
        if declared is not None:
            # Above the dataset decorator: the declaration is registered already.
            active_builder(f"{decl} on {declared!r}").add_expectations(declared, expectations)
        else:
            setattr(func, _PENDING, expectations + tuple(getattr(func, _PENDING, ())))
        return func

    return decorate


def expect(description: str, constraint: str) -> Callable[[F], F]:
    """Count rows breaking ``constraint``; keep them."""
    return _expect_decorator({description: constraint}, "warn", "expect")


def expect_or_drop(description: str, constraint: str) -> Callable[[F], F]:
    """Count rows breaking ``constraint`` and drop them."""
    return _expect_decorator({description: constraint}, "drop", "expect_or_drop")


def expect_or_fail(description: str, constraint: str) -> Callable[[F], F]:
    """Fail the flow on the first row breaking ``constraint`` (the row in the error)."""
    return _expect_decorator({description: constraint}, "fail", "expect_or_fail")


def expect_all(expectations: dict[str, str]) -> Callable[[F], F]:
    """:func:`expect` for each ``{name: constraint}``."""
    return _expect_decorator(expectations, "warn", "expect_all")


def expect_all_or_drop(expectations: dict[str, str]) -> Callable[[F], F]:
    """:func:`expect_or_drop` for each ``{name: constraint}``."""
    return _expect_decorator(expectations, "drop", "expect_all_or_drop")


def expect_all_or_fail(expectations: dict[str, str]) -> Callable[[F], F]:
    """:func:`expect_or_fail` for each ``{name: constraint}``."""
    return _expect_decorator(expectations, "fail", "expect_all_or_fail")
