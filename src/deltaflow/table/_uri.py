"""Table locations: one normal form for every path a user may hand us.

Tables are addressed by URI. Local paths become absolute ``file://`` URIs on the
driver so that executors, which may run in other processes or other working
directories, resolve the same place.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

_LOCAL_SCHEMES = ("", "file")


def normalize_uri(location: str) -> str:
    """Return ``location`` as a URI: ``file:///abs/path`` for local paths, unchanged otherwise."""
    if not location:
        raise ValueError("a table location must not be empty")
    parsed = urlparse(location)
    if parsed.scheme in _LOCAL_SCHEMES or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = unquote(parsed.path) if parsed.scheme == "file" else location
        return "file://" + os.path.abspath(os.path.expanduser(path)).rstrip("/")
    return location.rstrip("/")


def is_local(uri: str) -> bool:
    return urlparse(uri).scheme in _LOCAL_SCHEMES


def local_path(uri: str) -> str:
    """The filesystem path of a ``file://`` URI."""
    parsed = urlparse(uri)
    if parsed.scheme not in _LOCAL_SCHEMES:
        raise ValueError(f"{uri!r} is not a local path")
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def delta_rs_uri(uri: str) -> str:
    """The form delta-rs accepts: plain absolute paths for local tables."""
    return local_path(uri) if is_local(uri) else uri


def is_absolute(path: str) -> bool:
    """Whether a log path is a URI of its own rather than relative to the table."""
    return bool(_ABSOLUTE.match(path))


def join(uri: str, relative: str) -> str:
    """``relative`` under ``uri``; an absolute URI as it is (Delta allows a data file's
    path to be one: a shallow clone's files stay where its source keeps them)."""
    if is_absolute(relative):
        return relative
    return uri.rstrip("/") + "/" + relative.lstrip("/")


# A URI with a scheme: what a Delta log path is when it is not relative to the table.
_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(//|/)")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path of ``uri`` inside it."""
    if is_local(uri):
        return pafs.LocalFileSystem(), local_path(uri)
    scheme, sep, rest = uri.partition("://")
    if scheme.lower() == "s3a":
        # Hadoop's name for S3, which delta-rs accepts and pyarrow does not.
        uri = "s3" + sep + rest
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def shown(uri: str) -> str:
    """``uri`` fit for a message or a log: any ``user:secret@`` in it masked."""
    parsed = urlparse(uri)
    if "@" not in parsed.netloc:
        return uri
    host = parsed.netloc.rsplit("@", 1)[1]
    return parsed._replace(netloc=f"***@{host}").geturl()
