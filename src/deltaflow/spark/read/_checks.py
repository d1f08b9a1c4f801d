"""``spark.read.format("delta").load(...)``: checked on the driver, in the caller's process.

``format("delta")`` is deltaflow's connector (the JVM ``delta`` provider). The reader
patch (:mod:`deltaflow.spark._patches`) calls :func:`load_delta`, which adds what the
connector cannot give a PySpark caller by itself yet:

- **Typed errors where the user called.** ``load()`` parses the options here, so
  ``InvalidOptionError`` is raised as itself. A plain read loads no log here: the
  connector resolves the table in ``load()`` (the brain's ``table.load``), and the
  reader marks the read (:data:`~deltaflow.spark._options.READ_MARKER_OPTION`) so that
  a missing table raises ``TableNotFoundError`` there rather than at the first action;
  those errors, and ``VersionNotFoundError`` for time travel, are re-raised typed
  (:func:`deltaflow.typed_error`) instead of as Py4J errors. A change feed read and a
  read with a user schema, which the Python source serves, still load the snapshot
  here, for the change feed's typed range errors and the schema check.
- **User-specified schemas** go to the Python data source (``deltaflow_python``),
  which checks them against the table; the connector's provider takes none.
"""

from __future__ import annotations

import logging
from typing import Any

from deltaflow._session import PYTHON_SOURCE_NAME
from deltaflow.errors import raising_typed
from deltaflow.spark._options import READ_MARKER_OPTION, ReadOptions, parse_read_options
from deltaflow.table import _uri
from deltaflow.table._snapshot import Snapshot, load_snapshot

log = logging.getLogger("deltaflow.scan")


def load_delta(
    reader: Any, state: dict[str, Any], path: Any, original_format: Any, original_load: Any
) -> Any:
    """``load()`` of a delta read (``state`` records the reader's calls): checked here,
    then loaded by the connector or, for what only it can do, the Python source."""
    source = _check_delta(state, path)
    if source == _CONNECTOR_READ:
        reader.option(READ_MARKER_OPTION, "true")
    elif source is not None:
        original_format(reader, source)
    with raising_typed():
        return original_load(reader, path)


# _check_delta's answer for a plain read the connector resolves and checks itself.
_CONNECTOR_READ = "\u0000connector"


def _check_delta(state: dict[str, Any], path: Any) -> str | None:
    """Check this delta read on the driver; the source to load it with instead of the
    connector's ``delta`` provider, :data:`_CONNECTOR_READ` for a plain read, or None.

    Raises deltaflow's typed errors for bad options; for missing tables or versions when
    it loads the snapshot (a change feed, a user schema).
    """
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return None
        path = path[0]
    options = dict(state["options"])
    if path is not None:
        options["path"] = path
    read = parse_read_options(options)
    if not read.read_change_feed and state["schema"] is None:
        # The brain's table.load, in load() too, raises the same typed errors: loading the
        # log here as well cost a classic-session read 1 LIST + 1 GET + 2 GET per commit.
        return _CONNECTOR_READ
    snapshot = load_snapshot(
        _uri.normalize_uri(read.path), version=read.version_as_of, timestamp=read.timestamp_as_of
    )
    if read.read_change_feed:
        _check_change_feed(snapshot, read)
        return None
    if state["schema"] is not None:
        # The connector's provider takes no user schema; the Python source checks it.
        _log_fallback(snapshot, "a user-specified schema")
        return PYTHON_SOURCE_NAME
    return None


def _check_change_feed(snapshot: Snapshot, read: ReadOptions) -> None:
    """Raise the change feed's typed errors (range, feed not recorded, vacuumed files)
    here, where the user called; the Python source then plans the same range again."""
    from deltaflow.spark.read._cdf import plan_batch_changes
    from deltaflow.table._cdf import check_files_exist

    changes = plan_batch_changes(snapshot, read)
    check_files_exist(snapshot.uri, changes)
    log.info(
        "deltaflow change feed of %s: %d change files, Python source", snapshot.uri, len(changes)
    )


def _log_fallback(snapshot: Snapshot, reason: str) -> None:
    log.info("deltaflow scan of %s v%d: Python source (%s)", snapshot.uri, snapshot.version, reason)
