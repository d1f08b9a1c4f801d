"""The runner's own small files beside a flow's stream checkpoint, on any storage.

A flow's checkpoint directory holds Spark's files and a few of the runner's (the flow's
identity, a ``once`` flow's marker, a materialized view's refresh state, the last snapshot
an AUTO CDC FROM SNAPSHOT flow applied). The directory is a local path or, when the
session's Hadoop opens the pipeline's object store (S3A), a URI there
(:meth:`deltaflow.pipelines._storage.Storage.of`). Each file is written whole or not at
all: on a local disk by write-aside and rename, on an object store by its single PUT,
which publishes the object whole.
"""

from __future__ import annotations

import contextlib
import os

import pyarrow.fs as pafs

from deltaflow.table import _uri


def _located(directory: str, name: str = "") -> tuple[pafs.FileSystem, str]:
    fs, root = _uri.filesystem(_uri.normalize_uri(directory))
    return fs, f"{root.rstrip('/')}/{name}" if name else root


def read_text(directory: str, name: str) -> str | None:
    """The file's text, or None when it does not exist."""
    fs, path = _located(directory, name)
    try:
        with fs.open_input_stream(path) as source:
            return bytes(source.read()).decode("utf-8")
    except FileNotFoundError:
        return None


def exists(directory: str, name: str) -> bool:
    fs, path = _located(directory, name)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def write_text(directory: str, name: str, text: str) -> None:
    """Write the file whole (a crash leaves the old one or the new one)."""
    uri = _uri.normalize_uri(directory)
    if _uri.is_local(uri):
        folder = _uri.local_path(uri)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(path + ".tmp", path)
        return
    fs, path = _located(directory, name)
    with fs.open_output_stream(path) as out:  # one PUT: the object appears whole
        out.write(text.encode("utf-8"))


def remove(directory: str, name: str) -> None:
    """Delete the file; nothing when it does not exist."""
    fs, path = _located(directory, name)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def remove_tree(directory: str) -> None:
    """Delete the directory and everything under it; nothing when it does not exist."""
    fs, path = _located(directory)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)
