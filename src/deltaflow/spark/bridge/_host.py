"""The host's Spark sessions, inside the brain.

The driver JVM that starts the brain also starts a Py4J gateway for it
(``org.apache.spark.sql.deltaflow.BrainGateway``) and hands over its port and secret in
``PYSPARK_GATEWAY_PORT`` / ``PYSPARK_GATEWAY_SECRET``, as ``spark-submit`` does for a
Python application. Here the brain connects once, with pyspark's own ``launch_gateway``,
and wraps the host's running ``SparkContext`` in a PySpark one (:class:`_HostContext`,
which can never stop it). A request that needs a session names one the JVM lent for it
(``BrainSessions.lend``): :func:`lent_session` makes it active on this thread's JVM
thread, with the statement's local properties, and yields a PySpark ``SparkSession``
over it — a Connect client's isolated session, a Thrift connection's, a PySpark
driver's — so the request sees that session's temp views, current database and confs.

Threads: pyspark's pinned-thread mode (its default) gives each brain thread a JVM thread
of its own, so concurrent requests in different sessions keep apart. One PySpark wrapper
serves every concurrent request on the same session (keyed by the session's UUID), so
per-session bookkeeping keyed on it (``_target_scan.session_conf``) holds. PySpark's
process-wide ``SparkSession._activeSession`` stays the wrapper of the host's default
session: brain code passes its session explicitly and never asks for the active one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from deltaflow.spark.errors import BridgeError

log = logging.getLogger("deltaflow.bridge")
_lock = threading.Lock()
_context: SparkContext | None = None
# session UUID -> [wrapper, requests using it]
_wrappers: dict[str, list[Any]] = {}
# Variables a Spark Connect client process sets; inherited from a host a local Connect
# session started, they would make pyspark refuse a classic context here.
_CONNECT_CLIENT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


def context() -> SparkContext:
    """The host's SparkContext as a PySpark context (connected on first use)."""
    global _context
    with _lock:
        if _context is None:
            _context = _connect()
        return _context


def warm() -> None:
    """Connect now, in the background of the brain's start, so the first DML statement
    does not wait for it; a failure is left for the first request to report."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    try:
        context()
    except Exception as exc:  # the first session request connects again and reports it
        log.debug("deltaflow brain: gateway warm-up failed: %s", exc)


def _connect() -> SparkContext:
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        reason = os.environ.get("DELTAFLOW_GATEWAY_FAILURE", "the host gave it no gateway")
        raise BridgeError(
            f"deltaflow's brain cannot reach the Spark driver that started it: {reason}."
            " The driver's log has the gateway's error; restarting the Spark application"
            " starts a new one.",
            operation="session",
        )
    for name in _CONNECT_CLIENT_ENV:
        os.environ.pop(name, None)
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway()
    jvm = gateway.jvm
    jsc = jvm.org.apache.spark.api.java.JavaSparkContext.fromSparkContext(
        jvm.org.apache.spark.sql.deltaflow.BrainGateway.sparkContext()
    )
    # Python workers (the DML's mapInArrow, data sources registered here) run this
    # interpreter, which has deltaflow (spark.deltaflow.python), unless the host says
    # otherwise.
    conf = SparkConf(_jconf=jsc.sc().getConf())
    worker_python = conf.get("spark.pyspark.python", None) or sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", worker_python)
    sc = _HostContext(gateway=gateway, jsc=jsc, conf=conf)
    from deltaflow._session import worker_object_store_env

    worker_object_store_env(sc)
    _claim_default_session(sc)
    return sc


class _HostContext(SparkContext):
    """The host's SparkContext: the brain uses it, the host owns it."""

    def stop(self) -> None:
        # Never the JVM context (pyspark's stop() would end the host's application), only
        # what this wrapper started.
        server = getattr(self, "_accumulatorServer", None)
        if server is not None:
            server.shutdown()
        with SparkContext._lock:
            if SparkContext._active_spark_context is self:
                SparkContext._active_spark_context = None


def _claim_default_session(sc: SparkContext) -> None:
    """Make PySpark's first session (the one it makes the JVM's default and active) the
    host's own default session, so wrapping lent sessions later changes neither. A host
    without a default session yet keeps none (:func:`_wrap`)."""
    jclass = _session_class(sc)
    default = jclass.getDefaultSession()
    if default.isDefined():
        SparkSession(sc, default.get())
        jclass.clearActiveSession()


def _session_class(sc: SparkContext) -> Any:
    return getattr(sc._jvm, "org.apache.spark.sql.classic.SparkSession")  # type: ignore[attr-defined]


def _wrap(sc: SparkContext, jsession: Any) -> SparkSession:
    """A PySpark session over ``jsession``; if it is PySpark's first, the JVM's default
    session it would set is put back as it was (none)."""
    first = SparkSession._instantiatedSession is None
    wrapper = SparkSession(sc, jsession)
    if first:
        _session_class(sc).clearDefaultSession()
    return wrapper


@contextmanager
def lent_session(token: str) -> Iterator[SparkSession]:
    """The session the JVM lent under ``token``, active on this thread meanwhile."""
    sc = context()
    registry = getattr(sc._jvm, "org.apache.spark.sql.deltaflow.BrainSessions")  # type: ignore[attr-defined]
    jsession = registry.enter(token)
    try:
        key = str(jsession.sessionUUID())
        with _lock:
            entry = _wrappers.get(key)
            if entry is None:
                entry = _wrappers[key] = [_wrap(sc, jsession), 0]
            entry[1] += 1
        try:
            yield entry[0]
        finally:
            with _lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del _wrappers[key]
    finally:
        registry.leave()
