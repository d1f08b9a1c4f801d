"""Where a pipeline keeps things, and how its datasets become readable by name.

Under the pipeline's ``storage``: ``tables/<name>`` (each dataset's Delta table unless
it has a ``path``), ``checkpoints/<flow>`` (each streaming flow's checkpoint; a full
refresh deletes it), ``system/events`` (the event log). Tables are registered in the
catalog under the pipeline's database, so ``spark.read.table("silver")`` reads them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deltaflow.pipelines._analysis import ResolvedDataset
from deltaflow.pipelines._declarations import Dataset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Storage:
    """A pipeline's storage root (a local directory or URI) and catalog database."""

    root: str
    database: str

    def table_path(self, dataset: Dataset) -> str:
        return dataset.path or os.path.join(self.root, "tables", dataset.name.lower())

    def checkpoint(self, flow_name: str) -> str:
        return os.path.join(self.root, "checkpoints", flow_name.lower())

    @property
    def event_log(self) -> str:
        return os.path.join(self.root, "system", "events")

    def cdc_state(self, flow_name: str) -> str:
        return os.path.join(self.root, "system", "cdc", flow_name.lower())

    def reset_checkpoint(self, flow_name: str) -> None:
        """A full refresh of the flow: its checkpoint and AUTO CDC state are deleted."""
        shutil.rmtree(self.checkpoint(flow_name), ignore_errors=True)
        shutil.rmtree(self.cdc_state(flow_name), ignore_errors=True)

    def qualified(self, name: str) -> str:
        return f"`{self.database}`.`{name}`"


class CatalogPublisher:
    """Publishes resolved datasets: a table's Delta table is created (empty, with the
    resolved schema, partitioning, properties and comment) when it does not exist yet
    and registered in the catalog; a temporary view becomes a Spark temporary view."""

    def __init__(self, spark: SparkSession, storage: Storage) -> None:
        self._spark = spark
        self._storage = storage

    def publish(self, resolved: ResolvedDataset, views: Mapping[str, DataFrame]) -> None:
        dataset = resolved.dataset
        if resolved.kind == "temporary_view":
            views[dataset.name].createOrReplaceTempView(dataset.name)
            return
        from pyspark.sql.types import StructType

        from deltaflow.spark.dml._delta_table import DeltaTable
        from deltaflow.table import _uri
        from deltaflow.table._snapshot import table_exists

        path = self._storage.table_path(dataset)
        if table_exists(_uri.normalize_uri(path)):
            # Left by an earlier update: its log is the truth; (re)register the name only.
            location = path.replace("'", "\\'")
            self._spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self._storage.qualified(dataset.name)}"
                f" USING delta LOCATION '{location}'"
            )
            return
        builder = (
            DeltaTable.createIfNotExists(self._spark)
            .tableName(f"{self._storage.database}.{dataset.name}")
            .location(path)
            .addColumns(StructType.fromJson(json.loads(resolved.schema_json)))
        )
        if dataset.partition_cols:
            builder = builder.partitionedBy(*dataset.partition_cols)
        if dataset.cluster_by:
            builder = builder.clusterBy(*dataset.cluster_by)
        for key, value in dataset.table_properties.items():
            builder = builder.property(key, value)
        if dataset.comment:
            builder = builder.comment(dataset.comment)
        builder.execute()

    def unpublish_private(self, datasets: Iterable[Dataset]) -> None:
        """Private datasets leave the catalog when an update ends; their Delta tables
        stay (the entries are external: dropping one deletes no file)."""
        for dataset in datasets:
            if dataset.temporary and dataset.kind != "temporary_view":
                self._spark.sql(f"DROP TABLE IF EXISTS {self._storage.qualified(dataset.name)}")
