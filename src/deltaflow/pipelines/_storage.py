"""Where a pipeline keeps things, and how its datasets become readable by name.

Under the pipeline's ``storage``: ``tables/<name>`` (each dataset's Delta table unless
it has a ``path``), ``checkpoints/<flow>`` (each streaming flow's checkpoint; a full
refresh deletes it), ``system/events`` (the event log). Tables are registered in the
catalog under the pipeline's database, so ``spark.read.table("silver")`` reads them.

``storage`` may be an object-store URI (``s3://bucket/pipelines/shop``): tables, the event
log and AUTO CDC state are Delta tables, which deltaflow reaches there. Checkpoints are
Spark's, written through Hadoop: when the session's Hadoop opens the store (S3A on the
class path; ``s3://`` is then written as ``s3a://`` unless Hadoop maps ``s3`` itself) they
stay under ``storage`` (``checkpoints/<flow>``), with the runner's small files beside them
(:mod:`._checkpoint_files`). Without S3A they live under ``pipelines.checkpointRoot``
(``<root>/<flow>``), a local, mounted or HDFS directory (optional for local storage).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines import _checkpoint_files
from deltaflow.pipelines._analysis import ResolvedDataset
from deltaflow.pipelines._declarations import Dataset, Flow
from deltaflow.pipelines._graph import Graph
from deltaflow.pipelines.errors import PipelineStorageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


CHECKPOINT_ROOT = "pipelines.checkpointRoot"


@dataclass(frozen=True)
class Storage:
    """A pipeline's storage root (a local directory or URI) and catalog database;
    ``checkpoints``: where flow checkpoints live when not under ``root``."""

    root: str
    database: str
    checkpoints: str | None = None

    @classmethod
    def of(
        cls,
        root: str,
        database: str,
        configuration: Mapping[str, str],
        hadoop_uri: Callable[[str], str | None] = lambda uri: None,
    ) -> Storage:
        """The storage of an update. An object-store root keeps the checkpoints under it
        when Spark's Hadoop opens that store (``hadoop_uri``: the URI Hadoop writes, e.g.
        ``s3://`` as ``s3a://``); otherwise they need a checkpoint root of their own."""
        from deltaflow.table import _uri

        checkpoints = configuration.get(CHECKPOINT_ROOT) or None
        if checkpoints is not None and "://" not in checkpoints:
            checkpoints = os.path.abspath(os.path.expanduser(checkpoints))
        if checkpoints is None and not _uri.is_local(_uri.normalize_uri(root)):
            on_hadoop = hadoop_uri(root.rstrip("/"))
            if on_hadoop is not None:
                return cls(root, database, f"{on_hadoop}/checkpoints")
            raise PipelineStorageError(
                f"The pipeline's storage {_uri.shown(root)} is on an object store, where its"
                " tables and event log can live but its streaming checkpoints cannot: Spark"
                " writes checkpoints through Hadoop, which cannot open that scheme here (the"
                " pyspark wheel has no S3A; a cluster with hadoop-aws on its class path"
                " keeps them under the storage). Set"
                f" {CHECKPOINT_ROOT} in the pipeline's configuration to a local, mounted or"
                " HDFS directory that outlives the update (one per pipeline), e.g."
                f" configuration: {{{CHECKPOINT_ROOT}: /var/lib/deltaflow/pipelines/NAME}}"
                " in spark-pipeline.yml.",
                storage=root,
                setting=CHECKPOINT_ROOT,
            )
        return cls(root, database, checkpoints)

    def table_path(self, dataset: Dataset) -> str:
        return dataset.path or os.path.join(self.root, "tables", dataset.name.lower())

    def checkpoint(self, flow_name: str) -> str:
        if self.checkpoints is not None:
            return os.path.join(self.checkpoints, flow_name.lower())
        return os.path.join(self.root, "checkpoints", flow_name.lower())

    @property
    def event_log(self) -> str:
        return os.path.join(self.root, "system", "events")

    def cdc_state(self, flow_name: str) -> str:
        return os.path.join(self.root, "system", "cdc", flow_name.lower())

    def reset_checkpoint(self, flow_name: str) -> None:
        """A full refresh of the flow: its checkpoint and AUTO CDC state are deleted."""
        # On an object store too: a state left behind would keep its sequences and
        # tombstones, and the replayed events would all be dropped as stale.
        _checkpoint_files.remove_tree(self.checkpoint(flow_name))
        _checkpoint_files.remove_tree(self.cdc_state(flow_name))

    def qualified(self, name: str) -> str:
        return f"`{self.database}`.`{name}`"


class CatalogPublisher:
    """Publishes resolved datasets: a table's Delta table is created (empty, with the
    resolved schema, partitioning, properties and comment) when it does not exist yet
    and registered in the catalog; a temporary view becomes a Spark temporary view.

    With ``graph``: a streaming table fed only by append flows is created with its change
    data feed on (unless its properties say otherwise), so materialized views reading it
    can refresh incrementally. Appends cost nothing more (their change rows are the added
    files); tables written by MERGE (AUTO CDC targets, materialized views) would write
    change files on every commit, so they keep the feed off unless asked.
    """

    def __init__(
        self,
        spark: SparkSession,
        storage: Storage,
        graph: Graph | None = None,
        *,
        background: bool = False,
    ) -> None:
        self._spark = spark
        self._storage = storage
        self._graph = graph
        # background: a new table's creation (its first commit and catalog entry, a
        # Spark SQL statement: tens of ms, seconds on a loaded machine) runs in a thread
        # while the graph's other flows are analysed and the first flows start; whoever
        # needs the table waits for it (:meth:`wait`).
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline-publish")
            if background
            else None
        )
        self._pending: dict[str, Future[object]] = {}

    def publish(self, resolved: ResolvedDataset, views: Mapping[str, DataFrame]) -> None:
        dataset = resolved.dataset
        if resolved.kind == "temporary_view":
            views[dataset.name].createOrReplaceTempView(dataset.name)
            return
        from pyspark.sql.types import StructType

        from deltaflow.spark.catalog._create import catalog_location
        from deltaflow.spark.dml._delta_table import DeltaTable
        from deltaflow.spark.write._plan import all_nullable
        from deltaflow.table import _uri
        from deltaflow.table._snapshot import table_exists

        path = self._storage.table_path(dataset)
        uri = _uri.normalize_uri(path)
        if table_exists(uri):
            # Left by an earlier update: its log is the truth; (re)register the name only,
            # and not even that when the catalog already has it there (the steady state:
            # a catalog look-up instead of a SQL statement's parse, analysis and command).
            qualified = self._storage.qualified(dataset.name)
            if catalog_location(self._spark, qualified) == uri:
                return
            location = path.replace("'", "\\'")
            self._spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self._storage.qualified(dataset.name)}"
                f" USING delta LOCATION '{location}'"
            )
            return
        schema = json.loads(resolved.schema_json)
        if resolved.kind == "materialized_view":
            # Every refresh writes it so (as delta-spark's writes do): created the same.
            schema = all_nullable(schema)
        builder = (
            DeltaTable.createIfNotExists(self._spark)
            .tableName(f"{self._storage.database}.{dataset.name}")
            .location(path)
            .addColumns(StructType.fromJson(schema))
        )
        if dataset.partition_cols:
            builder = builder.partitionedBy(*dataset.partition_cols)
        if dataset.cluster_by:
            builder = builder.clusterBy(*dataset.cluster_by)
        for key, value in self._properties(resolved).items():
            builder = builder.property(key, value)
        if dataset.comment:
            builder = builder.comment(dataset.comment)
        # The builder checked the declaration already (properties, columns): what is left
        # can only fail on the storage or the catalog.
        if self._pool is None:
            _create(builder, dataset.name, path)
        else:
            self._pending[dataset.name.lower()] = self._pool.submit(
                _create, builder, dataset.name, path
            )

    def created_in_background(self, name: str) -> bool:
        """True when dataset ``name``'s table was created (or is being created) in the
        background: a read of it by name may have come too early."""
        return name.lower() in self._pending

    def wait(self, name: str) -> None:
        """Return once dataset ``name``'s table exists and is in the catalog; its creation's
        error if it failed. Datasets published synchronously (or unknown) return at once."""
        future = self._pending.get(name.lower())
        if future is not None:
            future.result()

    def settle(self) -> bool:
        """Wait for every creation running in the background (their errors are left for
        :meth:`wait`); True when there were any."""
        futures = list(self._pending.values())
        if futures:
            wait(futures)
        return bool(futures)

    def locations(self, datasets: Iterable[Dataset]) -> dict[str, str]:
        """Normalized table location -> dataset name (tables only), for reads by path."""
        from deltaflow.table import _uri

        return {
            _uri.normalize_uri(self._storage.table_path(d)): d.name
            for d in datasets
            if d.kind != "temporary_view"
        }

    def wait_all(self) -> None:
        """Every table created (the first creation error raised)."""
        for future in list(self._pending.values()):
            future.result()

    def close(self) -> None:
        """Wait for creations still running (errors are for :meth:`wait`), stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def unpublish_private(self, datasets: Iterable[Dataset]) -> None:
        """Private datasets leave the catalog when an update ends; their Delta tables
        stay (the entries are external: dropping one deletes no file)."""
        for dataset in datasets:
            if dataset.temporary and dataset.kind != "temporary_view":
                self._spark.sql(f"DROP TABLE IF EXISTS {self._storage.qualified(dataset.name)}")

    def _properties(self, resolved: ResolvedDataset) -> dict[str, str]:
        properties = dict(resolved.dataset.table_properties)
        if self._graph is None or resolved.kind != "streaming_table":
            return properties
        if any(k.lower() == CHANGE_DATA_FEED.lower() for k in properties):
            return properties
        into = self._graph.flows_into(resolved.dataset.name)
        if into and all(isinstance(f, Flow) for f in into):
            properties[CHANGE_DATA_FEED] = "true"
        return properties


CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def _create(builder: Any, name: str, path: str) -> None:
    """Run the table's builder; a file-system refusal as a typed error naming the dataset."""
    try:
        builder.execute()
    except OSError as exc:
        raise PipelineStorageError(
            f"dataset {name!r}: its Delta table could not be created at {path}:"
            f" {exc.strerror or exc}. Point `path=` at a directory the pipeline can write"
            " (or drop it to keep the table under the pipeline's storage).",
            storage=path,
            setting="path",
        ) from exc
