"""deltaflow.session(): Python workers import the installed pyspark, not pyspark.zip."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pyspark

import deltaflow
from deltaflow import _session
from tests.spark._conf import conf_set


def _pyspark_origin(_: Any) -> str:
    import pyspark as worker_pyspark

    return str(worker_pyspark.__file__)


def test_python_workers_import_the_installed_pyspark(spark) -> None:
    # From pyspark.zip every fresh worker would compile pyspark again (~0.5 s each).
    origins = spark.sparkContext.parallelize([0, 1], 2).map(_pyspark_origin).collect()
    assert origins == [pyspark.__file__] * 2
    assert "SPARK_HOME" not in os.environ  # only the JVM launch saw the linked home


def test_linked_spark_home_has_everything_but_python() -> None:
    shim = _session._spark_home_without_zip()
    assert shim is not None
    home = Path(pyspark.__file__).parent
    assert not Path(shim, "python").exists()
    assert Path(shim, "jars").resolve() == (home / "jars").resolve()
    assert Path(shim, "bin", "spark-submit").exists()
    assert _session._spark_home_without_zip() == shim  # made once, then reused


def test_no_linked_home_for_another_worker_interpreter(monkeypatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable + "-other")
    assert _session._spark_home_without_zip() is None


def test_register_starts_the_brain_in_the_background(spark) -> None:
    # The first Delta statement of a session need not wait for the brain's start.
    _session.register(spark)
    warmups = [t for t in threading.enumerate() if t.name == "deltaflow-brain-warmup"]
    for thread in warmups:
        thread.join(timeout=120)
        assert not thread.is_alive()
    brain = spark._jvm.io.deltaflow.spark.Brain
    pid = brain.call("ping", brain.newArgs()).get("pid").asInt()
    command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"deltaflow.spark.bridge._server" in command


def _warm_up_jobs(spark: Any) -> list[int]:
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(_session.WARM_UP_JOB_GROUP))


def _join_warm_ups() -> None:
    # What session(await_warm_up=True) waits for: the jobs below must be done once it returns.
    assert _session.await_warm_up_threads(120), "the warm-up still runs after 120 s"
    names = {thread.name for thread in threading.enumerate()}
    assert not names & {"deltaflow-brain-warmup", "deltaflow-job-warmup"}


def test_register_runs_a_first_job_unless_told_not_to(spark) -> None:
    # A process's first Spark job loads the scheduler's and executors' classes (seconds):
    # register() pays that in the background, not the user's first query.
    tracker = spark.sparkContext.statusTracker()
    before = set(_warm_up_jobs(spark))
    _session.register(spark)
    _join_warm_ups()
    new = set(_warm_up_jobs(spark)) - before  # one job, or two with adaptive execution
    assert new
    assert {tracker.getJobInfo(job).status for job in new} == {"SUCCEEDED"}

    with conf_set(spark, _session.WARM_UP_CONF, "false"):
        before = set(_warm_up_jobs(spark))
        _session.register(spark)
        _join_warm_ups()
        assert set(_warm_up_jobs(spark)) == before


def test_spark_conf_names_the_jar_the_sql_extension_and_the_catalog(spark):
    conf = deltaflow.spark_conf()
    assert conf["spark.sql.extensions"] == "io.deltaflow.spark.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"] == "io.deltaflow.spark.DeltaCatalog"
    assert conf["spark.jars"].endswith(".jar")
    # The test session was built with them: its catalog is deltaflow's.
    catalog = spark._jsparkSession.sessionState().catalogManager().catalog("spark_catalog")
    assert catalog.getClass().getName() == "io.deltaflow.spark.DeltaCatalog"
    assert spark.conf.get("spark.sql.extensions") == conf["spark.sql.extensions"]


def test_the_checkpoint_manager_is_deltaflows_on_spark_4_1_unless_the_user_chose(spark):
    """architecture.md, "Checkpoints on S3A": set on Spark 4.1+, left alone when a manager is
    named or ``spark.deltaflow.checkpoint.directWrites=false``."""
    key, manager = _session.CHECKPOINT_MANAGER_CONF, _session.CHECKPOINT_MANAGER
    newer = tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= (4, 1)
    assert (deltaflow.spark_conf().get(key) == manager) is newer
    assert _session._checkpoint_conf({}) == ({key: manager} if newer else {})
    assert _session._checkpoint_conf({key: "com.example.Manager"}) == {}
    assert _session._checkpoint_conf({_session.DIRECT_CHECKPOINTS_CONF: "False"}) == {}
    # The test session was built by deltaflow.session(): its Hadoop conf names the class.
    hadoop = spark._jsparkSession.sessionState().newHadoopConf()
    assert (hadoop.get(key) == manager) is newer


def test_the_jvm_logging_configuration_deltaflow_names_exists(spark) -> None:
    """``deltaflow.session()`` hands the JVM its log4j2 file: a wrong path made log4j print
    "Reconfiguration failed" at every start and fall back to Spark's own, noisier, setup."""
    options = spark.conf.get("spark.driver.extraJavaOptions")
    names = [o.split("=file:", 1)[1] for o in options.split() if "log4j2.configurationFile" in o]
    assert names and all(Path(name).is_file() for name in names), options
