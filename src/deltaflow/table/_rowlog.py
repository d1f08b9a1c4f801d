"""The row log: a durable tail of rows beside a Delta table (``docs/notes/rowlog.md``).

A real-time sink with ``realTimeRowLog`` appends each burst of rows here, synced, before
it commits the same rows to the table every commit interval; real-time readers tail it
from the positions the table's app transactions record. This module is the format's
reference: frames, segment names, an appending writer and a tailing reader. The JVM's
``RowLog`` reads and writes the same bytes.

A position is ``(epoch, row)`` per writer and partition: the rows an app transaction
``<writer>/rtm-p<partition>`` counts at ``epoch << 32 | rows``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import struct
import time
import zlib
from collections.abc import Iterator
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

import pyarrow as pa

from deltaflow._atomic import fsync_directory
from deltaflow.table.errors import CorruptTableError

DIRECTORY = "_deltaflow_rowlog"
TAG = "deltaflow.rowLog"
MAGIC = b"DFRL"
# magic, payload length, fromRow, rows, CRC-32 (of fromRow, rows and the payload)
_HEADER = struct.Struct("<4sIqII")
HEADER_SIZE = _HEADER.size  # 24
_CRC_COVERS = struct.Struct("<qI")
_SEGMENT = re.compile(r"^(\d{20})-(\d{20})-(\d{13})-([0-9a-f]{8})\.arrows$")
_KEPT = re.compile(rb"[A-Za-z0-9._-]")
_PARTITION = re.compile(r"^p\d+$")


class Position(NamedTuple):
    """Where a reader is in one writer's partition: the next row to emit."""

    epoch: int
    row: int

    @classmethod
    def of_transaction(cls, version: int | None) -> Position:
        """The position after the rows an app transaction ``epoch << 32 | rows`` records."""
        if version is None:
            return cls(0, 0)
        return cls(version >> 32, version & 0xFFFFFFFF)


class Frame(NamedTuple):
    from_row: int
    batch: pa.RecordBatch
    end: int  # byte offset after the frame in its segment


@dataclasses.dataclass(frozen=True)
class Segment:
    """One task attempt's rows of one epoch, from ``from_row`` of the epoch."""

    path: str
    epoch: int
    from_row: int
    created: int  # ms since the epoch, when its attempt created it
    nonce: str


def encode_writer(app_id: str) -> str:
    """A writer's directory name: ``[A-Za-z0-9._-]`` kept, every other UTF-8 byte ``%XX``."""
    return "".join(
        chr(b) if _KEPT.match(bytes([b])) else f"%{b:02X}" for b in app_id.encode("utf-8")
    )


def decode_writer(writer: str) -> str:
    """The app id a writer's directory name encodes (the inverse of :func:`encode_writer`)."""
    return unquote_to_bytes(writer).decode("utf-8")


def partition_dirs(root: str) -> list[tuple[str, int]]:
    """The ``(writer, partition)`` directories under a row log's ``root``
    (``<table>/_deltaflow_rowlog``); none when it is absent."""
    try:
        writers = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    found: list[tuple[str, int]] = []
    for writer in writers:
        try:
            names = os.listdir(os.path.join(root, writer))
        except (FileNotFoundError, NotADirectoryError):
            continue
        found.extend((writer, int(n[1:])) for n in names if _PARTITION.match(n))
    return sorted(found)


def partition_dir(table_path: str, writer: str, partition: int) -> str:
    """The directory of a writer's partition (``writer`` as :func:`encode_writer` gives it)."""
    return os.path.join(table_path, DIRECTORY, writer, f"p{partition}")


def segment_name(epoch: int, from_row: int, created: int, nonce: str) -> str:
    return f"{epoch:020d}-{from_row:020d}-{created:013d}-{nonce}.arrows"


def tag(writer: str, partition: int, epoch: int, from_row: int, to_row: int) -> str:
    """The ``deltaflow.rowLog`` tag of a committed file holding these positions."""
    return f"{writer}/p{partition}/{epoch}/{from_row}-{to_row}"


def parse_tag(value: str) -> tuple[str, int, int, int, int]:
    """``(writer, partition, epoch, from_row, to_row)`` of a ``deltaflow.rowLog`` tag."""
    writer, part, epoch, rows = value.split("/")
    start, end = rows.split("-")
    return writer, int(part[1:]), int(epoch), int(start), int(end)


def segments(directory: str) -> list[Segment]:
    """A partition directory's segments, by (epoch, from_row); none when it is absent."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _SEGMENT.match(name)
        if m:
            found.append(
                Segment(os.path.join(directory, name), int(m[1]), int(m[2]), int(m[3]), m[4])
            )
    return sorted(found, key=lambda s: (s.epoch, s.from_row, s.created, s.nonce))


def encode_frame(batch: pa.RecordBatch, from_row: int) -> bytes:
    """One frame: the header, then ``batch`` as an Arrow IPC stream of its own."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    payload = sink.getvalue().to_pybytes()
    crc = zlib.crc32(payload, zlib.crc32(_CRC_COVERS.pack(from_row, batch.num_rows)))
    return _HEADER.pack(MAGIC, len(payload), from_row, batch.num_rows, crc) + payload


def decode_frames(data: bytes, start: int = 0, *, path: str = "") -> Iterator[Frame]:
    """The whole frames of ``data`` from byte ``start``; stops before a torn tail (an
    incomplete frame, or a bad last one). A bad frame with bytes after it is corruption."""
    offset = start
    while offset + HEADER_SIZE <= len(data):
        magic, length, from_row, rows, crc = _HEADER.unpack_from(data, offset)
        end = offset + HEADER_SIZE + length
        if end > len(data):
            return
        payload = data[offset + HEADER_SIZE : end]
        good = magic == MAGIC and crc == zlib.crc32(
            payload, zlib.crc32(_CRC_COVERS.pack(from_row, rows))
        )
        if not good:
            if end < len(data):
                raise CorruptTableError(
                    f"The row log segment {path} has a damaged frame at byte {offset} with"
                    " more frames after it: the file was changed by something other than"
                    " its writer. Restart the reading stream from a Delta version"
                    " (startingVersion) after the damage; the table itself is unaffected.",
                    table_uri=path,
                    path=path,
                )
            return
        with pa.ipc.open_stream(payload) as reader:
            batches = list(reader)
        batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        yield Frame(from_row, batch, end)
        offset = end


class SegmentWriter:
    """Appends frames to a new segment of its own; each append is synced before it
    returns when ``fsync`` (a row is durable when its frame is)."""

    def __init__(self, directory: str, epoch: int, from_row: int, *, fsync: bool = True) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(
            directory,
            segment_name(epoch, from_row, int(time.time() * 1000), secrets.token_hex(4)),
        )
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._fsync = fsync
        self.next_row = from_row
        if fsync:
            fsync_directory(directory)

    def append(self, batch: pa.RecordBatch) -> None:
        frame = encode_frame(batch, self.next_row)
        os.write(self._fd, frame)
        if self._fsync:
            os.fdatasync(self._fd)
        self.next_row += batch.num_rows

    def close(self) -> None:
        os.close(self._fd)


class PartitionTail:
    """Reads one writer's partition from a position on, each position once
    (``docs/notes/rowlog.md``, "Positions and exactly once")."""

    def __init__(self, directory: str, position: Position) -> None:
        self.directory = directory
        self.position = position
        self._segment: Segment | None = None
        self._offset = 0  # bytes of the current segment already decoded

    def poll(self) -> list[pa.RecordBatch]:
        """The rows after the position that are in the log now (possibly none)."""
        out: list[pa.RecordBatch] = []
        while True:
            out.extend(self._read_current())
            listed = segments(self.directory)
            best = _best(listed, self.position)
            if best is not None and best != self._segment:
                self._segment, self._offset = best, 0
                continue
            later = [s.epoch for s in listed if s.epoch > self.position.epoch]
            if not later:
                return out
            # A later epoch began after every task of this one synced its frames and
            # committed: read this one to its end once more, then move on.
            out.extend(self._read_current())
            self.position = Position(min(later), 0)
            self._segment, self._offset = None, 0

    def _read_current(self) -> list[pa.RecordBatch]:
        if self._segment is None:
            return []
        with open(self._segment.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        out = []
        consumed = 0
        for frame in decode_frames(data, path=self._segment.path):
            consumed = frame.end
            skip = self.position.row - frame.from_row
            if skip >= frame.batch.num_rows:
                continue
            batch = frame.batch.slice(max(0, skip))
            out.append(batch)
            self.position = Position(self.position.epoch, self.position.row + batch.num_rows)
        self._offset += consumed
        return out


def _best(listed: list[Segment], position: Position) -> Segment | None:
    """The segment to read ``position`` from: of its epoch, starting at or before its row,
    the latest start, then the latest created (a successor attempt supersedes the one
    before it, whose tail may be torn or, for an abandoned attempt, run past its epoch)."""
    here = [s for s in listed if s.epoch == position.epoch and s.from_row <= position.row]
    return max(here, key=lambda s: (s.from_row, s.created, s.nonce), default=None)
