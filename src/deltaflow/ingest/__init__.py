"""Ingestion without a message bus: the Auto Loader-compatible ``cloudFiles`` source.

``deltaflow.session()`` / ``register()`` register the source; use it as
``spark.readStream.format("cloudFiles").option("cloudFiles.format", "json")...``.
Importing this package starts nothing and touches no files.

Auto Loader options (supported / differs / not yet):

=================================  ==========================================================
``cloudFiles.format``              json (NDJSON), csv (header), parquet. Not yet: text,
                                   avro, orc, binaryFile, multi-line JSON, compressed files.
``cloudFiles.schemaLocation``      Required, even with ``.schema(...)`` (differs): it also
                                   holds the seen-file store (``_cloudfiles/files.db``), which
                                   Auto Loader keeps in the checkpoint. Local or mounted only
                                   (an object-store URI: InvalidOptionError); the landing
                                   zone may be on ``s3://``.
                                   Versions are ``_schemas/0``, ``_schemas/1``, ... (our JSON).
``cloudFiles.inferColumnTypes``    Supported (default false for json/csv: all strings).
                                   Typed inference: boolean, bigint, double, string; JSON
                                   objects / arrays as struct / array. No date/time inference.
``cloudFiles.schemaHints``         Top-level columns with simple types and DECIMAL(p,s).
                                   Not yet: nested paths, complex types.
``cloudFiles.schemaEvolutionMode`` addNewColumns (default without a schema), rescue,
                                   failOnNewColumns, none (default with a schema). As Auto
                                   Loader, addNewColumns with ``.schema(...)`` is refused.
``cloudFiles.maxFilesPerTrigger``  Supported (default 1000).
``cloudFiles.maxBytesPerTrigger``  Supported (soft: a batch always takes one file).
``cloudFiles.includeExistingFiles`` Supported (default true; decided at the first listing).
``cloudFiles.allowOverwrites``     Supported (a new mtime makes the path a new file).
``pathGlobFilter``                 Supported (matched on the file name).
``rescuedDataColumn``              Supported. Rescued JSON: ``{col: original, ...,
                                   "_file_path": uri}``; unparseable lines as
                                   ``{"_corrupt_record": line, "_file_path": uri}``.
``_metadata``                      Differs: Spark's Python sources cannot offer hidden
                                   metadata columns, so ``cloudFiles.includeFileMetadata=true``
                                   adds a ``_metadata`` struct column (file_path, file_name,
                                   file_size, file_modification_time).
deltaflow-only                     ``cloudFiles.recheckWindowSeconds`` (3600),
                                   ``cloudFiles.sampleFiles`` (50 files for inference).
Not yet                            file notification mode (``useNotifications``),
                                   ``maxFileAge``, ``cleanSource``, ``partitionColumns``,
                                   ``validateOptions``, ``backfillInterval``, case-sensitive
                                   rescue of same-name-different-case columns.
=================================  ==========================================================

With a user schema, bad values are rescued only if the schema has ``_rescued_data
STRING``; otherwise the stream fails with :class:`MalformedRecordError` rather than
dropping them. Deleting the checkpoint but keeping the schemaLocation re-reads every
recorded file (new query, offset 0), as Auto Loader does with a new checkpoint.
"""

from __future__ import annotations

from deltaflow.ingest.cloudfiles.errors import (
    CloudFilesError,
    MalformedRecordError,
    NewColumnsError,
    SchemaInferenceError,
)

__all__ = [
    "CloudFilesError",
    "MalformedRecordError",
    "NewColumnsError",
    "SchemaInferenceError",
]
