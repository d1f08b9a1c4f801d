"""``cloudFiles`` over a landing zone on S3 (SeaweedFS, see ``tests/_object_store.py``) into
a Delta table on S3: files uploaded with pyarrow's S3 client, discovered by listing the
prefix, each read exactly once across restarts and a replayed batch; checkpoint and schema
location on local disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from deltaflow.errors import InvalidOptionError, unpack_remote_error
from deltaflow.ingest import NewColumnsError
from tests import _object_store
from tests.spark._checkpoints import forget_batch

pytestmark = pytest.mark.slow


class S3Zone:
    """A landing prefix and a target table on S3; schemas and checkpoint on local disk."""

    def __init__(self, store: Any, root: Path) -> None:
        self.store = store
        self.landing = store.uri("landing")
        self.target = store.uri("bronze")
        self.schemas = str(root / "schemas")
        self.checkpoint = str(root / "checkpoint")
        self.fs = pafs.S3FileSystem(
            access_key=_object_store.ACCESS_KEY,
            secret_key=_object_store.SECRET_KEY,
            endpoint_override=store.endpoint,
            region=_object_store.REGION,
            scheme="http",
        )

    def upload(self, name: str, records: list[dict[str, Any]]) -> str:
        """One PUT: the object is visible whole once the upload completes."""
        key = f"{self.landing.removeprefix('s3://')}/{name}"
        with self.fs.open_output_stream(key) as stream:
            stream.write("".join(json.dumps(r) + "\n" for r in records).encode())
        return f"{self.landing}/{name}"

    def run(self, spark: Any, **options: str) -> Any:
        query = (
            spark.readStream.format("cloudFiles")
            .option("cloudFiles.format", "json")
            .option("cloudFiles.schemaLocation", self.schemas)
            .options(**options)
            .load(self.landing)
            .writeStream.format("delta")
            .option("checkpointLocation", self.checkpoint)
            .option("mergeSchema", "true")
            .trigger(availableNow=True)
            .start(self.target)
        )
        assert query.awaitTermination(300)
        if query.exception() is not None:
            raise query.exception()
        return query

    def table(self) -> DeltaTable:
        return DeltaTable(self.target, storage_options=self.store.storage_options)

    def ids(self) -> list[int]:
        return sorted(int(r["id"]) for r in self.table().to_pyarrow_table().to_pylist())


@pytest.fixture
def zone(spark: Any, object_store: Any, tmp_path: Path) -> S3Zone:
    return S3Zone(object_store, tmp_path)


def read_rows(query: Any) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def test_files_under_an_s3_prefix_land_once_across_restarts_and_a_replay(spark, zone) -> None:
    zone.upload("a.json", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    zone.upload("2026/11/26/b.json", [{"id": 3, "v": "c"}])  # nested "directories"
    zone.upload("_SUCCESS", [])  # hidden and temporary names are not files to read
    zone.upload(".in-flight.json", [{"id": 90}])
    zone.upload("upload.json.tmp", [{"id": 91}])
    first = zone.run(spark)
    assert zone.ids() == [1, 2, 3]
    assert read_rows(first) == 3
    paths = {r["_rescued_data"] for r in zone.table().to_pyarrow_table().to_pylist()}
    assert paths == {None}

    zone.upload("c.json", [{"id": 4, "v": "d"}])
    second = zone.run(spark)
    assert read_rows(second) == 1  # only the new file was read
    assert zone.ids() == [1, 2, 3, 4]
    version = zone.table().version()

    # The process "died" after the sink's commit and before Spark's: the restart replays
    # the batch, and the sink finds its app transaction in the S3 table's log.
    forget_batch(zone.checkpoint)
    zone.run(spark)
    assert zone.ids() == [1, 2, 3, 4]
    assert zone.table().version() == version
    zone.run(spark)  # nothing new: nothing read, nothing committed
    assert zone.table().version() == version


def test_new_columns_on_s3_stop_the_stream_once_then_land(spark, zone) -> None:
    zone.upload("a.json", [{"id": 1, "a": "x"}])
    zone.run(spark)
    new_file = zone.upload("b.json", [{"id": 2, "a": "y", "b": 7}])
    with pytest.raises(Exception) as caught:
        zone.run(spark)
    error = unpack_remote_error(caught.value)
    assert isinstance(error, NewColumnsError)
    assert (error.columns, error.file_path) == (("b",), new_file)
    assert zone.ids() == [1]  # the failed batch committed nothing

    zone.run(spark)  # the restart reads the batch again with the new schema
    rows = sorted(zone.table().to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["a"], r["b"]) for r in rows] == [("1", "x", None), ("2", "y", "7")]
    assert "b" in zone.table().schema().to_arrow().names


def test_a_schema_location_on_s3_is_refused_naming_the_option(spark, zone) -> None:
    with pytest.raises(Exception) as caught:
        zone.run(spark, **{"cloudFiles.schemaLocation": zone.store.uri("schemas")})
    error = unpack_remote_error(caught.value)
    assert isinstance(error, InvalidOptionError)
    assert error.option == "cloudFiles.schemaLocation"
    assert "local" in str(error)
