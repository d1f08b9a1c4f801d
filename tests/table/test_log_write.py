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


def test_type_widening_table_appends_through_the_log_writer(table_path):
    """A table with the ``typeWidening`` feature (delta-rs 1.6 refuses to commit to it):
    appends before and after ``ALTER COLUMN ... TYPE`` commit through deltaflow's log
    writer, with stats, and the widened schema records its type change (issue 27)."""
    from deltaflow.spark.catalog._alter import alter_from_catalog
    from deltaflow.table import _uri

    path = table_path()
    os.makedirs(path)
    uri = _uri.normalize_uri(path)

    def added(values: list[int], type_: pa.DataType) -> _commit.AddedFile:
        name = f"part-{len(os.listdir(path))}.parquet"
        pq.write_table(pa.table({"id": pa.array(values, type_)}), os.path.join(path, name))
        stats = {"numRecords": len(values), "minValues": {"id": min(values)}}
        return _commit.AddedFile(
            name, os.path.getsize(os.path.join(path, name)), {}, 0, json.dumps(stats)
        )

    def append(values: list[int], type_: pa.DataType) -> int | None:
        table = deltalake.DeltaTable(path)
        schema = json.loads(table.schema().to_json())
        return _commit.commit(
            _commit.CommitRequest(
                table_uri=uri,
                schema=schema,
                partition_columns=(),
                adds=[added(values, type_)],
                read_version=table.version(),
            )
        ).version

    ints = {
        "type": "struct",
        "fields": [{"name": "id", "type": "integer", "nullable": True, "metadata": {}}],
    }
    created = _commit.commit(
        _commit.CommitRequest(
            table_uri=uri,
            schema=ints,
            partition_columns=(),
            adds=[added([1, 2], pa.int32())],
            configuration={"delta.enableTypeWidening": "true"},
        )
    )
    assert created.version == 0
    protocol = deltalake.DeltaTable(path).protocol()
    assert protocol.min_reader_version == 3 and protocol.min_writer_version == 7
    assert "typeWidening" in protocol.reader_features
    assert "typeWidening" in protocol.writer_features
    assert append([3], pa.int32()) == 1
    widened = alter_from_catalog(
        {"uri": uri, "changes": [{"op": "updateColumnType", "field": ["id"], "type": "long"}]}
    )
    assert widened == {"committed": True, "version": 2}
    assert append([2**40], pa.int64()) == 3

    actions = []
    for version in range(4):
        with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as f:
            actions.append([json.loads(line) for line in f])
    for version in (1, 3):
        info = next(a["commitInfo"] for a in actions[version] if "commitInfo" in a)
        assert info["operation"] == "WRITE" and info["engineInfo"].startswith("deltaflow/")
        (add,) = [a["add"] for a in actions[version] if "add" in a]
        assert json.loads(add["stats"])["numRecords"] == 1
    field = deltalake.DeltaTable(path).schema().fields[0]
    assert field.type.type == "long"
    assert field.metadata["delta.typeChanges"] == [{"fromType": "integer", "toType": "long"}]
