"""The bridge operations behind the SQL commands (``io.deltaflow.spark.sql``): each runs
one function of :mod:`deltaflow.spark.commands` and answers ``{"rows": [...]}``, rows
as JSON arrays in the order of the command's output schema (timestamps in epoch
milliseconds, structs as arrays, maps as objects)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from deltaflow.spark.commands import _clone, _convert, _describe, _maintenance, _reorg, _vacuum
from deltaflow.table import _uri


def history(args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit")
    return _answer(_describe.history(_table(args), None if limit is None else int(limit)))


def detail(args: dict[str, Any]) -> dict[str, Any]:
    return _answer(_describe.detail(_table(args), args.get("name")))


def vacuum(args: dict[str, Any]) -> dict[str, Any]:
    hours = args.get("retentionHours")
    rows = _vacuum.vacuum(
        _table(args),
        None if hours is None else float(hours),
        dry_run=bool(args.get("dryRun")),
        check_retention=bool(args.get("checkRetention", True)),
    )
    return _answer(rows)


def restore(args: dict[str, Any]) -> dict[str, Any]:
    version = args.get("version")
    rows = _maintenance.restore(
        _table(args),
        version=None if version is None else int(version),
        timestamp=args.get("timestamp"),
    )
    return _answer(rows)


def optimize(args: dict[str, Any]) -> dict[str, Any]:
    rows = _maintenance.optimize(
        _table(args),
        where=args.get("where"),
        zorder_by=list(args.get("zorderBy") or []),
        full=bool(args.get("full")),
        predicates=args.get("predicates"),
    )
    return _answer(rows)


def reorg(args: dict[str, Any]) -> dict[str, Any]:
    return _answer(_reorg.reorg_purge(_table(args), where=args.get("where")))


def convert(args: dict[str, Any]) -> dict[str, Any]:
    return {"converted": _convert.convert(_table(args), args.get("partitionSchema")), "rows": []}


def clone(args: dict[str, Any]) -> dict[str, Any]:
    version = args.get("version")
    rows = _clone.shallow_clone(
        _table(args),
        _uri.normalize_uri(str(args["target"])),
        version=None if version is None else int(version),
        timestamp=args.get("timestamp"),
        properties={str(k): str(v) for k, v in (args.get("properties") or {}).items()},
        source_name=args.get("sourceName"),
        replace=bool(args.get("replace")),
    )
    return _answer(rows)


def generate(args: dict[str, Any]) -> dict[str, Any]:
    _convert.generate(_table(args), str(args.get("mode")))
    return {"rows": []}


def _table(args: dict[str, Any]) -> str:
    return _uri.normalize_uri(str(args["uri"]))


def _answer(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    return {"rows": [_json(r) for r in rows]}


def _json(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    return value
