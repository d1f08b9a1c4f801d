"""Finding the Delta tables under the roots ``deltaflow maintain`` is given.

A table is a directory holding ``_delta_log``. The walk never descends into a table
(its partition folders, ``_delta_log``, ``_delta_staging``), so a table nested in another
table's folder is not found: only tables side by side or in plain folders are.
Roots are local paths (or ``file:`` URIs); object stores need a listing that
delta-rs and pyarrow can do, but the compaction lease maintenance relies on is local
only (:mod:`deltaflow.table._compaction_lease`), so they are refused for now.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import urlparse

from deltaflow.maintain.errors import MaintainRootError
from deltaflow.table import _uri

LOG_DIR = "_delta_log"


def check_roots(roots: Iterable[str]) -> list[str]:
    """The roots as local directory paths; :class:`MaintainRootError` names a bad one."""
    out: list[str] = []
    for root in roots:
        scheme = urlparse(root).scheme
        if scheme and scheme != "file" and len(scheme) > 1:  # 'c:' is a Windows drive
            raise MaintainRootError(
                f"deltaflow maintain: {root} is an object-store location ({scheme}://); only"
                " local paths are supported for now. Run maintain where the tables are local,"
                " or run OPTIMIZE / VACUUM on the table from Spark.",
                path=root,
                kind="object_store",
            )
        path = _uri.local_path(_uri.normalize_uri(root)) if scheme == "file" else root
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise MaintainRootError(
                f"deltaflow maintain: the root {root} does not exist. Pass a directory that"
                " holds Delta tables (or is one).",
                path=root,
                kind="missing",
            )
        if not os.path.isdir(path):
            raise MaintainRootError(
                f"deltaflow maintain: the root {root} is a file, not a directory. Pass a"
                " directory that holds Delta tables (or is one).",
                path=root,
                kind="not_a_directory",
            )
        out.append(path)
    return out


def find_tables(roots: Iterable[str]) -> list[str]:
    """The Delta tables under ``roots`` (each checked by :func:`check_roots`), as sorted
    absolute paths, each once."""
    found: set[str] = set()
    for root in check_roots(roots):
        for folder, subfolders, _files in os.walk(root):
            if is_table(folder):
                found.add(folder)
                subfolders.clear()  # a table's own folders hold no other table
            else:
                # Hidden folders (.git, .venv) hold no tables of ours; do not walk them.
                subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
    return sorted(found)


def is_table(folder: str) -> bool:
    return os.path.isdir(os.path.join(folder, LOG_DIR))
