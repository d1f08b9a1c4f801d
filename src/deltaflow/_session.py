"""Spark sessions with the ``delta`` source registered."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

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
# Stream checkpoints on S3A written to their final keys, put-if-absent for the offset and
# commit logs (architecture.md, "Checkpoints on S3A"); every other store as Spark does it.
CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
CHECKPOINT_MANAGER = "org.apache.spark.sql.deltaflow.DeltaflowCheckpointFileManager"
DIRECT_CHECKPOINTS_CONF = "spark.deltaflow.checkpoint.directWrites"


def spark_conf(*, warehouse: str | None = None) -> dict[str, str]:
    """The Spark settings deltaflow needs, for any host Spark runs in.

    Pass them to ``spark-submit`` / ``spark-sql`` / ``start-connect-server.sh`` /
    ``start-thriftserver.sh`` as ``--conf key=value`` (or use :func:`configure` on a
    builder). They put deltaflow's connector jar (built on first call from its sources
    with the Scala compiler pyspark ships) on the driver's and executors' classpath,
    tell the connector which Python runs its brain (this one), and keep the catalog in
    Spark's Hive metastore, so schemas and tables outlive the process: on embedded Derby
    in ``<warehouse>/_metastore`` (``warehouse``: where managed tables go; by default
    Spark's ``spark-warehouse`` in the host's working directory), or on the shared
    database ``DELTAFLOW_METASTORE_URL`` names (see :mod:`deltaflow.spark.catalog._metastore`).
    """
    from deltaflow.spark.catalog._metastore import WAREHOUSE, catalog_settings

    given = {WAREHOUSE: warehouse} if warehouse else {}
    catalog = catalog_settings(given)
    return {
        **_connector_conf(catalog.jars),
        **given,
        **catalog.conf,
        **REQUIRED_CONF,
        **_checkpoint_conf({}),
    }


def _checkpoint_conf(existing: Mapping[str, str]) -> dict[str, str]:
    """deltaflow's checkpoint manager, on Spark 4.1+ (whose Hadoop has S3A's conditional
    create), unless ``existing`` names a manager or turns direct writes off."""
    import pyspark

    minor = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
    off = existing.get(DIRECT_CHECKPOINTS_CONF, "true").strip().lower() == "false"
    if minor < (4, 1) or off or CHECKPOINT_MANAGER_CONF in existing:
        return {}
    return {CHECKPOINT_MANAGER_CONF: CHECKPOINT_MANAGER}


def _connector_conf(extra_jars: tuple[str, ...] = ()) -> dict[str, str]:
    from deltaflow.spark._jar import jar_path
    from deltaflow.spark._patches import check_version

    check_version()  # a pyspark the connector cannot serve: a typed error, before any build
    jars = (str(jar_path()), *extra_jars)
    return {
        "spark.jars": ",".join(jars),
        "spark.driver.extraClassPath": os.pathsep.join(jars),
        "spark.executor.extraClassPath": os.pathsep.join(jars),
        "spark.deltaflow.python": sys.executable,
        "spark.sql.extensions": SQL_EXTENSION,
        "spark.sql.catalog.spark_catalog": SESSION_CATALOG,
    }


def configure(builder: SparkSession.Builder) -> SparkSession.Builder:
    """``builder`` with :func:`spark_conf` applied: deltaflow's counterpart of delta-spark's
    ``configure_spark_with_delta_pip``. Class paths already on the builder are kept, with
    the connector jar added; catalog settings already on the builder are kept (an
    in-memory catalog, a metastore database of the user's own), and the embedded
    metastore follows the builder's warehouse."""
    from deltaflow.spark.catalog._metastore import catalog_settings

    existing = dict(getattr(builder, "_options", {}))
    catalog = catalog_settings(existing)
    settings = {
        **_connector_conf(catalog.jars),
        **catalog.conf,
        **REQUIRED_CONF,
        **_checkpoint_conf(existing),
    }
    for key, value in settings.items():
        current = existing.get(key)
        if key in (*_CLASSPATH_KEYS, "spark.sql.extensions") and current:
            separator = os.pathsep if key in _CLASSPATH_KEYS[1:] else ","
            present = current.split(separator)
            value = separator.join(
                [current, *(v for v in value.split(separator) if v not in present)]
            )
        builder = builder.config(key, value)
    return builder


def register(spark: SparkSession) -> SparkSession:
    """Register deltaflow on ``spark``, a session built with :func:`configure` (or with
    :func:`spark_conf`'s settings): the Python data source the connector delegates to,
    cloudFiles, and delta-spark's writer behaviour on the driver.

    On a Spark Connect session there is nothing to install on the client: the server's
    connector registers what a session needs when it first needs it. This checks that
    the server has the connector (else :class:`SessionNotConfiguredError`) and sets the
    session confs deltaflow needs.
    """
    if _is_connect(spark):
        _check_connect_server(spark)
        for key, value in REQUIRED_CONF.items():
            spark.conf.set(key, value)
        return spark

    from deltaflow.spark import _patches

    _patches.check_version()  # first: the modules below need a pyspark deltaflow serves

    _check_connector(spark)
    _warm_brain(spark)  # first: its start overlaps the rest of the registration
    from deltaflow.spark.read._native import learn_driver_object_stores

    # DML from the Python API routes here: s3a:// tables take the JVM path as in the brain.
    learn_driver_object_stores(spark)
    _driver_object_store_env(spark)
    _patches.install()  # the pyspark patches that remain, all listed in _patches.PATCHES

    for key, value in REQUIRED_CONF.items():
        spark.conf.set(key, value)
    # A failed streaming query's error, kept beside its checkpoint (for the console).
    jvm = spark._jvm  # type: ignore[attr-defined]
    jvm.org.apache.spark.sql.deltaflow.StreamErrors.install(spark._jsparkSession)  # type: ignore[attr-defined]
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    """deltaflow's Python data sources (``deltaflow_python``, ``cloudFiles``) in the
    classic session ``spark``: :func:`register` does it on a PySpark driver, the brain
    in any other session that needs them (the bridge's ``session.sources``)."""
    from deltaflow.ingest.cloudfiles._source import CloudFilesDataSource
    from deltaflow.spark._source import DeltaDataSource

    spark.dataSource.register(DeltaDataSource)
    spark.dataSource.register(CloudFilesDataSource)
    # The AWS variables the session's fs.s3a.* settings imply, for every source's workers.
    wanted = _object_store_variables(spark._jvm)  # type: ignore[attr-defined]
    for name in (PYTHON_SOURCE_NAME, "cloudFiles"):
        env_vars = _worker_env(spark, name)
        if env_vars is not None:
            _settle_worker_env(spark, env_vars)
            for key, value in wanted.items():
                if not env_vars.containsKey(key):
                    env_vars.put(key, value)


def _driver_object_store_env(spark: SparkSession) -> None:
    """Credentials from one place, in the driver Python too: it plans writes and DML
    through delta-rs and pyarrow, which read only the environment, so the AWS variables
    the session's ``fs.s3a.*`` settings imply are set here where they are not set already
    (as the connector does for the brain). Never printed."""
    variables = _object_store_variables(spark._jvm)  # type: ignore[attr-defined]
    for key, value in variables.items():
        os.environ.setdefault(key, value)
    _add_to_worker_env(spark.sparkContext, variables)


def worker_object_store_env(sc: Any) -> None:
    """The same variables for the Python workers of the functions this process makes
    through ``sc`` (its ``environment``: the envVars of every ``mapInArrow`` it builds,
    such as DML's target scans and change writers on the Python path): the workers are
    the JVM's children, whose environment lacks them. The driver and the brain both call
    this. Never printed."""
    _add_to_worker_env(sc, _object_store_variables(sc._jvm))


def _add_to_worker_env(sc: Any, variables: dict[str, str]) -> None:
    for key, value in variables.items():
        sc.environment.setdefault(key, value)


def _object_store_variables(jvm: Any) -> dict[str, str]:
    """Credentials from one place: the AWS variables the session's ``fs.s3a.*`` settings
    imply, less those the driver JVM's own environment sets (the JVM's
    ``HadoopStores.pythonWorkerVariables``; empty without S3 settings). deltaflow's Python
    data source workers (the driver's planners and every task) and the driver Python get
    them, so they reach the store as the brain does: delta-rs and pyarrow read only the
    environment. The values stay in environments: never printed, never in a plan string."""
    wanted = jvm.io.deltaflow.spark.HadoopStores.pythonWorkerVariables()
    return {str(key): str(wanted.get(key)) for key in wanted.keySet().toArray()}


def _worker_env(spark: SparkSession, name: str) -> Any:
    """The registered source ``name``'s worker environment (the ``envVars`` java.util.Map of
    its Python function, which Spark hands to every worker of that source), or None."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()  # type: ignore[attr-defined]
    if not manager.dataSourceExists(name):
        return None
    return manager.lookupDataSource(name).dataSourceCls().envVars()


def _is_connect(spark: SparkSession) -> bool:
    try:
        from pyspark.sql.utils import is_remote
    except ImportError:  # pragma: no cover - every supported pyspark has it
        return False
    connect_class = type(spark).__module__.startswith("pyspark.sql.connect")
    return connect_class or (is_remote() and not hasattr(spark, "_jsparkSession"))


def _check_connect_server(spark: SparkSession) -> None:
    """Raise :class:`SessionNotConfiguredError` unless the Connect server runs deltaflow's
    connector: its SQL extension and session catalog (what :func:`spark_conf` sets)."""
    from deltaflow.spark.errors import SessionNotConfiguredError

    missing = []
    extensions = spark.conf.get("spark.sql.extensions", None) or ""
    if SQL_EXTENSION not in [e.strip() for e in extensions.split(",")]:
        missing.append("spark.sql.extensions")
    if spark.conf.get("spark.sql.catalog.spark_catalog", None) != SESSION_CATALOG:
        missing.append("spark.sql.catalog.spark_catalog")
    if missing:
        raise SessionNotConfiguredError(
            "This Spark Connect server was started without deltaflow's connector (missing "
            f"{', '.join(missing)}), so format('delta') and Delta SQL cannot reach"
            " deltaflow. Start the server with deltaflow.spark_conf()'s settings, e.g."
            " start-connect-server.sh $(python -c 'import deltaflow;"
            ' print(" ".join(f"--conf {k}={v}" for k, v in'
            " deltaflow.spark_conf().items()))').",
            missing=tuple(missing),
        )


WARM_UP_CONF = "spark.deltaflow.session.warmUp"
WARM_UP_JOB_GROUP = "deltaflow-warm-up"
WARM_UP_JOB_TEXT = "deltaflow: the process's first job, run at session start (see session.warmUp)"
# The warm-up threads register() started; await_warm_up_threads joins them.
_WARM_UPS: list[threading.Thread] = []


def _warm_brain(spark: SparkSession) -> None:
    """Start the connector's brain process now, and warm the session's first Spark job,
    in the background.

    The driver JVM starts the brain at the first call (``Brain.call``): a Python process
    that imports delta-rs, pyarrow and deltaflow, ~1 s on a quiet machine, several under
    load, that the first Delta statement of a session would otherwise wait for. Then a
    process's first Spark job pays once for loading the scheduler's, the executors' and
    the code generator's classes: 2-4 s, which the first ``spark.read.parquet`` (its
    schema inference is a job) or the first query would otherwise pay. A daemon thread
    overlaps both with whatever the user does next; a one-row job on one partition
    touches no catalog (the metastore stays closed, see architecture.md) and no storage.
    ``spark.deltaflow.session.warmUp=false`` leaves the job out. Failures are ignored
    here: the first real call starts the brain again and reports them.
    """
    warm_job = (spark.conf.get(WARM_UP_CONF, "true") or "true").strip().lower() != "false"

    def ping() -> None:
        with suppress(Exception):
            brain = spark._jvm.io.deltaflow.spark.Brain  # type: ignore[attr-defined]
            brain.call("ping", brain.newArgs())

    def first_job() -> None:
        with suppress(Exception):
            jspark = spark._jsparkSession  # type: ignore[attr-defined]
            # This thread's jobs only (py4j pins a JVM thread to it): named in the UI.
            jspark.sparkContext().setJobGroup(WARM_UP_JOB_GROUP, WARM_UP_JOB_TEXT, False)
            jspark.range(0, 1, 1, 1).count()

    # Two threads: the brain's start is another process's work, the job the JVM's.
    threads = [threading.Thread(target=ping, name="deltaflow-brain-warmup", daemon=True)]
    if warm_job:
        threads.append(threading.Thread(target=first_job, name="deltaflow-job-warmup", daemon=True))
    _WARM_UPS[:] = [t for t in _WARM_UPS if t.is_alive()] + threads
    for thread in threads:
        thread.start()


def await_warm_up_threads(timeout: float = 120.0) -> bool:
    """Wait until the background warm-up :func:`register` started (the brain's start, the
    first Spark job) is done; True when it is, False when ``timeout`` seconds passed first.

    Nothing needs it for correctness: the first statement simply waits for what it needs.
    It is for callers who want the session's fixed costs paid before they start a clock
    (benchmarks, a notebook's first timed cell): ``deltaflow.session(await_warm_up=True)``
    calls it.
    """
    deadline = time.monotonic() + timeout
    for thread in list(_WARM_UPS):
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in _WARM_UPS)


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


def _settle_worker_env(spark: SparkSession, env_vars: Any) -> None:
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
    *,
    remote: str | None = None,
    await_warm_up: bool = False,
) -> SparkSession:
    """A SparkSession with the ``delta`` source registered and sensible local defaults.

    Python workers run this interpreter; shuffle partitions match the cores;
    logs are quiet; the session time zone is UTC (so timestamps, ``timestampAsOf``
    and partition values mean the same on every machine). ``conf`` overrides any
    default.

    With ``remote`` (``"sc://host:port"``), a Spark Connect session to a server started
    with :func:`spark_conf`'s settings: everything deltaflow does runs on the server
    (reads, writes, SQL DML, the change feed), and ``conf`` sets session confs there.
    ``master`` does not apply; a server without the connector raises
    :class:`~deltaflow.spark.errors.SessionNotConfiguredError`.

    The session returns while its warm-up (the connector's brain process starting, the
    process's first Spark job) still runs in the background; ``await_warm_up=True``
    returns only once that is done (see :func:`await_warm_up_threads`), so a clock started next
    measures the work, not the session's start. It has no effect with ``remote``.
    """
    from pyspark.sql import SparkSession

    if remote is not None:
        if master is not None:
            from deltaflow.errors import InvalidOptionError

            raise InvalidOptionError(
                "deltaflow.session() takes master= (a local or cluster Spark) or remote="
                " (a Spark Connect server), not both: drop one.",
                option="master",
            )
        remote_builder = SparkSession.builder.remote(remote)
        if app_name:
            remote_builder = remote_builder.appName(app_name)
        for key, value in {"spark.sql.session.timeZone": "UTC", **(conf or {})}.items():
            remote_builder = remote_builder.config(key, value)
        return register(remote_builder.getOrCreate())

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = os.cpu_count() or 2
    builder = SparkSession.builder.appName(app_name or "deltaflow").master(
        master or f"local[{cores}]"
    )
    log_config = os.path.join(os.path.dirname(__file__), "spark", "log4j2.properties")
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    settings = {
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        **_LOCAL_DEFAULTS,
        "spark.sql.shuffle.partitions": str(max(cores * 2, 2)),
        **REQUIRED_CONF,
    }
    settings.update(conf or {})
    _derby_log_beside_metastore(settings, java_options)
    for key, value in settings.items():
        builder = builder.config(key, value)
    builder = configure(builder)
    with _bytecode_spark_home():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    if await_warm_up:
        await_warm_up_threads()
    return spark


def _derby_log_beside_metastore(settings: dict[str, str], java_options: str) -> None:
    """Derby's log (``derby.log``, else written to the working directory) goes into the
    embedded metastore's directory, when the catalog is there and the driver's Java
    options are deltaflow's."""
    from deltaflow.spark.catalog._metastore import catalog_settings

    derby_dir = catalog_settings(settings).derby_dir
    key = "spark.driver.extraJavaOptions"
    if derby_dir is None or settings.get(key) != java_options:
        return
    with suppress(OSError):
        os.makedirs(derby_dir, exist_ok=True)
        log = os.path.join(os.path.abspath(derby_dir), "derby.log")
        settings[key] = f"{java_options} -Dderby.stream.error.file={log}"


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
