"""Put-if-absent of a small object at any table location: the one primitive that makes
deltaflow's own log commits (and its compaction lease) safe when writers race.

* Local paths: a temporary file hard-linked to the final name (:mod:`deltaflow._atomic`).
* Object stores (``s3://``, ``s3a://``, ``gs://``, ``az://``/``abfss://``): a PUT that the
  store refuses when the key exists (S3 ``If-None-Match: *``), through ``obstore``, the
  Python binding of the Rust ``object_store`` crate that delta-rs commits with. So both
  commit paths (delta-rs's and deltaflow's log writer) take a version with the same
  request, and the store decides which writer wins it. No lock, no lease, no rename.

Settings come from the environment (``AWS_*``, the same variables delta-rs and pyarrow
read) or from a table's ``storage_options``; secrets are never logged or put in errors.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from deltaflow._atomic import put_if_absent as _put_local
from deltaflow.table import _uri
from deltaflow.table._object_store import object_store_error
from deltaflow.table.errors import UnsupportedFeatureError

# Schemes whose stores honour a create-only PUT in object_store (S3 since AWS added
# If-None-Match in 2024; GCS and Azure natively).
_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure"})
# Client settings (not store settings) among the ones users pass as storage options.
_CLIENT_KEYS = {"aws_allow_http": "allow_http", "allow_http": "allow_http"}

_stores: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_lock = threading.Lock()


def supported(uri: str) -> bool:
    """Whether put-if-absent is available at ``uri``."""
    scheme = urlparse(uri).scheme.lower()
    return _uri.is_local(uri) or scheme in _SCHEMES


def put_if_absent(
    uri: str, payload: bytes, storage_options: Mapping[str, str] | None = None
) -> bool:
    """Create the object ``uri`` holding ``payload``; False (nothing written) if it exists.

    Raises :class:`UnsupportedFeatureError` for a store without a conditional put and
    :class:`ObjectStoreError` for a failed request (credentials, unreachable endpoint).
    """
    if _uri.is_local(uri):
        return _put_local(_uri.local_path(uri), payload)
    if not supported(uri):
        raise unsupported(uri, "Writing to the Delta log of")
    import obstore
    from obstore.exceptions import AlreadyExistsError

    store, key = _store_and_key(uri, storage_options)
    try:
        obstore.put(store, key, payload, mode="create")
    except AlreadyExistsError:
        return False
    except Exception as exc:
        error = object_store_error(uri, _as_os_error(exc), "write a Delta log entry to")
        if error is not None:
            raise error from exc
        raise
    return True


def object_exists(uri: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether the object (or local file) ``uri`` exists: one HEAD on an object store, a
    stat on a local path. For a store :func:`supported` refuses, raises
    :class:`UnsupportedFeatureError` (callers check :func:`supported` first).

    A HEAD on a missing key answers 404 only with ``s3:ListBucket``, which reading the
    log (a LIST) needs anyway; S3's negative lookups are strongly consistent since 2020.
    """
    if _uri.is_local(uri):
        return os.path.exists(_uri.local_path(uri))
    if not supported(uri):
        raise unsupported(uri, "Looking up an object of")
    import obstore
    from obstore.exceptions import NotFoundError

    store, key = _store_and_key(uri, storage_options)
    try:
        obstore.head(store, key)
    except (NotFoundError, FileNotFoundError):
        return False
    except Exception as exc:
        error = object_store_error(uri, _as_os_error(exc), "look up")
        if error is not None:
            raise error from exc
        raise
    return True


def unsupported(uri: str, doing: str) -> UnsupportedFeatureError:
    scheme = urlparse(uri).scheme
    return UnsupportedFeatureError(
        f"{doing} {uri}: deltaflow commits its own log entries with a conditional put"
        f" (put-if-absent), which it can do on local paths, S3, GCS and Azure, not on"
        f" {scheme}://. Use one of those stores for this table.",
        table_uri=uri,
        feature="conditionalPut",
    )


def _store_and_key(uri: str, storage_options: Mapping[str, str] | None) -> tuple[Any, str]:
    from obstore.store import from_url

    make: Any = from_url  # typed per store; the scheme picks one at run time
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme.lower() == "s3a":
        scheme = "s3"  # Hadoop's name for S3; object_store knows s3://
    config: dict[str, str] = {}
    client: dict[str, Any] = {}
    for name, value in (storage_options or {}).items():
        lowered = name.lower()
        if lowered in _CLIENT_KEYS:
            client[_CLIENT_KEYS[lowered]] = str(value).lower() == "true"
        else:
            config[lowered] = value
    # Keyed by the options' values too: a store keeps its credentials. And by the endpoint
    # from_url would read: one process may talk to two S3-compatible servers in turn
    # (tests do) whose buckets share a name.
    endpoint = ("aws_endpoint_url", os.environ.get("AWS_ENDPOINT_URL", ""))
    cache_key = (f"{scheme}://{bucket}", (*sorted(config.items()), endpoint))
    with _lock:
        store = _stores.get(cache_key)
        if store is None:
            # from_url reads the environment's AWS_* (etc.) variables, like delta-rs does;
            # explicit options take precedence.
            store = make(
                f"{scheme}://{bucket}", config=config or None, client_options=client or None
            )
            _stores[cache_key] = store
    return store, key


def _as_os_error(exc: BaseException) -> BaseException:
    # object_store_error maps I/O failures (OSError) only; obstore's are not OSErrors.
    return exc if isinstance(exc, OSError) else OSError(str(exc))
