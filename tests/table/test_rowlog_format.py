"""The row log's format (``docs/notes/rowlog.md``): frames, torn tails, segment choice and
epoch moves, each position read once."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from deltaflow.table import _rowlog
from deltaflow.table._rowlog import PartitionTail, Position, SegmentWriter
from deltaflow.table.errors import CorruptTableError


def _batch(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "s": [f"r{i}" for i in ids]})


def _ids(batches: list[pa.RecordBatch]) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_frames_round_trip_and_a_torn_tail_is_not_a_frame():
    data = _rowlog.encode_frame(_batch([0, 1]), 0) + _rowlog.encode_frame(_batch([2]), 2)
    frames = list(_rowlog.decode_frames(data))
    assert [(f.from_row, f.batch.num_rows) for f in frames] == [(0, 2), (2, 1)]
    assert frames[-1].end == len(data)
    for cut in (1, _rowlog.HEADER_SIZE - 1, _rowlog.HEADER_SIZE + 3, len(data) - 1):
        torn = data[: len(data) - cut] if cut < len(data) else data
        whole = list(_rowlog.decode_frames(torn))
        assert all(f.end <= len(torn) for f in whole)
        assert len(whole) < 2
    # A bad last frame is a torn tail; a bad frame with frames after it is corruption.
    bad = bytearray(data)
    bad[-1] ^= 0xFF
    assert len(list(_rowlog.decode_frames(bytes(bad)))) == 1
    first_end = frames[0].end
    bad = bytearray(data)
    bad[first_end - 1] ^= 0xFF
    with pytest.raises(CorruptTableError):
        list(_rowlog.decode_frames(bytes(bad)))


def test_writer_names_encode_every_byte_outside_the_kept_set():
    assert _rowlog.encode_writer("q-1_a.b") == "q-1_a.b"
    assert _rowlog.encode_writer("a/b c%é") == "a%2Fb%20c%25%C3%A9"
    value = _rowlog.tag("w", 3, 7, 10, 25)
    assert _rowlog.parse_tag(value) == ("w", 3, 7, 10, 25)
    assert Position.of_transaction(7 << 32 | 25) == (7, 25)
    assert Position.of_transaction(None) == (0, 0)


def test_a_tail_reads_each_position_once_across_attempts_and_epochs(tmp_path):
    directory = _rowlog.partition_dir(str(tmp_path), "w", 0)
    first = SegmentWriter(directory, 0, 0)
    first.append(_batch([0, 1, 2]))
    tail = PartitionTail(directory, Position(0, 1))
    assert _ids(tail.poll()) == [1, 2]
    assert tail.poll() == []
    # The attempt dies with a torn frame; its successor starts where the table's rows end
    # (row 1) and logs rows 1.. again, at the same positions.
    with open(first.path, "ab") as f:
        f.write(_rowlog.encode_frame(_batch([3]), 3)[:10])
    second = SegmentWriter(directory, 0, 1)
    assert second.path != first.path
    second.append(_batch([1, 2, 3, 4]))
    assert _ids(tail.poll()) == [3, 4]
    assert tail.position == (0, 5)
    # Epoch 2 (partition 0 had no rows in epoch 1) begins: the rest of epoch 0 first.
    second.append(_batch([5]))
    third = SegmentWriter(directory, 2, 0)
    third.append(_batch([100, 101]))
    assert _ids(tail.poll()) == [5, 100, 101]
    assert tail.position == (2, 2)
    # A reader starting from an app transaction's position.
    late = PartitionTail(directory, Position.of_transaction(2 << 32 | 1))
    assert _ids(late.poll()) == [101]
    for w in (first, second, third):
        w.close()
    assert sorted(os.listdir(directory)) == sorted(
        os.path.basename(w.path) for w in (first, second, third)
    )
