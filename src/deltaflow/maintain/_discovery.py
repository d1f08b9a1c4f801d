"""Finding the Delta tables under the roots ``deltaflow maintain`` is given.

A table is a directory holding ``_delta_log``. The walk never descends into a table
(its partition folders, ``_delta_log``, ``_delta_staging``), so a table nested in another
table's folder is not found: only tables side by side or in plain folders are.
Roots are local paths (or ``file:`` URIs) or object-store URIs (``s3://bucket/prefix``),
listed with pyarrow's filesystem for that store and the settings of the environment
(``AWS_*``), as every other reader of the table does. The compaction lease maintenance
holds is a put-if-absent object on stores that have one
(:mod:`deltaflow.table._compaction_lease`), so upkeep is as safe there as on a disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import urlparse

import pyarrow.fs as pafs

from deltaflow.maintain.errors import MaintainRootError
from deltaflow.table import _uri

LOG_DIR = "_delta_log"


def check_roots(roots: Iterable[str]) -> list[str]:
    """The roots as local directory paths; :class:`MaintainRootError` names a bad one."""
    out: list[str] = []
    for root in roots:
        scheme = urlparse(root).scheme
        if scheme and scheme != "file" and len(scheme) > 1:  # 'c:' is a Windows drive
            out.append(_check_object_store_root(root))
            continue
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


def _check_object_store_root(root: str) -> str:
    uri = _uri.normalize_uri(root)
    try:
        fs, path = _uri.filesystem(uri)
        kind = fs.get_file_info(path).type
    except (OSError, ValueError) as exc:
        raise MaintainRootError(
            f"deltaflow maintain: cannot list {root}: {exc}. Check the URI and the store's"
            " settings (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, ...).",
            path=root,
            kind="unreachable",
        ) from exc
    if kind == pafs.FileType.NotFound:
        raise MaintainRootError(
            f"deltaflow maintain: nothing is stored under {root}. Pass a prefix that holds"
            " Delta tables (or is one).",
            path=root,
            kind="missing",
        )
    return uri


def _find_in_object_store(root: str) -> list[str]:
    """The tables under an object-store prefix: a breadth-first listing, one level at a
    time, that stops at each table (its data files are never listed)."""
    fs, top = _uri.filesystem(root)
    scheme = root.partition("://")[0]
    found: list[str] = []
    pending = [top.rstrip("/")]
    while pending:
        folder = pending.pop()
        entries = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        folders = [e for e in entries if e.type == pafs.FileType.Directory]
        if any(e.base_name == LOG_DIR for e in folders):
            found.append(f"{scheme}://{folder}")
            continue
        pending.extend(e.path for e in folders if not e.base_name.startswith("."))
    return found


def find_tables(roots: Iterable[str]) -> list[str]:
    """The Delta tables under ``roots`` (each checked by :func:`check_roots`), as sorted
    absolute paths (URIs on object stores), each once."""
    found: set[str] = set()
    for root in check_roots(roots):
        if not _uri.is_local(root) and "://" in root:
            found.update(_find_in_object_store(root))
            continue
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
