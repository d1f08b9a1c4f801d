"""table/_log_write.py without Spark: delta-rs's refusal as a typed error, object stores
refused before anything is written, an identity table's append moving its mark."""

from __future__ import annotations

import json
import os

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import deltaflow
from deltaflow.table import _commit, _generated_log, _log_write
from deltaflow.table.errors import UnsupportedFeatureError

SCHEMA = {
    "type": "struct",
    "fields": [
        {
            "name": "id",
            "type": "long",
            "nullable": True,
            "metadata": {"delta.identity.start": 1, "delta.identity.step": 1},
        }
    ],
}


def _high_water_mark(path: str) -> int | None:
    log = os.path.join(path, "_delta_log")
    metadata = None
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
        with open(os.path.join(log, name)) as f:
            for line in f:
                metadata = json.loads(line).get("metaData", metadata)
    assert metadata is not None
    return json.loads(metadata["schemaString"])["fields"][0]["metadata"].get(
        "delta.identity.highWaterMark"
    )


def test_delta_rs_refusal_is_a_typed_error_not_a_conflict(table_path):
    path = table_path()
    schema = SCHEMA
    request = _commit.CommitRequest(
        table_uri=path, schema=schema, partition_columns=(), adds=(), operation="CREATE TABLE"
    )
    assert _log_write.commit_write(request).version == 0
    table = deltalake.DeltaTable(path)
    with pytest.raises(deltalake.exceptions.CommitFailedError) as refused:
        table.create_write_transaction([], "append", table.schema())
    error = _log_write.from_delta_rs(refused.value, path, "WRITE")
    assert isinstance(error, UnsupportedFeatureError) and error.feature == "identityColumns"
    assert not isinstance(error, deltaflow.ConcurrentWriteError)
    assert "AS IDENTITY" in str(error)  # says what works instead
    # A table with identity columns on a store without put-if-absent is refused before
    # anything is written.
    with pytest.raises(UnsupportedFeatureError) as remote:
        _log_write.commit_write(
            _commit.CommitRequest(
                table_uri="hdfs://nn/t", schema=schema, partition_columns=(), adds=()
            )
        )
    assert remote.value.feature == "identityColumns"
    assert "IDENTITY" in str(remote.value)
    assert _generated_log.keep_high_water_marks(schema, schema) == schema


def test_append_to_identity_table_moves_the_mark(table_path):
    """An append through _commit.commit takes the log writer; delta-rs reads it back."""
    path = table_path()
    schema = SCHEMA
    create = _commit.CommitRequest(table_uri=path, schema=schema, partition_columns=(), adds=())
    _commit.commit(create)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), os.path.join(path, "f.parquet"))
    stats = json.dumps({"numRecords": 2, "minValues": {"id": 1}, "maxValues": {"id": 2}})
    added = _commit.AddedFile(
        "f.parquet", os.path.getsize(os.path.join(path, "f.parquet")), {}, 0, stats
    )
    result = _commit.commit(
        _commit.CommitRequest(
            table_uri=path,
            schema=schema,
            partition_columns=(),
            adds=[added],
            read_version=0,
            identity_generated=("id",),
        )
    )
    assert result.version == 1 and _high_water_mark(path) == 2
    assert deltalake.DeltaTable(path).to_pyarrow_table().column("id").to_pylist() == [1, 2]
