"""A real Spark standalone cluster for tests: one master and two workers, each its own JVM.

They are started from the pyspark wheel alone (``bin/spark-class`` with ``SPARK_HOME`` the
pyspark package), as a user would start them on their machines with the wheel installed,
on 127.0.0.1 with every port free. Each worker gets one core, 1 GiB for executors and its
own work directory (where Spark puts each executor's files: the jars it fetched from the
driver, its stdout and stderr). Jobs then run as separate driver processes with
``spark.master`` = :attr:`StandaloneCluster.master_url`, so a test's own local session is
untouched and driver, executors and Python workers are all different processes.

What the workers pass to executors is exactly their environment (``env`` of
:func:`start_standalone`): the test process's environment *minus* the AWS settings, so an
executor reaches S3 only with what the driver sends it (``spark.executorEnv.*``), as on
machines that were not set up with credentials; and with ``PYTHONPATH`` naming the
deltaflow under test, standing in for "the wheel installed on every node".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests._object_store import free_port
from tests._waiting import wait_until, wait_while_running

START_TIMEOUT = 240.0  # three JVMs on 2 shared cores, under load
STOP_TIMEOUT = 60.0
WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "1g"
# The daemons themselves only schedule: a small heap each (Spark's default is 1 GiB).
DAEMON_MEMORY = "256m"


@dataclass(frozen=True)
class StandaloneCluster:
    master_url: str  # spark://127.0.0.1:<port>
    web_url: str  # the master's web UI; <web_url>/json/ describes the cluster
    work_dirs: tuple[Path, ...]  # one per worker
    log_dir: Path
    started_in: float  # seconds from the first launch to every worker ALIVE
    workers: tuple[Worker, ...] = field(default=(), compare=False)

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(self.web_url + "/json/", timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def alive_workers(self) -> int:
        workers = self.state().get("workers", [])
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def wait_all_alive(self, timeout: float = START_TIMEOUT) -> None:
        """Until :data:`WORKERS` workers are ALIVE (e.g. after :meth:`Worker.restart`)."""
        wait_until(self._all_alive, timeout, f"{WORKERS} ALIVE workers at {self.web_url}")

    def _all_alive(self) -> bool:
        try:
            return self.alive_workers() == WORKERS
        except OSError:
            return False  # the web UI is not up yet
        except ValueError:
            # Seen once in CI: /json/ answered an HTML page while the master was
            # starting. Not up yet either; a page that stays HTML times the wait out.
            return False

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )


class Worker:
    """One worker daemon in its own process group (``spark-class`` execs the JVM; its
    executors and their Python workers are its children, in the same group): :meth:`kill`
    SIGKILLs the whole group, as a machine crash would; :meth:`restart` launches it again
    with the same work directory (a new worker id for the master)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.proc = self._launch()

    def _launch(self) -> subprocess.Popen[bytes]:
        with self.log.open("a") as out:
            return subprocess.Popen(
                [*self.args, "--webui-port", str(free_port())],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT)
        wait_until(lambda: not group_alive(self.proc.pid), STOP_TIMEOUT, "the killed worker")

    def restart(self) -> None:
        assert self.proc.poll() is not None, "restart() is for a killed worker"
        self.proc = self._launch()

    def stop(self) -> None:
        stop_group(self.proc)


def spark_class() -> tuple[str, str]:
    """``(SPARK_HOME, bin/spark-class)`` of the installed pyspark wheel."""
    import pyspark

    home = os.path.dirname(os.path.realpath(pyspark.__file__))
    return home, os.path.join(home, "bin", "spark-class")


def worker_environment(python_path: str) -> dict[str, str]:
    """What the daemons (and so the executors) get: this environment without AWS settings."""
    home, _ = spark_class()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.pop("SPARK_HOME", None)
    env.update(
        SPARK_HOME=home,
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        PYTHONPATH=python_path,
        # No spark-env.sh or defaults from elsewhere: only what is passed here counts.
        SPARK_CONF_DIR=os.path.join(home, "conf-none"),
    )
    return env


def cluster_conf(cluster: StandaloneCluster, executor_env: dict[str, str]) -> dict[str, str]:
    """The settings a job on the cluster gets on top of ``deltaflow.session()``'s."""
    return {
        "spark.master": cluster.master_url,
        "spark.driver.memory": "1g",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",  # one executor on each worker
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        # Jobs start once both executors registered (their JVMs start slowly under load).
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "180s",
        **{f"spark.executorEnv.{k}": v for k, v in executor_env.items()},
    }


def driver_environment(conf: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """A job's driver process: this environment without AWS settings, plus ``extra``;
    the job reads ``conf`` from ``DELTAFLOW_JOB_CONF``."""
    import deltaflow

    deltaflow_parent = str(Path(deltaflow.__file__).resolve().parents[1])
    tests_parent = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([deltaflow_parent, tests_parent]),
        DELTAFLOW_JOB_CONF=json.dumps(conf),
    )
    return env


@contextmanager
def start_standalone(base: Path, python_path: str) -> Iterator[StandaloneCluster]:
    """A master and :data:`WORKERS` workers; stopped (and their process groups checked
    empty) on exit, whatever happened."""
    _, launcher = spark_class()
    env = worker_environment(python_path)
    log_dir = base / "logs"
    log_dir.mkdir(parents=True)
    port, web_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    web_url = f"http://127.0.0.1:{web_port}"
    started = time.monotonic()
    with ExitStack() as stack:
        master = stack.enter_context(
            _daemon(
                [launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(web_port)],
                env, log_dir / "master.log",
            )
        )  # fmt: skip
        work_dirs, workers = [], []
        for n in range(WORKERS):
            work_dir = base / f"worker-{n}"
            work_dir.mkdir()
            work_dirs.append(work_dir)
            worker = Worker(
                [launcher, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                 "--work-dir", str(work_dir), master_url],
                env, log_dir / f"worker-{n}.log",
            )  # fmt: skip
            stack.callback(worker.stop)
            workers.append(worker)
        cluster = StandaloneCluster(master_url, web_url, tuple(work_dirs), log_dir, 0.0)
        wait_while_running(
            cluster._all_alive,
            master,
            START_TIMEOUT,
            f"{WORKERS} ALIVE workers at {web_url}",
            cluster.logs,
        )
        yield StandaloneCluster(
            master_url,
            web_url,
            tuple(work_dirs),
            log_dir,
            time.monotonic() - started,
            tuple(workers),
        )


@contextmanager
def _daemon(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """One daemon in its own process group (``spark-class`` execs the JVM; a worker's
    executors are its children, in the same group)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (a worker then kills its executors), SIGKILL what is left
    after :data:`STOP_TIMEOUT`; return only once the group is empty."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT)
    try:
        wait_until(lambda: not group_alive(proc.pid), STOP_TIMEOUT, "the process group to end")
    except AssertionError:  # a child outlived the group leader: kill what is left
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        wait_until(lambda: not group_alive(proc.pid), STOP_TIMEOUT, "the killed group to end")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
