"""Delta's ``RoaringBitmapArray`` codec and the Z85 encoding, in numpy.

A deletion vector's bytes are a ``RoaringBitmapArray``: a 4-byte little-endian magic
number followed by a 64-bit roaring bitmap in the standard "portable" format
(PROTOCOL.md, "Deletion Vector Format"); inline DVs and DV file names are Z85-encoded.
The codec is written with numpy instead of a roaring library: it runs inside Spark's
Python workers, where only the runtime dependencies (pyarrow, numpy) are guaranteed to
be installed. The tests cross-check it against pyroaring (CRoaring) and against delta-rs.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

#: Magic number of a ``RoaringBitmapArray`` in the 64-bit portable roaring format.
PORTABLE_ROARING_MAGIC = 1681511377
# Delta's JVM implementation also has a "native" serialization (magic - 1). The
# protocol never stores it, but naming it gives a better error if one shows up.
_NATIVE_ROARING_MAGIC = 1681511376
# Readers in Java read the 64-bit keys as signed, so Delta requires the most
# significant bit of every row index to be 0 (PROTOCOL.md, "Deletion Vector Format").
_MAX_ROW_INDEX = (1 << 63) - 1

# Roaring portable format constants (github.com/RoaringBitmap/RoaringFormatSpec).
_SERIAL_COOKIE_NO_RUNCONTAINER = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_CONTAINER_MAX = 4096
_BITSET_BYTES = 8192


# --------------------------------------------------------------------------- z85


# Delta uses the Z85 alphabet (https://rfc.zeromq.org/spec/32/) because it needs
# no escaping in JSON; the character set is Delta's Base85Codec.ENCODE_MAP.
_Z85_ALPHABET = (
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_Z85_ENCODE = np.frombuffer(_Z85_ALPHABET, dtype=np.uint8)
_Z85_DECODE = np.full(256, 255, dtype=np.uint8)
_Z85_DECODE[_Z85_ENCODE] = np.arange(85, dtype=np.uint8)
_Z85_POWERS = np.array([85**4, 85**3, 85**2, 85, 1], dtype=np.uint64)


def z85_encode(data: bytes) -> str:
    """Encode ``data`` with Delta's Z85 variant.

    Plain Z85 only accepts multiples of 4 bytes; Delta pads other lengths with
    zero bytes (``Base85Codec.encodeBytes``), and readers drop the padding using
    the length they know from elsewhere (``sizeInBytes`` for inline DVs).
    """
    padded = data + b"\x00" * (-len(data) % 4)
    words = np.frombuffer(padded, dtype=">u4").astype(np.uint64)
    digits = (words[:, None] // _Z85_POWERS) % 85
    encoded: bytes = _Z85_ENCODE[digits.ravel()].tobytes()
    return encoded.decode("ascii")


def z85_decode(text: str, length: int | None = None) -> bytes:
    """Decode Delta's Z85 variant; ``length`` drops the padding of unaligned input.

    Raises ``ValueError`` for text that no Z85 encoder can produce.
    """
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError("z85 text must be ASCII") from None
    if len(raw) % 5:
        raise ValueError(f"z85 text length must be a multiple of 5, got {len(raw)}")
    digits = _Z85_DECODE[np.frombuffer(raw, dtype=np.uint8)]
    if (digits == 255).any():
        raise ValueError("z85 text contains a character outside the Z85 alphabet")
    words = (digits.reshape(-1, 5).astype(np.uint64) * _Z85_POWERS).sum(axis=1)
    # Five base-85 digits can express values above 2**32 - 1; no encoder emits them.
    if (words > 0xFFFFFFFF).any():
        raise ValueError("z85 group encodes a value larger than 32 bits")
    decoded: bytes = words.astype(">u4").tobytes()
    if length is None:
        return decoded
    if not len(decoded) - 3 <= length <= len(decoded):
        raise ValueError(f"z85 text of {len(raw)} chars cannot hold exactly {length} bytes")
    return decoded[:length]


def encode_uuid(value: uuid.UUID) -> str:
    """The 20-character z85 form of a UUID (big-endian bytes, as Java's UUID)."""
    return z85_encode(value.bytes)


def decode_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=z85_decode(text, 16))


# -------------------------------------------------------------- roaring bitmaps


RowIndexes = npt.NDArray[np.uint64]


def normalize_rows(rows: Iterable[int] | npt.NDArray[Any]) -> RowIndexes:
    """Sorted, unique uint64 row indexes, rejecting values Delta cannot store."""
    if isinstance(rows, np.ndarray):
        if rows.dtype.kind not in "iu":
            raise TypeError(f"row indexes must be integers, got dtype {rows.dtype}")
        array = rows.ravel()
        if array.dtype.kind == "i" and array.size and int(array.min()) < 0:
            raise ValueError("row indexes must not be negative")
    else:
        try:
            array = np.fromiter((int(row) for row in rows), dtype=np.int64)
        except OverflowError:
            raise ValueError(f"row indexes must be at most {_MAX_ROW_INDEX}") from None
        if array.size and int(array.min()) < 0:
            raise ValueError("row indexes must not be negative")
    unique = np.unique(array.astype(np.uint64))
    if unique.size and int(unique[-1]) > _MAX_ROW_INDEX:
        raise ValueError(f"row indexes must be at most {_MAX_ROW_INDEX}")
    return unique


def _serialize_roaring32(values: npt.NDArray[np.uint32]) -> bytes:
    """One 32-bit roaring bitmap in the portable format, from sorted unique values.

    Each 2**16-value chunk becomes the smallest of the three container kinds,
    the choice CRoaring's ``run_optimize`` and the Java library make.
    """
    keys, starts = np.unique(values >> 16, return_index=True)
    bounds = [*starts.tolist(), values.size]
    kinds: list[str] = []
    cards: list[int] = []
    payloads: list[bytes] = []
    for i in range(keys.size):
        low = (values[bounds[i] : bounds[i + 1]] & 0xFFFF).astype(np.uint16)
        card = int(low.size)
        run_starts = np.flatnonzero(np.diff(low.astype(np.int32), prepend=-2) != 1)
        n_runs = int(run_starts.size)
        run_bytes = 2 + 4 * n_runs
        plain_bytes = 2 * card if card <= _ARRAY_CONTAINER_MAX else _BITSET_BYTES
        if run_bytes < plain_bytes:
            run_ends = np.append(run_starts[1:], card) - 1
            pairs = np.empty((n_runs, 2), dtype="<u2")
            pairs[:, 0] = low[run_starts]
            pairs[:, 1] = low[run_ends] - low[run_starts]  # stored as length - 1
            payloads.append(struct.pack("<H", n_runs) + pairs.tobytes())
            kinds.append("run")
        elif card <= _ARRAY_CONTAINER_MAX:
            payloads.append(low.astype("<u2").tobytes())
            kinds.append("array")
        else:
            bits = np.zeros(1 << 16, dtype=np.uint8)
            bits[low] = 1
            payloads.append(np.packbits(bits, bitorder="little").tobytes())
            kinds.append("bitset")
        cards.append(card)

    size = int(keys.size)
    has_runs = "run" in kinds
    header = bytearray()
    if has_runs:
        header += struct.pack("<I", _SERIAL_COOKIE | ((size - 1) << 16))
        flags = np.array([kind == "run" for kind in kinds], dtype=np.uint8)
        header += np.packbits(flags, bitorder="little").tobytes()
    else:
        header += struct.pack("<II", _SERIAL_COOKIE_NO_RUNCONTAINER, size)
    descriptive = np.empty((size, 2), dtype="<u2")
    descriptive[:, 0] = keys
    descriptive[:, 1] = np.array(cards, dtype=np.int64) - 1
    header += descriptive.tobytes()
    if not has_runs or size >= _NO_OFFSET_THRESHOLD:
        # Offsets let readers seek to one container; they count from the start
        # of this bitmap's serialization, header included.
        position = len(header) + 4 * size
        offsets = []
        for payload in payloads:
            offsets.append(position)
            position += len(payload)
        header += np.array(offsets, dtype="<u4").tobytes()
    return bytes(header) + b"".join(payloads)


class _Truncated(Exception):
    """Internal: the buffer ended inside a structure."""


def _take(buffer: memoryview, position: int, size: int) -> memoryview:
    if position + size > len(buffer):
        raise _Truncated
    return buffer[position : position + size]


def _deserialize_roaring32(buffer: memoryview, position: int) -> tuple[npt.NDArray[np.uint32], int]:
    """Parse one portable 32-bit roaring bitmap at ``position``; return values and end."""
    (cookie,) = struct.unpack("<I", _take(buffer, position, 4))
    position += 4
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        size = (cookie >> 16) + 1
        flag_bytes = (size + 7) // 8
        flags = np.frombuffer(_take(buffer, position, flag_bytes), dtype=np.uint8)
        is_run = np.unpackbits(flags, bitorder="little")[:size].astype(bool)
        position += flag_bytes
        has_offsets = size >= _NO_OFFSET_THRESHOLD
    elif cookie == _SERIAL_COOKIE_NO_RUNCONTAINER:
        (size,) = struct.unpack("<I", _take(buffer, position, 4))
        position += 4
        is_run = np.zeros(size, dtype=bool)
        has_offsets = True
    else:
        raise ValueError(f"unknown roaring cookie {cookie}")
    if size > 1 << 16:
        raise ValueError(f"roaring bitmap claims {size} containers, more than 2**16")
    descriptive = np.frombuffer(_take(buffer, position, 4 * size), dtype="<u2").reshape(size, 2)
    keys = descriptive[:, 0].astype(np.uint32)
    cards = descriptive[:, 1].astype(np.int64) + 1
    position += 4 * size
    if has_offsets:
        # Containers follow in order, so the offsets are redundant for a full read.
        position += 4 * size
    if size > 1 and not (np.diff(keys.astype(np.int64)) > 0).all():
        raise ValueError("roaring container keys are not strictly increasing")

    chunks: list[npt.NDArray[np.uint32]] = []
    for key, card, run in zip(keys.tolist(), cards.tolist(), is_run.tolist(), strict=True):
        if run:
            (n_runs,) = struct.unpack("<H", _take(buffer, position, 2))
            position += 2
            pairs = np.frombuffer(_take(buffer, position, 4 * n_runs), dtype="<u2")
            position += 4 * n_runs
            starts = pairs[0::2].astype(np.int64)
            lengths = pairs[1::2].astype(np.int64) + 1
            total = int(lengths.sum())
            # Expand runs without a Python loop: value = run start + offset in run.
            offsets = np.arange(total, dtype=np.int64) - np.repeat(
                np.cumsum(lengths) - lengths, lengths
            )
            low = np.repeat(starts, lengths) + offsets
            if total and int(low.max()) > 0xFFFF:
                raise ValueError("roaring run container overflows its 16-bit range")
        elif card <= _ARRAY_CONTAINER_MAX:
            low = np.frombuffer(_take(buffer, position, 2 * card), dtype="<u2").astype(np.int64)
            position += 2 * card
        else:
            bits = np.frombuffer(_take(buffer, position, _BITSET_BYTES), dtype=np.uint8)
            position += _BITSET_BYTES
            low = np.flatnonzero(np.unpackbits(bits, bitorder="little"))
        if low.size != card:
            raise ValueError(f"roaring container {key} holds {low.size} values, header says {card}")
        chunks.append(((key << 16) | low).astype(np.uint32))
    values = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.uint32)
    return values, position


def serialize_bitmap_array(rows: Iterable[int] | npt.NDArray[Any]) -> bytes:
    """Serialize row indexes as Delta's ``RoaringBitmapArray`` (magic + portable 64-bit).

    The result is what ``sizeInBytes`` counts and what the CRC-32 covers in a DV
    file, and what an inline DV z85-encodes.
    """
    return serialize_normalized(normalize_rows(rows))


def serialize_normalized(values: RowIndexes) -> bytes:
    highs = (values >> np.uint64(32)).astype(np.uint32)
    keys, starts = np.unique(highs, return_index=True)
    bounds = [*starts.tolist(), values.size]
    parts = [struct.pack("<Iq", PORTABLE_ROARING_MAGIC, int(keys.size))]
    for i, key in enumerate(keys.tolist()):
        low = (values[bounds[i] : bounds[i + 1]] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        parts.append(struct.pack("<I", key))
        parts.append(_serialize_roaring32(low))
    return b"".join(parts)


def deserialize_bitmap_array(data: bytes | memoryview) -> RowIndexes:
    """Parse a ``RoaringBitmapArray``; raises ``ValueError`` if it is malformed."""
    buffer = memoryview(data)
    try:
        if len(buffer) < 4:
            raise _Truncated
        (magic,) = struct.unpack("<I", buffer[:4])
        if magic == _NATIVE_ROARING_MAGIC:
            raise ValueError("the native RoaringBitmapArray serialization is not supported")
        if magic != PORTABLE_ROARING_MAGIC:
            raise ValueError(f"bad deletion vector magic number {magic}")
        (n_buckets,) = struct.unpack("<q", _take(buffer, 4, 8))
        if n_buckets < 0:
            raise ValueError(f"negative bucket count {n_buckets}")
        position = 12
        chunks: list[RowIndexes] = []
        previous = -1
        for _ in range(n_buckets):
            (key,) = struct.unpack("<I", _take(buffer, position, 4))
            if key <= previous or key > _MAX_ROW_INDEX >> 32:
                raise ValueError(f"invalid or unordered bucket key {key}")
            previous = key
            low, position = _deserialize_roaring32(buffer, position + 4)
            chunks.append((np.uint64(key) << np.uint64(32)) | low.astype(np.uint64))
    except _Truncated:
        raise ValueError("deletion vector bitmap is truncated") from None
    if position != len(buffer):
        raise ValueError(f"{len(buffer) - position} unexpected bytes after the bitmap")
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.uint64)
