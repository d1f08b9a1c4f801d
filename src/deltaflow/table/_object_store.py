"""Object stores (``s3://``, ``gs://``, ``abfss://``, ...): how their settings arrive, and
their failures as typed errors.

deltaflow has no settings of its own for object stores and reads no environment variable
for them: delta-rs (the log, commits) and pyarrow (data files) read the standard ones of
each store themselves, in every process that touches the table. For S3 and S3-compatible
servers: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (or ``AWS_PROFILE``, or an
instance / pod role), ``AWS_REGION``, ``AWS_ENDPOINT_URL`` and ``AWS_ALLOW_HTTP=true`` for
an ``http://`` endpoint. Spark's JVM, the brain process it starts and its Python workers
inherit the environment the driver had when the JVM was launched, so these must be set
before the Spark session starts.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

from deltaflow.table.errors import ObjectStoreError

_S3_SCHEMES = frozenset({"s3", "s3a"})
_S3_SETTINGS = (
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or an instance role),"
    " AWS_REGION, and for an S3-compatible server AWS_ENDPOINT_URL (with AWS_ALLOW_HTTP=true"
    " for an http:// endpoint)"
)
# Markers in delta-rs (object_store) and pyarrow (AWS SDK) error text, lower-cased.
_CREDENTIAL_MARKERS = (
    "forbidden",
    "signaturedoesnotmatch",
    "invalidaccesskeyid",
    "accessdenied",
    "lacked the necessary privileges",
    "credential",
    "169.254.169.254",  # no credentials anywhere: object_store fell back to instance metadata
)
# The status code alone: the text also holds ports and durations ("127.0.0.1:40312",
# "in 4.0312s") whose digits may contain it.
_FORBIDDEN_STATUS = re.compile(r"(?<![\w.:])403(?![\w.])")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DETAIL_LIMIT = 600
_UNREACHABLE_MARKERS = (
    "connection refused",
    "tcp connect error",
    "dns error",
    "timed out",
    "connection reset",
    # pyarrow's AWS SDK: "AWS Error NETWORK_CONNECTION ... Could not connect to server".
    "network_connection",
    "could not connect",
)


def object_store_error(uri: str, exc: BaseException, doing: str) -> ObjectStoreError | None:
    """``exc``, raised while ``doing`` something to the table at ``uri``, as a typed error;
    None when ``uri`` is not on an object store or ``exc`` is not an I/O failure."""
    scheme = urlparse(uri).scheme
    if scheme in ("", "file") or not isinstance(exc, OSError) or isinstance(exc, ObjectStoreError):
        return None
    text = str(exc)
    lowered = text.lower()
    if _FORBIDDEN_STATUS.search(lowered) or any(m in lowered for m in _CREDENTIAL_MARKERS):
        kind, what = "credentials", "refused the request: no credentials, or ones it rejects"
    elif any(marker in lowered for marker in _UNREACHABLE_MARKERS):
        kind, what = "unreachable", "did not answer"
    else:
        kind, what = "other", "failed the request"
    settings = (
        _S3_SETTINGS
        if scheme in _S3_SCHEMES
        else f"the environment variables delta-rs documents for {scheme}://"
    )
    # object_store's text is a chain of causes, one per line, with colours and arrows.
    causes = (line.strip().lstrip("\u21b3").strip() for line in _ANSI.sub("", text).splitlines())
    detail = " <- ".join(c for c in causes if c)[:_DETAIL_LIMIT] or type(exc).__name__
    return ObjectStoreError(
        f"Could not {doing} {uri}: the object store {what} ({detail}). deltaflow"
        f" reaches object stores through delta-rs and pyarrow, which read {settings} from"
        " the environment. Set them before the Spark session starts: Spark's JVM, the"
        " processes it starts and its Python workers keep the environment they were"
        " launched with.",
        table_uri=uri,
        kind=kind,
    )
