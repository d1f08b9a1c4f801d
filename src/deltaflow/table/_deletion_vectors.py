"""Deletion vectors (DVs): the Delta protocol's soft deletes, read and written in pure Python.

A DV marks rows of one data file as deleted without rewriting the file. The
``deletionVector`` field of an ``add``/``remove`` action holds a *descriptor*
(see PROTOCOL.md, "Deletion Vectors") that says where the DV's bytes live:

* ``'u'``: in a file next to the data, named after a UUID stored z85-encoded in
  ``pathOrInlineDv`` (optionally behind a short random directory prefix);
* ``'p'``: in a file at an absolute URI;
* ``'i'``: inline, the z85-encoded bytes themselves.

The bytes are a ``RoaringBitmapArray``: a 4-byte little-endian magic number
followed by a 64-bit roaring bitmap in the standard "portable" format. On disk
each DV is framed by a big-endian size and a big-endian CRC-32 (PROTOCOL.md,
appendix "Deletion Vector Format" / "Deletion Vector File Storage Format").

The roaring codec and z85 live in :mod:`deltaflow.table._roaring`.
"""

from __future__ import annotations

import re
import struct
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy.typing as npt
import pyarrow.fs as pafs

from deltaflow.table import _uri
from deltaflow.table._roaring import (
    PORTABLE_ROARING_MAGIC,
    RowIndexes,
    decode_uuid,
    deserialize_bitmap_array,
    encode_uuid,
    normalize_rows,
    serialize_bitmap_array,
    serialize_normalized,
    z85_decode,
    z85_encode,
)
from deltaflow.table.errors import CorruptTableError, TableError

__all__ = [
    "DV_FILE_FORMAT_VERSION",
    "PORTABLE_ROARING_MAGIC",
    "DeletionVectorDescriptor",
    "DeletionVectorError",
    "decode_uuid",
    "deserialize_bitmap_array",
    "encode_uuid",
    "inline_descriptor",
    "read_deleted_rows",
    "serialize_bitmap_array",
    "write_deletion_vector_file",
    "write_deletion_vectors",
    "z85_decode",
    "z85_encode",
]

StorageType = Literal["u", "i", "p"]

#: The only DV file format version the protocol defines.
DV_FILE_FORMAT_VERSION = 1
# Each DV in a file is preceded by its size and followed by its checksum.
_FRAME_OVERHEAD = 8
# A 'u' descriptor ends with a UUID whose 16 bytes always z85-encode to 20 characters.
_ENCODED_UUID_LENGTH = 20
# Delta's random prefixes are short alphanumeric directory names; anything else
# could escape the table directory or need URI escaping.
_PREFIX_RE = re.compile(r"[A-Za-z0-9]*")
_URI_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


class DeletionVectorError(CorruptTableError):
    """A deletion vector could not be read: missing, truncated, corrupt or unsupported.

    ``table_uri`` is the table it belongs to and ``path`` the DV file (``None``
    for inline DVs).
    """

    def __init__(self, message: str, *, table_uri: str, path: str | None) -> None:
        TableError.__init__(self, message, table_uri=table_uri, path=path)


# ------------------------------------------------------------------ descriptors


@dataclass(frozen=True)
class DeletionVectorDescriptor:
    """The ``deletionVector`` struct of an ``add``/``remove`` action."""

    storage_type: StorageType
    path_or_inline_dv: str
    #: Byte offset of the DV in its file; ``None`` for inline DVs.
    offset: int | None
    #: Size of the serialized bitmap (magic included), before framing or z85.
    size_in_bytes: int
    #: Number of deleted rows.
    cardinality: int

    def __post_init__(self) -> None:
        if self.storage_type not in ("u", "i", "p"):
            raise ValueError(f"unknown deletion vector storage type {self.storage_type!r}")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeletionVectorDescriptor:
        """Build from the log's camelCase JSON; unknown keys (e.g. ``maxRowIndex``) are ignored."""
        offset = d.get("offset")
        return cls(
            storage_type=cast(StorageType, d["storageType"]),
            path_or_inline_dv=str(d["pathOrInlineDv"]),
            offset=None if offset is None else int(offset),
            size_in_bytes=int(d["sizeInBytes"]),
            cardinality=int(d["cardinality"]),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        # The protocol says offset is absent (not null) for inline DVs.
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size_in_bytes
        out["cardinality"] = self.cardinality
        return out

    @property
    def unique_id(self) -> str:
        """The protocol's ``uniqueId``: tells apart two DVs of the same data file."""
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"

    @property
    def is_inline(self) -> bool:
        return self.storage_type == "i"

    def relative_path(self) -> str:
        """For ``'u'`` DVs, the file path relative to the table root."""
        if self.storage_type != "u":
            raise ValueError(f"storage type {self.storage_type!r} has no relative path")
        encoded = self.path_or_inline_dv
        if len(encoded) < _ENCODED_UUID_LENGTH:
            raise ValueError(f"invalid relative deletion vector path {encoded!r}")
        prefix = encoded[:-_ENCODED_UUID_LENGTH]
        dv_uuid = decode_uuid(encoded[-_ENCODED_UUID_LENGTH:])
        name = f"deletion_vector_{dv_uuid}.bin"
        return f"{prefix}/{name}" if prefix else name

    def absolute_path(self, table_uri: str) -> str:
        """The DV file's location: ``table_uri`` joined with the relative path, or the
        ``'p'`` path itself. Inline DVs have none (``ValueError``)."""
        if self.storage_type == "i":
            raise ValueError("an inline deletion vector has no file path")
        if self.storage_type == "p":
            return self.path_or_inline_dv
        return table_uri.rstrip("/") + "/" + self.relative_path()


def inline_descriptor(rows: Iterable[int] | npt.NDArray[Any]) -> DeletionVectorDescriptor:
    """A ``'i'`` descriptor carrying the rows in the log itself (for small DVs)."""
    values = normalize_rows(rows)
    data = serialize_normalized(values)
    return DeletionVectorDescriptor(
        storage_type="i",
        path_or_inline_dv=z85_encode(data),
        offset=None,
        size_in_bytes=len(data),
        cardinality=int(values.size),
    )


# ------------------------------------------------------------------- file I/O


def _filesystem(location: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    """Resolve a path or URI to a pyarrow filesystem and a path inside it."""
    if filesystem is not None:
        return filesystem, location
    if _URI_SCHEME_RE.match(location):
        return _uri.filesystem(location)  # s3a:// too, which pyarrow does not know
    # Not a URI (or a Windows drive letter): a local path, used as is so that
    # characters like '%' or '#' in directory names keep their literal meaning.
    return pafs.LocalFileSystem(), location


def read_deleted_rows(
    table_uri: str,
    descriptor: DeletionVectorDescriptor,
    *,
    filesystem: pafs.FileSystem | None = None,
) -> RowIndexes:
    """The deleted row indexes of one data file, as a sorted ``uint64`` array.

    ``table_uri`` is a local path or a URI (``file:///...``, ``s3://...``);
    ``filesystem``, if given, is used instead, with ``table_uri`` a path inside it.
    Raises :class:`DeletionVectorError` if the DV is missing or corrupt.
    """
    if descriptor.storage_type == "i":
        path = None
        try:
            data = z85_decode(descriptor.path_or_inline_dv, descriptor.size_in_bytes)
            rows = deserialize_bitmap_array(data)
        except ValueError as exc:
            raise DeletionVectorError(
                f"corrupt inline deletion vector in table {table_uri}: {exc}",
                table_uri=table_uri,
                path=None,
            ) from exc
    else:
        try:
            path = descriptor.absolute_path(table_uri)
        except ValueError as exc:
            raise DeletionVectorError(
                f"invalid deletion vector descriptor {descriptor.path_or_inline_dv!r} "
                f"in table {table_uri}: {exc}",
                table_uri=table_uri,
                path=None,
            ) from exc
        rows = _read_file_dv(table_uri, path, descriptor, filesystem)

    if rows.size != descriptor.cardinality:
        raise DeletionVectorError(
            f"deletion vector {path or 'inline'} holds {rows.size} rows but the log "
            f"says {descriptor.cardinality}",
            table_uri=table_uri,
            path=path,
        )
    return rows


def _read_file_dv(
    table_uri: str,
    path: str,
    descriptor: DeletionVectorDescriptor,
    filesystem: pafs.FileSystem | None,
) -> RowIndexes:
    def fail(reason: str) -> DeletionVectorError:
        return DeletionVectorError(
            f"cannot read deletion vector {path} of table {table_uri}: {reason}",
            table_uri=table_uri,
            path=path,
        )

    # 'p' paths are URIs of their own; 'u' paths live where the table does.
    fs_hint = None if descriptor.storage_type == "p" else filesystem
    try:
        fs, fs_path = _filesystem(path, fs_hint)
        with fs.open_input_file(fs_path) as handle:
            file_size = handle.size()
            version = handle.read_at(1, 0)
            # Offset 0 is the version byte, so an absent offset can only mean the
            # first DV, right after it (this is also how delta-kernel reads it).
            offset = 1 if descriptor.offset is None else descriptor.offset
            if offset < 1 or offset + 4 > file_size:
                raise fail(f"offset {offset} is outside the {file_size}-byte file")
            (data_size,) = struct.unpack(">I", handle.read_at(4, offset))
            if data_size != descriptor.size_in_bytes:
                raise fail(
                    f"size at offset {offset} is {data_size}, the log says "
                    f"{descriptor.size_in_bytes}"
                )
            if offset + _FRAME_OVERHEAD + data_size > file_size:
                raise fail("the file is truncated")
            framed = handle.read_at(data_size + 4, offset + 4)
    except FileNotFoundError as exc:
        raise fail("file not found") from exc
    except OSError as exc:
        raise fail(str(exc)) from exc

    if version != bytes([DV_FILE_FORMAT_VERSION]):
        raise fail(f"unsupported DV file format version {version!r}")
    data = framed[:data_size]
    (expected_crc,) = struct.unpack(">I", framed[data_size:])
    actual_crc = zlib.crc32(data)
    if actual_crc != expected_crc:
        raise fail(f"CRC-32 mismatch (stored {expected_crc:#010x}, computed {actual_crc:#010x})")
    try:
        return deserialize_bitmap_array(data)
    except ValueError as exc:
        raise fail(str(exc)) from exc


def write_deletion_vectors(
    table_uri: str,
    rows_per_dv: Sequence[Iterable[int] | npt.NDArray[Any]],
    *,
    prefix: str = "",
    filesystem: pafs.FileSystem | None = None,
) -> list[DeletionVectorDescriptor]:
    """Write several DVs into one new ``'u'`` file; one descriptor per input, in order.

    Packing the DVs of many data files into a single file (as Delta's own
    writers do per task) keeps the number of small objects down; each DV is
    addressed by its ``offset``. ``prefix`` is an optional alphanumeric
    subdirectory (Delta's "random prefix", which spreads object-store load).
    """
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"deletion vector prefix must be alphanumeric, got {prefix!r}")
    dv_uuid = uuid.uuid4()
    descriptor_path = prefix + encode_uuid(dv_uuid)

    chunks = [bytes([DV_FILE_FORMAT_VERSION])]
    position = 1
    descriptors = []
    for rows in rows_per_dv:
        values = normalize_rows(rows)
        data = serialize_normalized(values)
        chunks += [struct.pack(">I", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        descriptors.append(
            DeletionVectorDescriptor(
                storage_type="u",
                path_or_inline_dv=descriptor_path,
                offset=position,
                size_in_bytes=len(data),
                cardinality=int(values.size),
            )
        )
        position += len(data) + _FRAME_OVERHEAD
    if not descriptors:
        return []

    relative = descriptors[0].relative_path()
    if filesystem is not None:
        fs, path = filesystem, table_uri.rstrip("/") + "/" + relative
    else:
        fs, path = _filesystem(table_uri.rstrip("/") + "/" + relative, None)
    if prefix:
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    # A fresh UUID names the file, so no other writer can be writing it.
    with fs.open_output_stream(path) as out:
        out.write(b"".join(chunks))
    return descriptors


def write_deletion_vector_file(
    table_uri: str,
    rows: Iterable[int] | npt.NDArray[Any],
    prefix: str = "",
    *,
    filesystem: pafs.FileSystem | None = None,
) -> DeletionVectorDescriptor:
    """Write one DV to a new ``'u'`` file under ``table_uri`` and describe it."""
    return write_deletion_vectors(table_uri, [rows], prefix=prefix, filesystem=filesystem)[0]
