"""Spark sessions with the ``delta`` source registered."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Confs every deltaflow session needs; register() applies them to a user's session too.
REQUIRED_CONF = {
    # pushFilters is how file skipping learns a query's predicates.
    "spark.sql.python.filterPushdown.enabled": "true",
}

_LOCAL_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
}


# The Python data source's name: the JVM connector's ``delta`` provider hands it what the
# JVM does not implement yet (streams, change-feed reads, object stores).
PYTHON_SOURCE_NAME = "deltaflow_python"
_PROVIDER_CLASS = "io.deltaflow.spark.DeltaDataSource"
# delta-spark's two settings, pointing at deltaflow's classes: Delta's SQL statements and
# the session catalog that serves Delta tables (CREATE TABLE, ALTER TABLE, saveAsTable, ...).
SQL_EXTENSION = "io.deltaflow.spark.DeltaSparkSessionExtension"
SESSION_CATALOG = "io.deltaflow.spark.DeltaCatalog"
_CLASSPATH_KEYS = ("spark.jars", "spark.driver.extraClassPath", "spark.executor.extraClassPath")


def spark_conf() -> dict[str, str]:
    """The Spark settings deltaflow needs, for any host Spark runs in.

    Pass them to ``spark-submit`` / ``spark-sql`` / ``start-connect-server.sh`` /
    ``start-thriftserver.sh`` as ``--conf key=value`` (or use :func:`configure` on a
    builder). They put deltaflow's connector jar (built on first call from its sources
    with the Scala compiler pyspark ships) on the driver's and executors' classpath,
    and tell the connector which Python runs its brain (this one).
    """
    from deltaflow.spark._jar import jar_path
    from deltaflow.spark._patches import check_version

    check_version()  # a pyspark the connector cannot serve: a typed error, before any build
    jar = str(jar_path())
    return {
        **dict.fromkeys(_CLASSPATH_KEYS, jar),
        "spark.deltaflow.python": sys.executable,
        "spark.sql.extensions": SQL_EXTENSION,
        "spark.sql.catalog.spark_catalog": SESSION_CATALOG,
        **REQUIRED_CONF,
    }


def configure(builder: SparkSession.Builder) -> SparkSession.Builder:
    """``builder`` with :func:`spark_conf` applied: deltaflow's counterpart of delta-spark's
    ``configure_spark_with_delta_pip``. Class paths already on the builder are kept, with
    the connector jar added."""
    existing = dict(getattr(builder, "_options", {}))
    for key, value in spark_conf().items():
        current = existing.get(key)
        if key in (*_CLASSPATH_KEYS, "spark.sql.extensions") and current:
            separator = os.pathsep if key in _CLASSPATH_KEYS[1:] else ","
            if value not in current.split(separator):
                value = current + separator + value
            else:
                value = current
        builder = builder.config(key, value)
    return builder


def register(spark: SparkSession) -> SparkSession:
    """Register deltaflow on ``spark``, a session built with :func:`configure` (or with
    :func:`spark_conf`'s settings): the Python data source the connector delegates to,
    cloudFiles, and delta-spark's writer behaviour on the driver."""
    from deltaflow.spark import _patches

    _patches.check_version()  # first: the modules below need a pyspark deltaflow serves

    from deltaflow.ingest.cloudfiles._source import CloudFilesDataSource
    from deltaflow.spark._source import DeltaDataSource
    from deltaflow.spark.dml import _sql as _sql_dml

    _check_connector(spark)
    _warm_brain(spark)  # first: its start overlaps the rest of the registration
    _patches.install()  # the pyspark patches that remain, all listed in _patches.PATCHES

    for key, value in REQUIRED_CONF.items():
        spark.conf.set(key, value)
    _sql_dml.install(spark)  # UPDATE / DELETE / MERGE INTO statements on Delta tables
    # A failed streaming query's error, kept beside its checkpoint (for the console).
    jvm = spark._jvm  # type: ignore[attr-defined]
    jvm.org.apache.spark.sql.deltaflow.StreamErrors.install(spark._jsparkSession)  # type: ignore[attr-defined]
    spark.dataSource.register(DeltaDataSource)
    spark.dataSource.register(CloudFilesDataSource)
    for name in (PYTHON_SOURCE_NAME, "cloudFiles"):
        _settle_worker_env(spark, name)
    return spark


def _warm_brain(spark: SparkSession) -> None:
    """Start the connector's brain process now, in the background.

    The driver JVM starts it at the first call (``Brain.call``): a Python process that
    imports delta-rs, pyarrow and deltaflow, ~1 s on a quiet machine, several under
    load, that the first Delta statement of a session would otherwise wait for. A ping
    from a daemon thread overlaps that with whatever the user does next. Failures are
    ignored here: the first real call starts the brain again and reports them.
    """

    def ping() -> None:
        with suppress(Exception):
            brain = spark._jvm.io.deltaflow.spark.Brain  # type: ignore[attr-defined]
            brain.call("ping", brain.newArgs())

    threading.Thread(target=ping, name="deltaflow-brain-warmup", daemon=True).start()


def _check_connector(spark: SparkSession) -> None:
    """Raise :class:`SessionNotConfiguredError` unless the connector's jar is loaded."""
    from deltaflow.spark.errors import SessionNotConfiguredError

    jvm = spark._jvm  # type: ignore[attr-defined]
    loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    try:
        jvm.java.lang.Class.forName(_PROVIDER_CLASS, True, loader)
    except Exception as exc:
        raise SessionNotConfiguredError(
            "This Spark session was started without deltaflow's connector jar, so"
            " format('delta') cannot reach deltaflow. Build the session with"
            " deltaflow.configure(SparkSession.builder).getOrCreate() (or"
            " deltaflow.session()), or pass deltaflow.spark_conf() as --conf settings"
            " to spark-submit. The jar must be on the classpath when the JVM starts:"
            " stop this session first.",
            missing=("spark.jars", "spark.driver.extraClassPath"),
        ) from exc


# The environment entries Spark's PythonStreamingSourceRunner puts into the registered
# source's shared envVars map when a streaming query starts (Spark 4.x).
_STREAM_RUNNER_ENV = (
    "SPARK_LOCAL_DIRS",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "SPARK_PYTHON_RUNTIME",
)


def _settle_worker_env(spark: SparkSession, name: str) -> None:
    """Give the registered source's Python function, now, the environment entries the
    streaming source runner would add when the first stream starts.

    Spark's driver-side ``PythonStreamingSourceRunner`` puts its entries straight into the
    ``envVars`` java.util.HashMap of the function registered for the source, and every
    task of every query on that source serializes the same map (inside its reader
    factory). The first stream start adds keys (a structural change) while another
    query may be serializing a task: the task then fails to deserialize with
    ``java.io.OptionalDataException`` (seen 1 run in 3 with two queries starting
    together). With the keys present, later puts only overwrite values with equal ones.
    """
    manager = spark._jsparkSession.sessionState().dataSourceManager()  # type: ignore[attr-defined]
    if not manager.dataSourceExists(name):
        return
    env_vars = manager.lookupDataSource(name).dataSourceCls().envVars()
    conf = spark.sparkContext._jsc.sc().conf()  # type: ignore[union-attr]
    # The runner overwrites every entry with its own value before it starts a worker,
    # and executors' runners set their own; these are only the best guesses meanwhile.
    values = {
        "SPARK_LOCAL_DIRS": conf.get("spark.local.dir", tempfile.gettempdir()),
        "SPARK_AUTH_SOCKET_TIMEOUT": str(
            conf.getTimeAsSeconds("spark.python.authenticate.socketTimeout", "15s")
        ),
        "SPARK_BUFFER_SIZE": str(conf.getInt("spark.buffer.size", 65536)),
        "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
    }
    for key in _STREAM_RUNNER_ENV:
        if not env_vars.containsKey(key):
            env_vars.put(key, values[key])


def session(
    app_name: str | None = None,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with the ``delta`` source registered and sensible local defaults.

    Python workers run this interpreter; shuffle partitions match the cores;
    logs are quiet; the session time zone is UTC (so timestamps, ``timestampAsOf``
    and partition values mean the same on every machine). ``conf`` overrides any
    default.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = os.cpu_count() or 2
    builder = SparkSession.builder.appName(app_name or "deltaflow").master(
        master or f"local[{cores}]"
    )
    log_config = os.path.join(os.path.dirname(__file__), "log4j2.properties")
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    settings = {
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        **_LOCAL_DEFAULTS,
        "spark.sql.shuffle.partitions": str(max(cores * 2, 2)),
        **REQUIRED_CONF,
    }
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    builder = configure(builder)
    with _bytecode_spark_home():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return register(spark)


@contextmanager
def _bytecode_spark_home() -> Iterator[None]:
    """Launch the JVM with a Spark home whose Python workers import pyspark with bytecode.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's
    ``PYTHONPATH``. The zip in the pyspark wheel holds sources only, and Python never
    caches bytecode for zip imports: every fresh worker compiles pyspark again, ~0.5 s.
    Each streaming query starts one (its source runner), and so does every planner
    and commit worker. When the workers run this interpreter, whose site-packages
    holds the very pyspark of that Spark home, ``SPARK_HOME`` points the launch at a
    directory of links to the Spark home's entries but ``python/``: workers then import
    the installed pyspark, with its cached bytecode. Measured: a stream's start to its
    first trigger 0.92 s -> 0.42 s. Nothing changes when ``SPARK_HOME`` or another
    worker interpreter is set, when a JVM is already running, or on any error.
    """
    from pyspark import SparkContext

    shim = None
    if SparkContext._gateway is None and not os.environ.get("SPARK_HOME"):  # type: ignore[attr-defined]
        with suppress(OSError):
            shim = _spark_home_without_zip()
    if shim is None:
        yield
        return
    os.environ["SPARK_HOME"] = shim
    try:
        yield
    finally:
        os.environ.pop("SPARK_HOME", None)


def _spark_home_without_zip() -> str | None:
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    if os.environ.get("PYSPARK_PYTHON", sys.executable) != sys.executable:
        return None
    home = os.path.realpath(_find_spark_home())
    if os.path.realpath(os.path.dirname(pyspark.__file__)) != home:
        return None  # a separate Spark install: its zip may not match this pyspark
    if not os.path.exists(os.path.join(home, "python", "lib", "pyspark.zip")):
        return None
    digest = hashlib.sha1(home.encode()).hexdigest()[:12]
    user = getattr(os, "getuid", lambda: 0)()  # per user: the links live in a shared /tmp
    shim = os.path.join(tempfile.gettempdir(), f"deltaflow-spark-home-{user}-{digest}")
    if os.path.isdir(os.path.join(shim, "jars")):
        return shim
    staging = tempfile.mkdtemp(prefix=os.path.basename(shim) + ".", dir=os.path.dirname(shim))
    for entry in os.listdir(home):
        if entry != "python":
            os.symlink(os.path.join(home, entry), os.path.join(staging, entry))
    try:
        os.rename(staging, shim)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process made it first
    return shim if os.path.isdir(os.path.join(shim, "jars")) else None
