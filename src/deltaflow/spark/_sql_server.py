"""``deltaflow sql-server``: Spark's Thrift JDBC server on a deltaflow session.

The server runs inside a PySpark driver (this process) rather than from
``start-thriftserver.sh``: the session then has everything a PySpark session has —
UPDATE / DELETE / MERGE INTO on Delta tables (run by the session's Python side), change
feed reads and streams through deltaflow's Python data source — for every JDBC client
(``beeline``, BI tools). Each JDBC connection gets its own session (its own current
database, temporary views and settings) over the one catalog, which persists (the
session's Hive metastore: ``<warehouse>/_metastore`` or ``DELTAFLOW_METASTORE_URL``).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def start(
    host: str = "127.0.0.1",
    port: int = 10000,
    master: str | None = None,
    warehouse: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    password_file: str | None = None,
    tls_keystore: str | None = None,
    tls_keystore_password: str | None = None,
) -> SparkSession:
    """Start a deltaflow session and Spark's Thrift server on it, listening on
    ``host:port``; returns the session (stop it to stop the server).

    ``password_file``: users and salted password hashes (``--add-user``) every client must
    log in with. ``tls_keystore`` / ``tls_keystore_password``: the server's key and
    certificate, for TLS. A non-loopback ``host`` without authentication raises
    :class:`~deltaflow.spark.errors.SqlServerConfigError`.
    """
    import deltaflow
    from deltaflow.spark import _sql_server_security as security

    settings = {
        # HiveThriftServer2 reads hive.server2.* from the Spark conf's spark.hive.* entries.
        "spark.hive.server2.thrift.bind.host": host,
        "spark.hive.server2.thrift.port": str(port),
        "spark.sql.hive.thriftServer.singleSession": "false",
    }
    if warehouse:
        settings["spark.sql.warehouse.dir"] = warehouse
    settings.update(
        security.security_settings(
            password_file=password_file,
            tls_keystore=tls_keystore,
            tls_keystore_password=tls_keystore_password,
        )
    )
    settings.update(conf or {})
    warning = security.check_exposure(settings)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    spark = deltaflow.session(app_name="deltaflow-sql-server", master=master, conf=settings)
    try:
        # The catalog now, not at the first client's query: a metastore another process
        # holds (embedded Derby) stops the server at start, typed; the first query finds
        # the metastore warm.
        spark.sql("SHOW DATABASES").collect()
    except BaseException:
        spark.stop()
        raise
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    provider = settings.get(security.CUSTOM_PROVIDER_KEY)
    if provider:
        # The Thrift server builds its custom provider from a fresh HiveConf, which reads
        # Java system properties and hive-site.xml but not the session's settings.
        jvm.java.lang.System.setProperty(
            security.CUSTOM_PROVIDER_KEY.removeprefix("spark."), provider
        )
    server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
    server.startWithContext(spark._jsparkSession.sqlContext())  # type: ignore[attr-defined]
    return spark


def jdbc_sessions(spark: SparkSession) -> tuple[int, int]:
    """The JDBC sessions the server started on ``spark`` holds open now, and how many it
    has opened in all, as Spark's Thrift server status store records them (from its
    listener; events reach it asynchronously, in order, within milliseconds)."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    kvstore = spark.sparkContext._jsc.sc().statusStore().store()  # type: ignore[union-attr]
    status = jvm.org.apache.spark.sql.hive.thriftserver.ui.HiveThriftServer2AppStatusStore(kvstore)
    return int(status.getOnlineSessionNum()), int(status.getSessionCount())


def serve(
    host: str = "127.0.0.1",
    port: int = 10000,
    master: str | None = None,
    warehouse: str | None = None,
    conf: Mapping[str, str] | None = None,
    **security: str | None,
) -> None:
    """Run the server until SIGTERM or SIGINT (``security``: :func:`start`'s keywords)."""
    spark = start(host, port, master, warehouse, conf, **security)
    tls = ";ssl=true" if security.get("tls_keystore") else ""
    print(f"deltaflow sql-server: jdbc:hive2://{host}:{port}/default{tls}", flush=True)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    print("deltaflow sql-server: stopping", file=sys.stderr, flush=True)
    spark.stop()
