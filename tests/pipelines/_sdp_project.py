"""A Spark Declarative Pipelines project, as ``spark-pipelines init`` users write them:
``spark-pipeline.yml``, a Python file on ``pyspark.pipelines`` that reads the pipeline's
configuration at import time, and a SQL file. Run by ``deltaflow pipelines run``
(``test_sdp_project.py``) and by Spark's own ``spark-pipelines run``
(``test_spark_pipelines.py``)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

SPEC = """\
name: shop
storage: {storage}
database: {database}
libraries:
  - glob:
      include: transformations/**
configuration:
  shop.orders: {orders}
"""

PYTHON = """\
from pyspark import pipelines as dp
from pyspark.sql import functions as F

# Read once, when the file is loaded (the everyday Lakeflow idiom).
ORDERS = spark.conf.get("shop.orders")


@dp.table(comment="orders as they landed", format="delta")
def orders():
    return spark.readStream.format("delta").load(ORDERS)


@dp.materialized_view(format="delta")
def totals():
    return spark.read.table("orders").groupBy("customer").agg(F.sum("amount").alias("total"))
"""

SQL = """\
CREATE MATERIALIZED VIEW big_customers USING delta AS
SELECT customer, total FROM totals WHERE total >= 10;
"""


def write_project(
    root: Path,
    orders: str,
    database: str,
    storage: str,
    configuration: dict[str, str] | None = None,
) -> Path:
    """The project under ``root``; its spec file. ``configuration``: more settings for
    the spec's ``configuration`` (e.g. ``deltaflow.spark_conf()``)."""
    (root / "transformations").mkdir(parents=True, exist_ok=True)
    spec = root / "spark-pipeline.yml"
    extra = "".join(
        f"  {key}: {json.dumps(value)}\n" for key, value in (configuration or {}).items()
    )
    spec.write_text(SPEC.format(storage=storage, database=database, orders=orders) + extra)
    (root / "transformations" / "orders.py").write_text(PYTHON)
    (root / "transformations" / "report.sql").write_text(textwrap.dedent(SQL))
    return spec


def land_orders(path: str, rows: list[tuple[str, float]]) -> None:
    """Append ``(customer, amount)`` rows to the Delta table of landed orders."""
    customers, amounts = zip(*rows, strict=True)
    data = pa.table({"customer": list(customers), "amount": pa.array(amounts, pa.float64())})
    write_deltalake(path, data, mode="append")


def rows(path: str, *columns: str) -> list[tuple[object, ...]]:
    table = DeltaTable(path).to_pyarrow_table()
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))
