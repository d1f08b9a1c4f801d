"""The ``cloudFiles`` source: Auto Loader's landing-zone ingestion on Spark's Python
Data Source API.

``spark.readStream.format("cloudFiles").option("cloudFiles.format", "json")
.option("cloudFiles.schemaLocation", dir).load(landing)`` streams every file that
appears in ``landing`` exactly once (see :mod:`deltaflow.ingest.cloudfiles._discovery` for which
files count and how they are tracked).

Offsets are ``{"sourceVersion": 1, "seq": n}``: every discovered file has a sequence
number, and offset ``n`` means "every file up to ``n`` was read". Discovery gives
numbers at listing time and never changes them, so ``partitions(start, end)`` is a pure
function of the two offsets and a replayed batch reads the same files.

Where things run: ``schema()`` (inference, recording ``_schemas/0``) and the reader's
offset methods run in Python workers on the driver; ``read`` runs in executors and
uses only what its :class:`LandingPartition` carries. Delivery: with a transactional
sink (``writeStream.format("delta")``), each file's records land exactly once across
crashes and restarts; a file's records are never split across batches.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from deltaflow.errors import DeltaflowError, InvalidOptionError, RemoteDeltaflowError, carry_errors
from deltaflow.ingest.cloudfiles import _schemas
from deltaflow.ingest.cloudfiles._discovery import FileStore, LandingFile
from deltaflow.ingest.cloudfiles._options import (
    METADATA_COLUMN,
    RESCUED_DATA_COLUMN,
    TEXT_VALUE_COLUMN,
    CloudFilesOptions,
    parse_options,
)
from deltaflow.ingest.cloudfiles._records import RecordLayout, read_landing_file
from deltaflow.ingest.cloudfiles.errors import SchemaInferenceError
from deltaflow.spark._compat import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
    legacy_latest_offset,
)

log = logging.getLogger("deltaflow.ingest")

SOURCE_VERSION = 1


class CloudFilesDataSource(DataSource):
    """``format("cloudFiles")``: streaming reads of a landing zone."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._inferred = False  # schema() ran: no user schema

    @classmethod
    def name(cls) -> str:
        return "cloudFiles"

    @carry_errors
    def schema(self) -> StructType:
        options = parse_options(dict(self.options))
        self._inferred = True
        return _schemas.output_schema(stream_data_schema(options), options)

    @carry_errors
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        raw = dict(self.options)
        options = parse_options(raw)
        if not self._inferred:
            options = _for_user_schema(options, raw, schema)
        return CloudFilesStreamReader(options, schema)


def stream_data_schema(options: CloudFilesOptions) -> StructType:
    """The data columns: the newest recorded schema version, else inferred from a sample
    of the landing zone and recorded as version 0. Hints apply either way."""
    if options.format == "text":
        # As spark.read.text: one string column; nothing to infer, nothing evolves.
        return StructType([StructField(TEXT_VALUE_COLUMN, StringType(), True)])
    hints = _schemas.parse_hints(options.schema_hints)
    latest = _schemas.latest_schema(options.schema_location)
    if latest is None:
        sample = FileStore(options).sample(options.sample_files)
        if not sample and not hints:
            raise SchemaInferenceError(
                f"Cannot infer a schema: the landing zone {options.path} has no files yet and"
                f" no schema is recorded under {options.schema_location}. Give the stream a"
                " schema with .schema(...), or cloudFiles.schemaHints, or start it once files"
                " have arrived.",
                source_path=options.path,
                schema_location=options.schema_location,
            )
        inferred = _schemas.apply_hints(_schemas.infer_data_schema(sample, options), hints)
        if not _schemas.record_schema(options.schema_location, 0, inferred):
            latest = _schemas.latest_schema(options.schema_location)
        else:
            log.info("inferred schema of %s from %d files", options.path, len(sample))
            return inferred
    assert latest is not None
    return _schemas.apply_hints(latest[1], hints)


def _for_user_schema(
    options: CloudFilesOptions, raw: dict[str, str], schema: StructType
) -> CloudFilesOptions:
    # As Auto Loader: with a user schema the evolution mode defaults to "none", and the
    # rescued-data column is filled only if the schema has it.
    lowered = {k.lower() for k in raw}
    mode = options.evolution_mode if "cloudfiles.schemaevolutionmode" in lowered else "none"
    if mode == "addNewColumns":
        raise InvalidOptionError(
            "cloudFiles.schemaEvolutionMode addNewColumns needs an inferred schema; with"
            " .schema(...) use rescue, failOnNewColumns or none, or drop .schema(...).",
            option="cloudFiles.schemaEvolutionMode",
            valid=("rescue", "failOnNewColumns", "none"),
        )
    rescued = raw.get("rescuedDataColumn") or (
        RESCUED_DATA_COLUMN if RESCUED_DATA_COLUMN in schema.names else None
    )
    return dataclasses.replace(options, evolution_mode=mode, rescued_data_column=rescued)


class LandingPartition(InputPartition):
    """The files one Spark task of a micro-batch reads, and how to shape them."""

    def __init__(self, index: int, files: list[LandingFile], layout: RecordLayout) -> None:
        super().__init__(index)
        self.index = index
        self.files = files
        self.layout = layout


class CloudFilesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of newly discovered landing files. Construction does no I/O."""

    def __init__(self, options: CloudFilesOptions, schema: StructType) -> None:
        self.options = options
        self.schema_json = schema.jsonValue()
        skip = {
            options.rescued_data_column,
            METADATA_COLUMN if options.include_file_metadata else None,
        }
        self.data_columns = tuple(n for n in schema.names if n not in skip)
        self._cap: int | None = None  # availableNow: the last seq to read

    @property
    def store(self) -> FileStore:
        return FileStore(self.options)

    def initialOffset(self) -> dict[str, Any]:
        return {"sourceVersion": SOURCE_VERSION, "seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.options.max_files_per_trigger)

    @carry_errors
    def prepareForTriggerAvailableNow(self) -> None:
        self._cap = self._discover()
        log.info("availableNow over %s: reading up to file %d", self.options.path, self._cap)

    @legacy_latest_offset
    @carry_errors
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = int(start["seq"])
        if self._cap is None:
            self._discover()
        if isinstance(limit, ReadAllAvailable):
            end = self.store.admit(begin, self._cap, None, None)
        else:
            max_files = self.options.max_files_per_trigger
            if isinstance(limit, ReadMaxFiles):
                max_files = min(max_files, int(limit.max_files))
            end = self.store.admit(begin, self._cap, max_files, self.options.max_bytes_per_trigger)
        return {"sourceVersion": SOURCE_VERSION, "seq": end}

    @carry_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        files = self.store.files_between(int(start["seq"]), int(end["seq"]))
        layout = RecordLayout(self.options, self.schema_json, self.data_columns)
        groups = _spread(files, os.cpu_count() or 2)
        log.info(
            "cloudFiles batch over %s: files %s..%s, %d files, %d bytes",
            self.options.path,
            start["seq"],
            end["seq"],
            len(files),
            sum(f.size for f in files),
        )
        return [LandingPartition(i, group, layout) for i, group in enumerate(groups)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LandingPartition)
        try:
            for file in partition.files:
                yield from read_landing_file(file, partition.layout)
        except DeltaflowError as exc:
            raise RemoteDeltaflowError(exc) from exc

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the store's rows are immutable and Spark's checkpoint holds
        the offset; the rows of read files stay as the record that they were read."""

    def _discover(self) -> int:
        store = self.store
        latest = store.discover()
        checked, new, seconds = store.last_listing
        log.info(
            "listed %s in %.3f s: %d files checked, %d new, latest file %d",
            self.options.path,
            seconds,
            checked,
            new,
            latest,
        )
        return latest


def _spread(files: list[LandingFile], tasks: int) -> list[list[LandingFile]]:
    """Files into at most ``tasks`` groups of similar byte size (largest first)."""
    if not files:
        return []
    groups: list[list[LandingFile]] = [[] for _ in range(min(tasks, len(files)))]
    sizes = [0] * len(groups)
    for file in sorted(files, key=lambda f: -f.size):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(file)
        sizes[smallest] += file.size + 4096  # an open costs about as much as 4 KiB
    return groups
