"""Deletion vectors: codec round trips, known protocol vectors, corruption, and delta-rs parity."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import uuid
import zlib
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.table._deletion_vectors import (
    PORTABLE_ROARING_MAGIC,
    DeletionVectorDescriptor,
    DeletionVectorError,
    decode_uuid,
    deserialize_bitmap_array,
    encode_uuid,
    inline_descriptor,
    read_deleted_rows,
    serialize_bitmap_array,
    write_deletion_vector_file,
    write_deletion_vectors,
    z85_decode,
    z85_encode,
)

try:
    from dv_fixtures import add_deletion_vectors
except ImportError:  # tests/ laid out as packages
    from tests.table.dv_fixtures import add_deletion_vectors

U64 = np.uint64
TWO_32 = 1 << 32
MAX_ROW = (1 << 63) - 1


def _rows(values) -> np.ndarray:
    return np.unique(np.asarray(values, dtype=np.uint64))


ROW_SETS = {
    "empty": [],
    "single_zero": [0],
    "small": [3, 4, 7, 11, 18, 29],
    # one 16-bit chunk per kind: array (<= 4096), bitset (> 4096 scattered), run (contiguous)
    "array_container": list(range(0, 8000, 2)),
    "bitset_container": list(range(0, 65536, 3)),
    "run_container": list(range(100_000, 150_000)),
    "chunk_edges": [65535, 65536, 131071, 131072, TWO_32 - 1],
    "above_2_32": [1, TWO_32, TWO_32 + 1, 5 * TWO_32 + 70_000, (1 << 40) + 12345],
    "max_row_index": [0, MAX_ROW - 1, MAX_ROW],
    "mixed": np.concatenate(
        [
            np.arange(5000),
            np.arange(70_000, 140_000, 7),
            np.random.default_rng(7).integers(0, 1 << 45, 20_000),
            np.arange(3 * TWO_32, 3 * TWO_32 + 100_000),
        ]
    ),
}


# --------------------------------------------------------------------- z85 / uuid


@pytest.mark.parametrize("length", [0, 1, 2, 3, 4, 5, 7, 8, 16, 33, 44, 1000])
def test_z85_round_trip(length):
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    encoded = z85_encode(data)
    # Delta pads unaligned input with zero bytes to whole 4-byte blocks.
    assert len(encoded) == (length + 3) // 4 * 5
    assert z85_decode(encoded, length) == data
    assert z85_decode(encoded) == data + b"\x00" * (-length % 4)


def test_z85_reference_vector():
    # The example of the Z85 spec (rfc.zeromq.org/spec/32).
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(data) == "HelloWorld"
    assert z85_decode("HelloWorld") == data


@pytest.mark.parametrize("bad", ["abcd", "abc\u00e9e", 'ab"de', "ab de", "#####"])
def test_z85_rejects_invalid_text(bad):
    with pytest.raises(ValueError):
        z85_decode(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # delta-kernel-rs tests (kernel/src/actions/deletion_vector.rs)
        ("rsTVZ&*Sl-RXRWjryu/!", "550e8400-e29b-41d4-a716-446655440000"),
        ("5<w-%>:JjlQ/G/]6C<1m", "123e4567-e89b-12d3-a456-426614174000"),
        ("vBn[lx{q8@P<9BNH/isA", "61d16c75-6994-46b7-a15b-8b538852e50e"),
        # PROTOCOL.md, JSON example 1 (after the "ab" prefix)
        ("^-aqEH.-t@S}K{vb[*k^", "d2c639aa-8816-431a-aaf6-d3fe2512ff61"),
    ],
)
def test_uuid_codec_matches_reference(text, expected):
    assert decode_uuid(text) == uuid.UUID(expected)
    assert encode_uuid(uuid.UUID(expected)) == text


# ------------------------------------------------------------------- descriptors


def test_descriptor_json_round_trip():
    on_disk = {
        "storageType": "u",
        "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 4,
        "sizeInBytes": 40,
        "cardinality": 6,
    }
    d = DeletionVectorDescriptor.from_json({**on_disk, "maxRowIndex": 29})
    assert d == DeletionVectorDescriptor("u", "ab^-aqEH.-t@S}K{vb[*k^", 4, 40, 6)
    assert d.to_json() == on_disk
    assert d.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"

    inline = {"storageType": "i", "pathOrInlineDv": "wi5b=", "sizeInBytes": 4, "cardinality": 0}
    d = DeletionVectorDescriptor.from_json({**inline, "offset": None})
    assert d.offset is None
    assert d.to_json() == inline  # offset is absent, not null, for inline DVs
    assert d.unique_id == "iwi5b="
    with pytest.raises(ValueError):
        DeletionVectorDescriptor("x", "", None, 0, 0)  # type: ignore[arg-type]


def test_descriptor_absolute_path_protocol_examples():
    relative = DeletionVectorDescriptor("u", "ab^-aqEH.-t@S}K{vb[*k^", 4, 40, 6)
    expected = "s3://mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert relative.absolute_path("s3://mytable/") == expected
    assert relative.absolute_path("s3://mytable") == expected

    no_prefix = DeletionVectorDescriptor("u", "vBn[lx{q8@P<9BNH/isA", 1, 36, 2)
    assert no_prefix.absolute_path("/data/t") == (
        "/data/t/deletion_vector_61d16c75-6994-46b7-a15b-8b538852e50e.bin"
    )

    absolute = DeletionVectorDescriptor(
        "p", "s3://mytable/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin", 4, 40, 6
    )
    assert absolute.absolute_path("s3://other") == absolute.path_or_inline_dv

    with pytest.raises(ValueError):
        DeletionVectorDescriptor("i", "wi5b=", None, 4, 0).absolute_path("/t")


# ------------------------------------------------------------------ bitmap codec


def test_inline_reference_vector_from_delta_kernel():
    # delta-kernel-rs's inline test DV: rows 3, 4, 7, 11, 18, 29 with the magic.
    encoded = "^Bg9^0rr910000000000iXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"
    d = DeletionVectorDescriptor("i", encoded, None, 44, 6)
    assert read_deleted_rows("/unused", d).tolist() == [3, 4, 7, 11, 18, 29]
    assert inline_descriptor([29, 3, 4, 7, 11, 18, 3]) == d


@pytest.mark.parametrize("name", list(ROW_SETS))
def test_serialize_round_trip(name):
    rows = _rows(ROW_SETS[name])
    data = serialize_bitmap_array(rows)
    assert struct.unpack("<I", data[:4])[0] == PORTABLE_ROARING_MAGIC
    result = deserialize_bitmap_array(data)
    assert result.dtype == np.uint64
    np.testing.assert_array_equal(result, rows)


@pytest.mark.parametrize("name", list(ROW_SETS))
def test_serialize_matches_croaring(name):
    """Byte parity with CRoaring's portable 64-bit serialization (run-optimized)."""
    pyroaring = pytest.importorskip("pyroaring")
    rows = _rows(ROW_SETS[name])
    reference = pyroaring.BitMap64(rows.tolist())
    reference.run_optimize()
    ours = serialize_bitmap_array(rows)
    assert ours[4:] == reference.serialize()
    assert pyroaring.BitMap64.deserialize(ours[4:]) == reference
    # And we read CRoaring's output without run containers too.
    plain = pyroaring.BitMap64(rows.tolist(), optimize=False)
    magic = struct.pack("<I", PORTABLE_ROARING_MAGIC)
    np.testing.assert_array_equal(deserialize_bitmap_array(magic + plain.serialize()), rows)


def test_serialize_accepts_unsorted_duplicates_and_iterables():
    expected = [0, 5, TWO_32 + 1]
    for rows in (
        [5, 0, TWO_32 + 1, 5],
        (x for x in [TWO_32 + 1, 0, 5]),
        np.array([5, 0, 5, TWO_32 + 1]),
    ):
        assert deserialize_bitmap_array(serialize_bitmap_array(rows)).tolist() == expected


@pytest.mark.parametrize(
    "rows", [[-1], np.array([3, -2]), [1 << 63], np.array([1 << 63], dtype=U64)]
)
def test_serialize_rejects_unrepresentable_rows(rows):
    with pytest.raises(ValueError):
        serialize_bitmap_array(rows)


def test_deserialize_rejects_garbage():
    good = serialize_bitmap_array([1, 2, 3, 70_000])
    with pytest.raises(ValueError, match="magic"):
        deserialize_bitmap_array(b"\x00\x00\x00\x00" + good[4:])
    with pytest.raises(ValueError, match="truncated"):
        deserialize_bitmap_array(good[:-1])
    with pytest.raises(ValueError, match="unexpected bytes"):
        deserialize_bitmap_array(good + b"\x00")


# -------------------------------------------------------------------- DV files


def _uri_forms(path: Path) -> list[str]:
    return [str(path), path.as_uri(), path.as_uri() + "/"]


@pytest.mark.parametrize("name", ["small", "above_2_32", "mixed", "empty"])
def test_file_round_trip(tmp_path, name):
    rows = _rows(ROW_SETS[name])
    d = write_deletion_vector_file(str(tmp_path), rows)
    assert d.storage_type == "u" and d.offset == 1 and d.cardinality == rows.size
    assert len(d.path_or_inline_dv) == 20
    dv_file = tmp_path / d.relative_path()
    assert dv_file.name.startswith("deletion_vector_") and dv_file.suffix == ".bin"
    assert dv_file.stat().st_size == 1 + 4 + d.size_in_bytes + 4
    for table_uri in _uri_forms(tmp_path):
        np.testing.assert_array_equal(read_deleted_rows(table_uri, d), rows)


def test_file_with_prefix_and_absolute_descriptor(tmp_path):
    d = write_deletion_vector_file(str(tmp_path), [1, 2, 3], prefix="xy")
    assert d.path_or_inline_dv.startswith("xy") and len(d.path_or_inline_dv) == 22
    assert (tmp_path / "xy" / d.relative_path().split("/")[1]).exists()
    assert read_deleted_rows(tmp_path.as_uri(), d).tolist() == [1, 2, 3]

    absolute = DeletionVectorDescriptor(
        "p", d.absolute_path(tmp_path.as_uri()), d.offset, d.size_in_bytes, d.cardinality
    )
    assert read_deleted_rows("/somewhere/else", absolute).tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        write_deletion_vector_file(str(tmp_path), [1], prefix="../x")


def test_several_dvs_in_one_file(tmp_path):
    sets = [_rows(ROW_SETS[n]) for n in ("small", "above_2_32", "bitset_container", "empty")]
    descriptors = write_deletion_vectors(str(tmp_path), sets)
    assert len({d.path_or_inline_dv for d in descriptors}) == 1
    assert [d.offset for d in descriptors] == [
        1 + sum(8 + d.size_in_bytes for d in descriptors[:i]) for i in range(len(sets))
    ]
    for d, rows in zip(descriptors, sets, strict=True):
        np.testing.assert_array_equal(read_deleted_rows(str(tmp_path), d), rows)


def test_inline_round_trip():
    rows = _rows(ROW_SETS["above_2_32"])
    d = inline_descriptor(rows)
    assert d.storage_type == "i" and d.offset is None and d.cardinality == rows.size
    assert len(d.path_or_inline_dv) == (d.size_in_bytes + 3) // 4 * 5
    np.testing.assert_array_equal(read_deleted_rows("/unused", d), rows)


# ------------------------------------------------------------------ corruption


@pytest.fixture
def dv_on_disk(tmp_path):
    d = write_deletion_vector_file(str(tmp_path), list(range(0, 10_000, 3)))
    return tmp_path, d, tmp_path / d.relative_path()


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_checksum_mismatch_raises(dv_on_disk):
    table, d, dv_file = dv_on_disk
    raw = dv_file.read_bytes()
    _patch(dv_file, 20, bytes([raw[20] ^ 0xFF]))
    with pytest.raises(DeletionVectorError, match="CRC-32 mismatch") as info:
        read_deleted_rows(str(table), d)
    assert info.value.table_uri == str(table)
    assert info.value.path == str(dv_file)
    # Errors cross process boundaries (Spark workers) intact.
    clone = pickle.loads(pickle.dumps(info.value))
    assert (clone.table_uri, clone.path, str(clone)) == (str(table), str(dv_file), str(info.value))


def test_bad_magic_with_valid_checksum_raises(dv_on_disk):
    table, d, dv_file = dv_on_disk
    raw = bytearray(dv_file.read_bytes())
    data = b"\x00\x00\x00\x00" + bytes(raw[9 : 5 + d.size_in_bytes])
    raw[5 : 5 + d.size_in_bytes] = data
    raw[5 + d.size_in_bytes :] = struct.pack(">I", zlib.crc32(data))
    dv_file.write_bytes(bytes(raw))
    with pytest.raises(DeletionVectorError, match="magic"):
        read_deleted_rows(str(table), d)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f, d: _patch(f, 0, b"\x02"), "version"),
        (lambda f, d: f.write_bytes(f.read_bytes()[:-3]), "truncated"),
        (lambda f, d: f.unlink(), "not found"),
    ],
)
def test_damaged_file_raises(dv_on_disk, mutate, message):
    table, d, dv_file = dv_on_disk
    mutate(dv_file, d)
    with pytest.raises(DeletionVectorError, match=message):
        read_deleted_rows(str(table), d)


def test_descriptor_disagreeing_with_file_raises(dv_on_disk):
    table, d, _ = dv_on_disk
    for wrong in (
        DeletionVectorDescriptor("u", d.path_or_inline_dv, 1, d.size_in_bytes + 1, d.cardinality),
        DeletionVectorDescriptor("u", d.path_or_inline_dv, 1, d.size_in_bytes, d.cardinality + 1),
        DeletionVectorDescriptor("u", d.path_or_inline_dv, 10**6, d.size_in_bytes, d.cardinality),
        DeletionVectorDescriptor("u", "short", 1, d.size_in_bytes, d.cardinality),
    ):
        with pytest.raises(DeletionVectorError):
            read_deleted_rows(str(table), wrong)


def test_corrupt_inline_raises():
    d = inline_descriptor([1, 2, 3])
    broken = DeletionVectorDescriptor("i", "~" + d.path_or_inline_dv[1:], None, d.size_in_bytes, 3)
    with pytest.raises(DeletionVectorError) as info:
        read_deleted_rows("/t", broken)
    assert info.value.path is None


# ----------------------------------------------------- parity with delta-rs


def _make_table(path: Path, sizes: list[int], partitioned: bool = False) -> dict[str, np.ndarray]:
    """One data file per entry of ``sizes``; returns log path -> ids in file row order."""
    start = 0
    for i, size in enumerate(sizes):
        ids = np.arange(start, start + size, dtype=np.int64)
        start += size
        data = pa.table({"id": ids, "part": pa.array([f"p{i % 2}"] * size)})
        write_deltalake(
            str(path), data, mode="append", partition_by=["part"] if partitioned else None
        )
    dt = DeltaTable(str(path))
    files = {}
    for rel in dt.get_add_actions(flatten=True).column("path").to_pylist():
        files[rel] = pq.read_table(path / unquote(rel), columns=["id"]).column("id").to_numpy()
    assert sorted(len(v) for v in files.values()) == sorted(sizes)
    return files


def _check_against_delta_rs(
    path: Path, files: dict[str, np.ndarray], deleted: dict[str, np.ndarray]
):
    dt = DeltaTable(str(path))
    assert "deletionVectors" in (dt.protocol().reader_features or [])

    # 1. delta-rs's own DV reader agrees with ours, file by file.
    vectors = {}
    for batch in dt.deletion_vectors():
        table = pa.table(batch)
        for uri, selection in zip(
            table.column("filepath").to_pylist(),
            table.column("selection_vector").to_pylist(),
            strict=True,
        ):
            vectors[os.path.relpath(unquote(urlparse(uri).path), path)] = np.array(selection)
    expected_with_dv = {unquote(p) for p, rows in deleted.items() if len(rows)}
    assert set(vectors) == expected_with_dv
    for rel, selection in vectors.items():
        rows = _rows(deleted[next(p for p in deleted if unquote(p) == rel)])
        num_rows = len(files[next(p for p in files if unquote(p) == rel)])
        assert len(selection) <= num_rows
        keep = np.ones(num_rows, dtype=bool)
        keep[rows.astype(np.int64)] = False
        np.testing.assert_array_equal(selection, keep[: len(selection)])
        assert keep[len(selection) :].all()  # rows past the vector are kept

    # 2. The DV-carrying adds replaced the old ones: same set of files.
    adds = pa.table(dt.get_add_actions(flatten=False)).column("path").to_pylist()
    assert set(adds) == set(files)

    # 3. A delta-rs scan (which applies DVs) returns exactly the surviving rows.
    expected_ids = []
    for rel, ids in files.items():
        keep = np.ones(len(ids), dtype=bool)
        if rel in deleted:
            keep[_rows(deleted[rel]).astype(np.int64)] = False
        expected_ids.append(ids[keep])
    scanned = pa.table(dt.scan(columns=["id"])).column("id").to_numpy()
    np.testing.assert_array_equal(np.sort(scanned), np.sort(np.concatenate(expected_ids)))
    # Beware: DeltaTable.count() sums the stats' numRecords and ignores DVs, so
    # it counts the physical rows, deleted ones included.
    assert dt.count() == sum(len(ids) for ids in files.values())


def _read_log_descriptors(path: Path) -> dict[str, DeletionVectorDescriptor]:
    import json

    out = {}
    log = path / "_delta_log"
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            for line in (log / name).read_text().splitlines():
                action = json.loads(line)
                if "add" in action and action["add"].get("deletionVector"):
                    dv = DeletionVectorDescriptor.from_json(action["add"]["deletionVector"])
                    out[action["add"]["path"]] = dv
    return out


@pytest.mark.parametrize("mode", ["file", "single_file", "inline", "prefix", "partitioned"])
def test_delta_rs_reads_our_deletion_vectors(tmp_path, mode):
    path = tmp_path / "t"
    files = _make_table(path, [10, 1000, 70_000], partitioned=mode == "partitioned")
    small, medium, large = sorted(files, key=lambda p: len(files[p]))
    deleted = {
        small: np.array([0, 3, 9]),
        medium: np.arange(0, 1000, 5),
        large: np.concatenate([np.arange(60_000, 70_000), [65535, 65536, 69_999]]),
    }
    version = add_deletion_vectors(
        str(path),
        deleted,
        inline=mode == "inline",
        single_file=mode == "single_file",
        prefix="ab" if mode == "prefix" else "",
    )
    assert version == 3
    descriptors = _read_log_descriptors(path)
    assert {d.storage_type for d in descriptors.values()} == {"i" if mode == "inline" else "u"}
    if mode == "single_file":
        assert len({d.path_or_inline_dv for d in descriptors.values()}) == 1
    if mode == "prefix":
        assert all(d.path_or_inline_dv.startswith("ab") for d in descriptors.values())
    for rel, d in descriptors.items():
        np.testing.assert_array_equal(read_deleted_rows(str(path), d), _rows(deleted[rel]))
    _check_against_delta_rs(path, files, deleted)


def test_large_file_multiple_containers(tmp_path):
    """200k rows; deletes in array, bitset and run containers, many above 65536."""
    path = tmp_path / "big"
    files = _make_table(path, [200_000])
    (rel,) = files
    rng = np.random.default_rng(42)
    rows = np.concatenate(
        [
            rng.choice(np.arange(65_536, 131_072), 500, replace=False),  # array container
            np.arange(131_072, 196_608, 3),  # bitset container (21846 values)
            np.arange(196_608, 199_000),  # run container
            [0, 65_535, 199_999],
        ]
    )
    add_deletion_vectors(str(path), {rel: rows})
    (d,) = _read_log_descriptors(path).values()
    assert d.cardinality == _rows(rows).size
    np.testing.assert_array_equal(read_deleted_rows(path.as_uri(), d), _rows(rows))
    _check_against_delta_rs(path, files, {rel: rows})


def test_second_delete_unions_with_existing_dv(tmp_path):
    path = tmp_path / "t"
    files = _make_table(path, [100])
    (rel,) = files
    add_deletion_vectors(str(path), {rel: [1, 2, 3]})
    version = add_deletion_vectors(str(path), {rel: [3, 50, 99]}, inline=True)
    assert version == 2
    descriptors = _read_log_descriptors(path)
    assert read_deleted_rows(str(path), descriptors[rel]).tolist() == [1, 2, 3, 50, 99]
    _check_against_delta_rs(path, files, {rel: [1, 2, 3, 50, 99]})


def test_checkpoint_keeps_deletion_vectors(tmp_path):
    path = tmp_path / "t"
    files = _make_table(path, [10, 70_000])
    small, large = sorted(files, key=lambda p: len(files[p]))
    deleted = {small: np.array([2, 4]), large: np.arange(65_000, 66_000)}
    version = add_deletion_vectors(str(path), deleted)
    DeltaTable(str(path)).create_checkpoint()
    log = path / "_delta_log"
    checkpoint = log / f"{version:020d}.checkpoint.parquet"
    assert checkpoint.exists()

    # The checkpoint carries each add's deletionVector struct...
    adds = [a for a in pq.read_table(checkpoint).column("add").to_pylist() if a]
    from_checkpoint = {
        a["path"]: DeletionVectorDescriptor.from_json(a["deletionVector"]) for a in adds
    }
    assert from_checkpoint == _read_log_descriptors(path)
    for rel, d in from_checkpoint.items():
        np.testing.assert_array_equal(read_deleted_rows(str(path), d), _rows(deleted[rel]))

    # ...and delta-rs reads the table from the checkpoint alone.
    for name in os.listdir(log):
        if name.endswith(".json"):
            (log / name).unlink()
    assert DeltaTable(str(path)).version() == version
    _check_against_delta_rs(path, files, deleted)


def test_fixture_rejects_unknown_file_and_out_of_range_rows(tmp_path):
    path = tmp_path / "t"
    files = _make_table(path, [10])
    (rel,) = files
    with pytest.raises(ValueError):
        add_deletion_vectors(str(path), {"nope.parquet": [1]})
    with pytest.raises(ValueError):
        add_deletion_vectors(str(path), {rel: [10]})
    shutil.rmtree(path)


def test_protocol_upgrade_keeps_legacy_features(tmp_path):
    path = tmp_path / "t"
    data = pa.table({"id": pa.array(range(10), pa.int64())})
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})
    before = DeltaTable(str(path)).protocol()
    assert before.min_writer_version == 4
    (rel,) = DeltaTable(str(path)).get_add_actions(flatten=True).column("path").to_pylist()
    add_deletion_vectors(str(path), {rel: [0, 9]})
    dt = DeltaTable(str(path))
    protocol = dt.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert protocol.reader_features == ["deletionVectors"]
    assert set(protocol.writer_features or []) >= {
        "changeDataFeed",
        "deletionVectors",
        "appendOnly",
    }
    config = dt.metadata().configuration
    assert config["delta.enableDeletionVectors"] == "true"
    assert config["delta.enableChangeDataFeed"] == "true"
    assert sorted(pa.table(dt.scan()).column("id").to_pylist()) == list(range(1, 9))
