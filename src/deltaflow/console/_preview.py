"""Rows for the page: the first rows of a table at a version, and its recent changes.

Read with delta-rs (no Spark): its SQL engine applies deletion vectors, and ``LIMIT``
stops the scan early, so a preview of a large table reads about one file.
"""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from deltaflow.console.errors import ConsoleRequestError

MAX_ROWS = 500
# Cell text longer than this is cut: one huge string must not make the page megabytes.
_MAX_CELL = 200


def preview(path: str, version: int | None, limit: int) -> dict[str, Any]:
    """The first ``limit`` rows of the table at ``version`` (latest when None)."""
    table = _open(path, version)
    builder = QueryBuilder().register("t", table)
    batches = builder.execute(f"SELECT * FROM t LIMIT {_bounded(limit)}")
    return {"version": table.version(), **_rows(batches)}


def changes(path: str, start: int, limit: int) -> dict[str, Any]:
    """Change-data-feed rows from version ``start`` on (newest commits first)."""
    import pyarrow as pa

    table = _open(path, None)
    if start < 0 or start > table.version():
        raise ConsoleRequestError(
            f"start version {start} is outside 0..{table.version()}.",
            status=400,
            code="bad_version",
        )
    try:
        reader = table.load_cdf(starting_version=start)
        data = pa.RecordBatchReader.from_stream(reader).read_all()
    except DeltaError as exc:
        raise ConsoleRequestError(
            f"no change data feed from version {start}: {exc}. It exists only for versions"
            " written after delta.enableChangeDataFeed was set to true.",
            status=409,
            code="no_change_feed",
        ) from exc
    if "_commit_version" in data.column_names and data.num_rows:
        # take() has no kernel for delta-rs's string_view columns: cast them first.
        data = data.cast(_plain(data.schema)).sort_by([("_commit_version", "descending")])
    return {"start": start, "version": table.version(), **_rows(data.slice(0, _bounded(limit)))}


def _plain(schema: Any) -> Any:
    """``schema`` with view types (string_view, binary_view) as their plain forms."""
    import pyarrow as pa

    swap = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return pa.schema([f.with_type(swap.get(f.type, f.type)) for f in schema])


def _open(path: str, version: int | None) -> DeltaTable:
    try:
        return DeltaTable(path, version=version)
    except DeltaError as exc:
        raise ConsoleRequestError(
            f"version {version} cannot be read: {exc}. Pick a version from the history.",
            status=404,
            code="version_not_found",
        ) from exc


def _bounded(limit: int) -> int:
    return max(1, min(MAX_ROWS, limit))


def _rows(data: Any) -> dict[str, Any]:
    import pyarrow as pa

    if not isinstance(data, pa.Table):
        data = pa.RecordBatchReader.from_stream(data).read_all()
    table = data
    columns = [{"name": f.name, "type": str(f.type)} for f in table.schema]
    rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
    return {"columns": columns, "rows": rows, "num_rows": len(rows)}


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value.hex() if isinstance(value, bytes) else str(value)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"
