"""The cloudFiles landing-zone source: real files in temp dirs, streams driven with
availableNow into a Delta sink, results checked with delta-rs against expectations
computed in plain Python."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from deltaflow.errors import unpack_remote_error
from deltaflow.ingest import NewColumnsError
from deltaflow.ingest.cloudfiles._discovery import FileStore, is_visible
from deltaflow.ingest.cloudfiles._options import parse_options
from deltaflow.ingest.cloudfiles._schemas import apply_hints, parse_hints

# ---- helpers ---------------------------------------------------------------------------


class Zone:
    """A landing zone, its schema location, a checkpoint and a target table."""

    def __init__(self, root: Path) -> None:
        self.landing = root / "landing"
        self.landing.mkdir()
        self.schemas = str(root / "schemas")
        self.checkpoint = str(root / "checkpoint")
        self.target = str(root / "target")
        self.count = 0

    def drop(self, data: bytes | str, name: str | None = None) -> Path:
        """Write a file aside and rename it into the landing zone (the documented rule)."""
        self.count += 1
        name = name or f"f{self.count:05d}.json"
        staging = self.landing / f".staging-{name}"
        staging.write_bytes(data.encode() if isinstance(data, str) else data)
        final = self.landing / name
        os.replace(staging, final)
        return final

    def drop_json(self, records: list[dict[str, Any]], name: str | None = None) -> Path:
        return self.drop("".join(json.dumps(r) + "\n" for r in records), name)

    def stream(self, spark: Any, fmt: str = "json", schema: Any = None, **options: str) -> Any:
        reader = spark.readStream.format("cloudFiles").option("cloudFiles.format", fmt)
        reader = reader.option("cloudFiles.schemaLocation", self.schemas)
        if schema is not None:
            reader = reader.schema(schema)
        return reader.options(**options).load(str(self.landing))

    def run(self, spark: Any, fmt: str = "json", schema: Any = None, **options: str) -> Any:
        df = self.stream(spark, fmt, schema, **options)
        query = (
            df.writeStream.format("delta")
            .option("checkpointLocation", self.checkpoint)
            .option("mergeSchema", "true")  # as with Auto Loader: new columns reach the table
            .trigger(availableNow=True)
            .start(self.target)
        )
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()
        return query

    def rows(self) -> list[dict[str, Any]]:
        if not os.path.exists(os.path.join(self.target, "_delta_log")):
            return []
        return DeltaTable(self.target).to_pyarrow_table().to_pylist()


def batch_sizes(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: str(r.get("id")))


@pytest.fixture
def zone(tmp_path: Path) -> Zone:
    return Zone(tmp_path)


# ---- pure parts --------------------------------------------------------------------------


def test_hidden_and_temporary_names_are_not_visible() -> None:
    assert is_visible("a.json", None)
    assert is_visible("2024/01/a.json", "*.json")
    for name in (".a.json", "_SUCCESS", "a.json.tmp", "a.crc", "_temporary/a.json", "x/.b/a"):
        assert not is_visible(name, None), name
    assert not is_visible("a.csv", "*.json")


def test_schema_hints_replace_and_add_columns() -> None:
    from pyspark.sql.types import (
        DateType,
        DecimalType,
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    base = StructType([StructField("a", StringType()), StructField("b", StringType())])
    hinted = apply_hints(base, parse_hints("a INT, c DECIMAL(10, 2), b date"))
    assert [(f.name, f.dataType) for f in hinted.fields] == [
        ("a", IntegerType()),
        ("b", DateType()),
        ("c", DecimalType(10, 2)),
    ]


def test_errors_pickle_and_cross_the_wire_typed() -> None:
    import pickle

    from deltaflow.errors import from_wire, to_wire

    error = NewColumnsError(
        "new columns",
        columns=("b",),
        file_path="file:///x.json",
        schema_location="file:///s",
        schema_version=1,
        mode="addNewColumns",
    )
    for copy in (pickle.loads(pickle.dumps(error)), from_wire(to_wire(error))):
        assert isinstance(copy, NewColumnsError)
        assert (copy.columns, copy.schema_version, copy.mode) == (("b",), 1, "addNewColumns")


def test_lines_end_only_at_newlines_and_csv_keeps_quoted_newlines() -> None:
    import io

    from deltaflow.ingest.cloudfiles import _records

    text = '{"a": "x\u2028y"}\r\n{"a": 2}\nnot json\n{"a": "' + "z" * 300_000 + '"}'
    handle = io.BytesIO(text.encode())
    records = list(_records._json_lines(_records.read_lines(handle)))
    assert [r for r, _ in records] == [{"a": "x\u2028y"}, {"a": 2}, None, {"a": "z" * 300_000}]
    assert records[2][1] == "not json"

    csv_text = 'id,note\n1,"two\nlines"\n2,' + "w" * 200_000 + "\n3,too,many\n"
    rows = list(_records._csv_lines(_records.read_lines(io.BytesIO(csv_text.encode())), True))
    assert rows == [
        ({"id": "1", "note": "two\nlines"}, ""),
        ({"id": "2", "note": "w" * 200_000}, ""),
        (None, "3,too,many"),
    ]


FAST_AND_SLOW_CASES = {
    "clean": '{"id": 1, "name": "a", "score": 1.5, "ok": true}\n\n  {"id": 2}  \n',
    "int_in_double_and_unicode": '{"id": 3, "score": 2, "name": "\u00e9\u2028x"}\n',
    "string_for_long": '{"id": "4"}\n{"id": 5}\n',
    "float_for_long": '{"id": 6.0}\n',
    "overflow_int": '{"id": 7, "small": 300}\n',
    "object_for_string": '{"id": 8, "name": {"x": 1}}\n',
    "bare_null_line": '{"id": 9}\nnull\n',
    "two_objects_one_line": '{"id": 10} {"id": 11}\n',
    "case_mismatch": '{"ID": 12}\n',
    "unknown_key": '{"id": 13, "extra": 1}\n',
    "truncated": '{"id": 14}\n{"id": ',
    "invalid_utf8": b'{"id": 15, "name": "\xff\xfe"}\n',
    "timestamps_and_dates": '{"id": 16, "ts": "2025-06-01T00:00:00.000202Z", "day": "2025-06-01"}\n'
    '{"id": 17, "ts": "2025-06-01 01:02:03", "day": null}\n'
    '{"id": 18, "ts": "2024-02-29T23:59:59.5+05:30"}\n',
    "impossible_date": '{"id": 19, "day": "2023-02-29"}\n',
    "impossible_time": '{"id": 20, "ts": "2025-06-01T23:59:60"}\n',
    "year_zero": '{"id": 21, "day": "0000-01-01"}\n',
    "timestamp_shapes_for_python": '{"id": 22, "ts": " 2025-06-01T00:00:00"}\n'
    '{"id": 23, "ts": "2025-06-01T00:00:00.1234567"}\n{"id": 24, "ts": "2025-06-01"}\n',
    "number_for_timestamp": '{"id": 25, "ts": 1700000000}\n',
}


@pytest.mark.parametrize("case", sorted(FAST_AND_SLOW_CASES))
def test_json_fast_path_gives_the_same_rows_as_the_row_by_row_path(
    spark, case, tmp_path, monkeypatch
):
    from pyspark.sql.types import StructType

    from deltaflow.ingest.cloudfiles import _records
    from deltaflow.ingest.cloudfiles._discovery import LandingFile

    data = FAST_AND_SLOW_CASES[case]
    path = tmp_path / "f.json"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    options = parse_options(
        {
            "path": str(tmp_path),
            "cloudFiles.format": "json",
            "cloudFiles.schemaLocation": str(tmp_path / "schemas"),
        }
    )
    schema = StructType.fromDDL(
        "id BIGINT, name STRING, score DOUBLE, ok BOOLEAN, small TINYINT, ts TIMESTAMP,"
        " day DATE, _rescued_data STRING"
    )
    layout = _records.RecordLayout(options, schema.jsonValue(), tuple(schema.names[:-1]))
    file = LandingFile(0, f"file://{path}", path.stat().st_size, path.stat().st_mtime_ns)

    def rows() -> list[dict[str, Any]]:
        try:
            batches = list(_records.read_landing_file(file, layout))
        except Exception as exc:  # new columns stop the stream, on both paths alike
            return [{"error": type(exc).__name__}]
        return pa.Table.from_batches(batches).to_pylist() if batches else []

    fast = rows()
    parsed_whole = _records._json_table(file, layout, schema) is not None
    # overflow_int parses, then falls back when 300 does not cast to TINYINT.
    fast_cases = ("clean", "int_in_double_and_unicode", "overflow_int", "timestamps_and_dates")
    assert parsed_whole == (case in fast_cases)
    monkeypatch.setattr(_records, "FAST_JSON_MAX_BYTES", 0)  # row by row
    assert fast == rows()


# ---- streams -----------------------------------------------------------------------------


def test_json_exactly_once_across_restarts_ignoring_hidden_and_empty_files(spark, zone) -> None:
    zone.drop_json([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    zone.drop_json([{"id": 3, "v": "c"}])
    zone.drop("")  # an empty file: no rows, no error
    (zone.landing / ".in-flight.json").write_text(json.dumps({"id": 90}) + "\n")
    (zone.landing / "upload.json.tmp").write_text(json.dumps({"id": 91}) + "\n")
    (zone.landing / "_SUCCESS").write_text("")
    (zone.landing / "_temporary").mkdir()
    (zone.landing / "_temporary" / "x.json").write_text(json.dumps({"id": 92}) + "\n")
    zone.run(spark)
    assert by_id(zone.rows()) == [
        {"id": str(i), "v": v, "_rescued_data": None} for i, v in [(1, "a"), (2, "b"), (3, "c")]
    ]
    assert sorted(os.listdir(os.path.join(zone.schemas, "_schemas"))) == ["0"]

    zone.drop_json([{"id": 4, "v": "d"}])
    query = zone.run(spark)
    assert sum(batch_sizes(query)) == 1  # only the new file was read
    assert sorted(int(r["id"]) for r in zone.rows()) == [1, 2, 3, 4]


def test_bad_data_lands_in_rescued_data_never_dropped(spark, zone) -> None:
    huge = "x" * 3_000_000
    good = zone.drop_json([{"id": 1, "n": 5, "d": "2024-01-02"}, {"id": 2, "n": 6, "d": None}])
    mixed = zone.drop(
        "\n".join(
            [
                json.dumps({"id": 3, "n": "seven", "d": "2024-02-30"}),  # misfits
                '{"id": 4, "n": ',  # malformed line
                "[1, 2]",  # not an object
                json.dumps({"id": 5, "n": 2**40, "d": "2024-03-01", "big": huge}),
            ]
        )
        + "\n"
    )
    garbage = zone.drop(bytes(range(256)) * 40, name="garbage.json")
    zone.run(
        spark,
        **{
            "cloudFiles.schemaHints": "n INT, d DATE, big STRING",
            "cloudFiles.schemaEvolutionMode": "rescue",
        },
    )
    rows = zone.rows()
    uri = {p: "file://" + str(p) for p in (good, mixed, garbage)}
    by_key = {(r["id"], r["n"]): r for r in rows if r["id"] is not None}
    assert by_key[("1", 5)]["_rescued_data"] is None
    assert str(by_key[("1", 5)]["d"]) == "2024-01-02"
    assert json.loads(by_key[("3", None)]["_rescued_data"]) == {
        "n": "seven",
        "d": "2024-02-30",
        "_file_path": uri[mixed],
    }
    five = by_key[("5", None)]
    assert json.loads(five["_rescued_data"]) == {"n": 2**40, "_file_path": uri[mixed]}
    assert five["big"] == huge and str(five["d"]) == "2024-03-01"
    corrupt = [json.loads(r["_rescued_data"]) for r in rows if r["id"] is None]
    assert {"_corrupt_record": '{"id": 4, "n": ', "_file_path": uri[mixed]} in corrupt
    assert {"_corrupt_record": "[1, 2]", "_file_path": uri[mixed]} in corrupt
    from_garbage = [c for c in corrupt if c["_file_path"] == uri[garbage]]
    assert from_garbage and all(c["_corrupt_record"] for c in from_garbage)
    assert len(rows) == 2 + 4 + len(from_garbage)


def test_new_columns_stop_the_stream_once_then_restart_reads_them(spark, zone) -> None:
    zone.drop_json([{"id": 1, "a": "x"}])
    zone.run(spark)
    zone.drop_json([{"id": 2, "a": "y", "b": 7, "c": {"k": 1}}])
    with pytest.raises(Exception) as caught:
        zone.run(spark)
    error = unpack_remote_error(caught.value)
    assert isinstance(error, NewColumnsError)
    assert (set(error.columns), error.schema_version, error.mode) == (
        {"b", "c"},
        1,
        "addNewColumns",
    )
    assert sorted(os.listdir(os.path.join(zone.schemas, "_schemas"))) == ["0", "1"]
    assert [r["id"] for r in zone.rows()] == ["1"]  # the failed batch committed nothing

    zone.run(spark)  # the restart replays the batch with the new schema
    rows = by_id(zone.rows())
    assert [(r["id"], r["a"], r.get("b"), r.get("c")) for r in rows] == [
        ("1", "x", None, None),
        ("2", "y", "7", '{"k":1}'),
    ]


def test_rescue_mode_keeps_unexpected_columns_with_a_user_schema(spark, zone) -> None:
    path = zone.drop_json([{"id": 1, "a": "x", "extra": [1]}, {"id": 2, "a": "y"}])
    zone.run(
        spark,
        schema="id BIGINT, a STRING, _rescued_data STRING",
        **{"cloudFiles.schemaEvolutionMode": "rescue"},
    )
    assert by_id(zone.rows()) == [
        {
            "id": 1,
            "a": "x",
            "_rescued_data": json.dumps({"extra": [1], "_file_path": f"file://{path}"}),
        },
        {"id": 2, "a": "y", "_rescued_data": None},
    ]


def test_csv_max_files_per_trigger_splits_batches_with_file_metadata(spark, zone) -> None:
    sizes = {}
    for i in range(5):
        path = zone.drop(f"id,score\n{i},{i * 1.5}\n{i + 10},oops\n", name=f"part{i}.csv")
        sizes[path.name] = path.stat().st_size
    zone.drop("id,score\n99,1\n", name="ignored.txt")
    query = zone.run(
        spark,
        "csv",
        pathGlobFilter="*.csv",
        **{
            "cloudFiles.maxFilesPerTrigger": "2",
            "cloudFiles.inferColumnTypes": "true",  # id: bigint; score: string ("oops")
            "cloudFiles.schemaHints": "score DOUBLE",
            "cloudFiles.includeFileMetadata": "true",
        },
    )
    assert batch_sizes(query) == [4, 4, 2]
    rows = zone.rows()
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    for row in rows:
        meta = row["_metadata"]
        assert meta["file_size"] == sizes[meta["file_name"]]
        assert meta["file_path"] == f"file://{zone.landing / meta['file_name']}"
        if row["id"] >= 10:
            assert row["score"] is None
            assert json.loads(row["_rescued_data"])["score"] == "oops"
        else:
            assert row["score"] == row["id"] * 1.5


def test_text_lines_and_whole_text_keep_every_byte_as_a_value(spark, zone, tmp_path) -> None:
    texts = [
        "plain line\nsecond, with {json-ish} stuff\n",
        "\u00e9t\u00e9 \u2028 kept\r\nno newline at end",
    ]
    for i, text in enumerate(texts):
        zone.drop(text, name=f"log{i}.txt")
    zone.drop("", name="empty.txt")
    zone.run(spark, "text", **{"cloudFiles.includeFileMetadata": "true"})
    rows = zone.rows()
    expected = sorted(line.removesuffix("\r") for t in texts for line in t.split("\n") if line)
    assert sorted(r["value"] for r in rows) == expected
    assert set(DeltaTable(zone.target).schema().to_arrow().names) == {"value", "_metadata"}
    assert {r["_metadata"]["file_name"] for r in rows} == {"log0.txt", "log1.txt"}

    (tmp_path / "whole").mkdir()
    whole = Zone(tmp_path / "whole")
    for i, text in enumerate(texts):
        whole.drop(text, name=f"doc{i}.txt")
    whole.run(spark, "text", wholeText="true")
    assert sorted(r["value"] for r in whole.rows()) == sorted(texts)


def test_parquet_casts_whole_columns_and_rescues_misfits(spark, zone) -> None:
    def drop_parquet(name: str, table: pa.Table) -> Path:
        staging = zone.landing / f".{name}"
        pq.write_table(table, staging)
        return Path(os.replace(staging, zone.landing / name) or zone.landing / name)

    drop_parquet("p1.parquet", pa.table({"id": pa.array([1, 2], pa.int32()), "t": ["a", "b"]}))
    zone.run(spark, "parquet")
    assert by_id(zone.rows()) == [
        {"id": 1, "t": "a", "_rescued_data": None},
        {"id": 2, "t": "b", "_rescued_data": None},
    ]
    p2 = drop_parquet("p2.parquet", pa.table({"id": ["7", "x"], "t": ["c", "d"]}))
    zone.run(spark, "parquet")
    rescued = {r["t"]: r["_rescued_data"] for r in zone.rows() if r["id"] is None}
    assert {t: json.loads(v) for t, v in rescued.items()} == {
        "c": {"id": "7", "_file_path": f"file://{p2}"},
        "d": {"id": "x", "_file_path": f"file://{p2}"},
    }


# ---- discovery without Spark ------------------------------------------------------------


def store_for(zone: Zone, **options: str) -> FileStore:
    return FileStore(
        parse_options(
            {
                "path": str(zone.landing),
                "cloudFiles.format": "json",
                "cloudFiles.schemaLocation": zone.schemas,
                **options,
            }
        )
    )


def test_include_existing_files_false_and_allow_overwrites(zone) -> None:
    old = zone.drop("{}\n")
    store = store_for(zone, **{"cloudFiles.includeExistingFiles": "false"})
    assert store.discover() == 0
    new = zone.drop("{}\n")
    assert store.discover() == 1
    assert [f.uri for f in store.files_between(0, 1)] == [f"file://{new}"]
    os.utime(new, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert store.discover() == 1  # a changed mtime is not a new file by default
    assert old.exists()

    overwriting = store_for(zone, **{"cloudFiles.allowOverwrites": "true"})
    os.utime(new, ns=(time.time_ns() + 2 * 10**9, time.time_ns() + 2 * 10**9))
    assert overwriting.discover() == 2
    assert [f.uri for f in overwriting.files_between(1, 2)] == [f"file://{new}"]


def test_a_file_renamed_in_long_after_it_was_written_is_found(zone) -> None:
    store = store_for(zone, **{"cloudFiles.recheckWindowSeconds": "1"})
    zone.drop("{}\n")
    assert store.discover() == 1
    staged = zone.landing.parent / "elsewhere.json"
    staged.write_text("{}\n")
    week_ago = time.time_ns() - 7 * 86400 * 10**9
    os.utime(staged, ns=(week_ago, week_ago))
    os.replace(staged, zone.landing / "late.json")  # keeps the old mtime, sets ctime
    assert store.discover() == 2


def test_discovery_of_5000_small_files_stays_fast(zone, record_property) -> None:
    for i in range(5000):
        (zone.landing / f"e{i:05d}.json").write_text(json.dumps({"id": i}) + "\n")
    store = store_for(zone)
    started = time.monotonic()
    assert store.discover() == 5000
    first = time.monotonic() - started
    started = time.monotonic()
    assert store.discover() == 5000  # nothing new: listing plus in-window look-ups
    again = time.monotonic() - started
    (zone.landing / "new.json").write_text("{}\n")
    assert store.discover() == 5001
    assert store.admit(0, None, 1000, None) == 1000
    assert store.admit(4990, None, 1000, None) == 5001
    assert len(store.files_between(1000, 2000)) == 1000
    one_file = store.files_between(0, 1)[0].size
    assert store.admit(0, None, None, 3 * one_file) == 3  # maxBytesPerTrigger
    assert store.admit(0, None, None, 1) == 1  # soft: one file always fits
    assert store.admit(0, 10, None, None) == 10  # availableNow's cap
    record_property("discover_first_s", round(first, 3))
    record_property("discover_again_s", round(again, 3))
    print(f"discovery of 5000 files: first {first:.3f} s, again {again:.3f} s")


def test_empty_zone_without_schema_and_fail_on_new_columns_are_typed(spark, zone) -> None:
    from deltaflow.ingest import SchemaInferenceError

    with pytest.raises(Exception) as caught:
        zone.stream(spark)
    error = unpack_remote_error(caught.value)
    assert isinstance(error, SchemaInferenceError)
    assert error.source_path == f"file://{zone.landing}"

    path = zone.drop_json([{"id": 1, "surprise": True}])
    with pytest.raises(Exception) as caught:
        zone.run(
            spark, schema="id BIGINT", **{"cloudFiles.schemaEvolutionMode": "failOnNewColumns"}
        )
    error = unpack_remote_error(caught.value)
    assert isinstance(error, NewColumnsError)
    assert (error.columns, error.schema_version, error.file_path) == (
        ("surprise",),
        None,
        f"file://{path}",
    )
    assert zone.rows() == []
