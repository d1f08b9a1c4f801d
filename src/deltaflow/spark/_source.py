"""The ``delta`` data source: what Spark calls for ``format("delta")``."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from deltaflow.spark._options import parse_read_options
from deltaflow.spark.read._reader import DeltaBatchReader
from deltaflow.table import _schema, _uri
from deltaflow.table._snapshot import Snapshot, load_snapshot


class DeltaDataSource(DataSource):
    """Delta Lake tables for ``spark.read`` / ``df.write`` ``.format("delta")``.

    The snapshot is resolved once, in ``schema()``, and pinned: the pickled
    source carries it to planning and to every task, so one query reads one
    version even while writers commit.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._snapshot: Snapshot | None = None

    @classmethod
    def name(cls) -> str:
        return "deltaflow_python"

    def _load(self) -> Snapshot:
        if self._snapshot is None:
            options = dict(self.options)
            # Only what picks the snapshot: Spark builds this table for a stream sink too
            # (object stores), with the stream's and the write's options; reader() and
            # streamReader() check the read options strictly.
            read = parse_read_options(
                {k: v for k, v in options.items() if k.lower() in _SNAPSHOT_OPTIONS}
            )
            self._snapshot = load_snapshot(
                _uri.normalize_uri(read.path),
                version=read.version_as_of,
                timestamp=read.timestamp_as_of,
            )
        return self._snapshot

    def schema(self) -> StructType:
        snapshot = self._load()
        schema = StructType.fromJson(_schema.logical_schema(snapshot.schema))
        if self._reads_change_feed():
            from deltaflow.spark.read._cdf import with_cdf_columns

            schema = with_cdf_columns(schema)
        return schema

    def _reads_change_feed(self) -> bool:
        return any(
            k.lower() in ("readchangefeed", "readchangedata") and str(v).strip().lower() == "true"
            for k, v in dict(self.options).items()
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        snapshot = self._load()
        options = dict(self.options)
        options.setdefault("path", snapshot.uri)
        read = parse_read_options(options)
        if read.read_change_feed:
            from deltaflow.spark.read._cdf import DeltaChangeFeedReader

            return DeltaChangeFeedReader(snapshot, schema, read)
        return DeltaBatchReader(snapshot, schema, read.file_skipping)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        # Imported here: the writer modules pull in pyarrow.dataset and pandas (~1 s of
        # start-up in every Python worker Spark starts for a read or a stream).
        from deltaflow.spark._options import SAVE_MODE_OPTION, parse_write_options
        from deltaflow.spark.write._plan import plan_write
        from deltaflow.spark.write._writer import DeltaBatchWriter

        raw = _without(self.options, SAVE_MODE_OPTION)
        options = parse_write_options(raw)
        mode = self.options.get(SAVE_MODE_OPTION) or ("overwrite" if overwrite else "append")
        plan = plan_write(_uri.normalize_uri(options.path), schema.jsonValue(), mode, options)
        return DeltaBatchWriter(plan, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from deltaflow.spark._options import parse_stream_options
        from deltaflow.spark.stream._reader import DeltaStreamReader

        snapshot = self._load()
        options = parse_stream_options({**dict(self.options), "path": snapshot.uri})
        return DeltaStreamReader(snapshot, schema, options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from deltaflow.spark.stream._writer import stream_writer

        return stream_writer(self.options, schema, overwrite)


_SNAPSHOT_OPTIONS = frozenset({"path", "versionasof", "timestampasof"})


def _without(options: Any, key: str) -> dict[str, str]:
    return {k: v for k, v in dict(options).items() if k.lower() != key.lower()}
