"""Following another writer's schema change under a running ``deltaflow serve``: which
changes it can follow (nullable columns added) and requests parsed before one."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from deltaflow.table.errors import UnsupportedFeatureError


def why_not_followed(
    served: dict[str, Any], current: dict[str, Any], arrow: pa.Schema, table_uri: str
) -> str | None:
    """Why serve cannot take ``current`` (Delta schema JSON; ``arrow`` the same as Arrow)
    in place of the ``served`` one, or None when it can."""
    from deltaflow.ingest.http._parse import check_supported

    problem = incompatible(served, current)
    if problem is not None:
        return problem
    try:
        check_supported(arrow, table_uri)  # e.g. a map column added: JSON cannot fill it
    except UnsupportedFeatureError as exc:
        return str(exc)
    return None


def incompatible(served: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why ``current`` is not ``served`` plus nullable columns (anywhere), or None."""
    now = {f["name"]: f for f in current["fields"]}
    for before in served["fields"]:
        after = now.pop(before["name"], None)
        if after is None:
            return f"column {before['name']!r} was renamed or dropped"
        if before["type"] != after["type"] or before["nullable"] != after["nullable"]:
            return (
                f"column {before['name']!r} changed from {json.dumps(before['type'])}"
                f" (nullable {before['nullable']}) to {json.dumps(after['type'])}"
                f" (nullable {after['nullable']})"
            )
    required = [name for name, f in now.items() if not f["nullable"]]
    if required:
        return f"the added columns {required} are NOT NULL"
    return None


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns: those it lacks (added since it was parsed) NULL."""
    if table.schema.names == schema.names:
        return table
    columns = [
        table.column(f.name) if f.name in table.schema.names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
