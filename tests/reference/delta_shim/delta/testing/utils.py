"""delta-spark's ``DeltaTestCase`` with deltaflow's session settings.

The same class, methods and Spark settings as ``delta/testing/utils.py`` of delta-spark,
except that the two Delta settings name deltaflow's classes (from ``deltaflow.spark_conf``)
and the session is registered with ``deltaflow.register`` once it exists.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Generator
from contextlib import contextmanager

from pyspark import SparkConf
from pyspark.testing.sqlutils import ReusedSQLTestCase

import deltaflow


class DeltaTestCase(ReusedSQLTestCase):  # type: ignore[misc]
    """A test case with a SparkSession configured for Delta tables, shared per class."""

    @classmethod
    def conf(cls) -> SparkConf:
        conf = super().conf()
        conf.set("spark.app.name", cls.__name__)
        conf.set("spark.master", os.environ.get("DELTA_TESTS_MASTER", "local[2]"))
        conf.set("spark.ui.enabled", "false")
        conf.set("spark.sql.shuffle.partitions", "5")
        conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "5")
        for key, value in deltaflow.spark_conf().items():
            conf.set(key, value)
        return conf

    @classmethod
    def master(cls) -> str:
        return os.environ.get("DELTA_TESTS_MASTER", "local[2]")

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        deltaflow.register(cls.spark)

    def setUp(self) -> None:
        super().setUp()
        self.tempPath = tempfile.mkdtemp()
        self.tempFile = os.path.join(self.tempPath, "tempFile")

    def tearDown(self) -> None:
        super().tearDown()
        shutil.rmtree(self.tempPath, ignore_errors=True)

    @contextmanager
    def tempTable(self) -> Generator[str, None, None]:
        table_name = "table_" + str(uuid.uuid4()).replace("-", "_")
        with super().table(table_name):
            yield table_name
