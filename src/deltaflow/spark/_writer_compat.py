"""delta-spark's DataFrameWriter behaviour for ``format("delta")``.

Spark refuses two things delta-spark users do every day when the source is a
Python data source: the default save mode (``errorifexists``, and ``ignore``) and
``.partitionBy(...)``. ``install()`` teaches ``DataFrameWriter`` to handle
``delta`` writes the way delta-spark does, on the driver, before any job runs:

- ``error`` / ``errorifexists``: raise :class:`TableAlreadyExistsError` if a table
  exists at the path, else create it;
- ``ignore``: do nothing if a table exists, else create it;
- ``partitionBy(cols)``: passed to the source as the ``partitionBy`` option.

Other formats go through untouched. The patch is installed by ``register()``
(and so by ``session()``), is idempotent, and keeps every original method.
"""

from __future__ import annotations

from typing import Any

from deltaflow.table import _uri
from deltaflow.table._snapshot import table_exists
from deltaflow.table.errors import TableAlreadyExistsError

_STATE = "_deltaflow_state"
_INSTALLED = "_deltaflow_installed"
SAVE_MODE_OPTION = "__deltaflow_save_mode"


def _state(writer: Any) -> dict[str, Any]:
    state = writer.__dict__.get(_STATE)
    if state is None:
        state = {"format": None, "mode": None, "partition_by": None, "path": None}
        writer.__dict__[_STATE] = state
    return state


def install() -> None:
    from pyspark.sql.readwriter import DataFrameWriter

    if getattr(DataFrameWriter, _INSTALLED, False):
        return
    original_format = DataFrameWriter.format
    original_mode = DataFrameWriter.mode
    original_partition_by = DataFrameWriter.partitionBy
    original_option = DataFrameWriter.option
    original_save = DataFrameWriter.save

    def format(self: Any, source: str) -> Any:  # noqa: A001 - mirrors pyspark's name
        _state(self)["format"] = source
        return original_format(self, source)

    def mode(self: Any, saveMode: str | None) -> Any:  # noqa: N803 - pyspark's name
        if saveMode is not None:
            _state(self)["mode"] = saveMode
        return original_mode(self, saveMode)

    def option(self: Any, key: str, value: Any) -> Any:
        if key.lower() == "path":
            _state(self)["path"] = value
        return original_option(self, key, value)

    def partitionBy(self: Any, *cols: Any) -> Any:  # noqa: N802 - pyspark's name
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        # Deferred: Spark refuses partitionBy for Python sources, so the JVM call is
        # made at save() time, and only for other formats.
        _state(self)["partition_by"] = list(cols)
        return self

    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,  # noqa: A002 - mirrors pyspark's name
        mode: str | None = None,
        partitionBy: Any = None,  # noqa: N803 - pyspark's name
        **options: Any,
    ) -> None:
        state = _state(self)
        if format is not None:
            self.format(format)
        if mode is not None:
            self.mode(mode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        if (state["format"] or "").lower() != "delta":
            if state["partition_by"]:
                original_partition_by(self, *state["partition_by"])
            original_save(self, path)
            return
        _save_delta(self, state, path, original_mode, original_option, original_save)

    DataFrameWriter.format = format
    DataFrameWriter.mode = mode
    DataFrameWriter.option = option
    DataFrameWriter.partitionBy = partitionBy
    DataFrameWriter.save = save
    setattr(DataFrameWriter, _INSTALLED, True)


def _save_delta(
    writer: Any,
    state: dict[str, Any],
    path: str | None,
    original_mode: Any,
    original_option: Any,
    original_save: Any,
) -> None:
    location = path or state["path"]
    mode = (state["mode"] or "errorifexists").lower()
    if state["partition_by"]:
        original_option(writer, "partitionBy", ",".join(state["partition_by"]))
    if mode in ("error", "errorifexists", "default", "ignore") and location:
        uri = _uri.normalize_uri(location)
        if table_exists(uri):
            if mode == "ignore":
                return
            raise TableAlreadyExistsError(
                f"Table {uri} already exists and the save mode is '{mode}'. Use"
                " .mode('append') to add rows or .mode('overwrite') to replace them.",
                table_uri=uri,
            )
        original_option(writer, SAVE_MODE_OPTION, "error")
        original_mode(writer, "append")
    original_save(writer, path)
