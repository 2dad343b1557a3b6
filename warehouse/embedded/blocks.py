"""ClickHouse's own block compression over HTTP: ``compress=1`` answers, ``decompress=1`` bodies.

A frame is the CityHash128 (v1.0.2) of what follows (16 bytes: the hash's first half, then
its second, each little-endian), a method byte (0x02 none, 0x82 LZ4, 0x90 ZSTD), UInt32 size
of the compressed data including this 9-byte header, UInt32 size decompressed, the data.
ClickHouse's HTTP handler compresses answers with its default codec (LZ4) in frames of at most
1 MiB (its buffer size), whatever ``network_compression_method`` says.

A frame is decompressed whole (LZ4 blocks cannot be streamed), so its declared sizes are
bounded before anything is allocated: by the body's limit and by 128 MiB a frame (what
clickhouse-go and ch-go accept themselves; clients compress one Native block a frame).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import lz4.block
from clickhouse_cityhash.cityhash import CityHash128

from gpugap.warehouse.embedded.errors import EngineError


class TooLarge(EngineError):
    def __init__(self, what: str, limit: int) -> None:
        query = "query" in what
        super().__init__(
            f"{what} is larger than {limit} bytes (the endpoint's limit, GPUGAP_CLICKHOUSE_SERVE_"
            f"{'MAX_QUERY_BYTES' if query else 'MAX_INSERT_BYTES'})",
            62 if query else 241,
            "SYNTAX_ERROR" if query else "MEMORY_LIMIT_EXCEEDED",
        )
        self.status = 413


NONE, LZ4, ZSTD = 0x02, 0x82, 0x90
HEADER = 9  # method byte, two UInt32 sizes
FRAME_DATA = 1 << 20  # uncompressed bytes an answer's frame holds (DBMS_DEFAULT_BUFFER_SIZE)
MAX_FRAME = 128 << 20
PIECE = 1 << 20  # what a decompressed frame is handed on in
_MASK = (1 << 64) - 1


def checksum(framed: bytes | bytearray | memoryview) -> bytes:
    h = CityHash128(bytes(framed))
    return struct.pack("<QQ", h >> 64, h & _MASK)


def frame(data: bytes | bytearray | memoryview, method: int = LZ4) -> bytes:
    if method == LZ4:
        packed = lz4.block.compress(data, store_size=False)
    elif method == ZSTD:
        from backports import zstd

        packed = zstd.compress(bytes(data), 1)  # ClickHouse's default ZSTD level
    else:
        packed = bytes(data)
    head = struct.pack("<BII", method, len(packed) + HEADER, len(data))
    body = head + packed
    return checksum(body) + body


def frames(pieces: Iterable[bytes | memoryview], method: int = LZ4) -> Iterator[bytes]:
    """The pieces, compressed in frames of FRAME_DATA bytes (the last one shorter)."""
    buf = bytearray()
    for piece in pieces:
        view = memoryview(piece)
        while view:
            room = FRAME_DATA - len(buf)
            if not buf and len(view) >= FRAME_DATA:  # a whole frame straight from the piece
                yield frame(view[:FRAME_DATA], method)
                view = view[FRAME_DATA:]
                continue
            buf += view[:room]
            view = view[room:]
            if len(buf) == FRAME_DATA:
                yield frame(buf, method)
                buf.clear()
    if buf:
        yield frame(buf, method)


class Unframer:
    """A ``decompress=1`` body: compressed bytes in, decompressed pieces out, checked."""

    def __init__(self, limit: int, what: str, verify: bool = True) -> None:
        self.limit, self.what, self.verify = limit, what, verify
        self._buf = bytearray()
        self._total = 0  # decompressed so far

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._buf += data
        while len(self._buf) >= 16 + HEADER:
            method, size, plain = struct.unpack_from("<BII", self._buf, 16)
            self._check(method, size, plain)
            if len(self._buf) < 16 + size:
                return
            body = memoryview(self._buf)[16 : 16 + size]
            try:
                if self.verify and bytes(self._buf[:16]) != checksum(body):
                    raise _mismatch(bytes(self._buf[:16]), checksum(body), size)
                out = _decompress(method, body[HEADER:], plain)
            finally:
                body.release()
            del self._buf[: 16 + size]
            self._total += plain
            for i in range(0, len(out), PIECE):
                yield out[i : i + PIECE]

    def _check(self, method: int, size: int, plain: int) -> None:
        if method not in (NONE, LZ4, ZSTD):
            raise EngineError(f"Unknown codec family code: {method}", 432, "UNKNOWN_CODEC")
        if size > MAX_FRAME + HEADER or size < HEADER:
            raise EngineError(
                f"Too large size_compressed_without_checksum: {size}. Most likely corrupted data "
                f"(the embedded endpoint takes frames of up to {MAX_FRAME} bytes)",
                39,
                "TOO_LARGE_SIZE_COMPRESSED",
            )
        if plain > MAX_FRAME:
            raise EngineError(
                f"Too large size of decompressed block: {plain} (the embedded endpoint takes "
                f"frames of up to {MAX_FRAME} bytes)",
                39,
                "TOO_LARGE_SIZE_COMPRESSED",
            )
        if self._total + plain > self.limit:
            raise TooLarge(self.what, self.limit)

    def close(self) -> None:
        if self._buf:
            raise EngineError(
                f"Cannot read all data: the compressed body ends inside a frame "
                f"({len(self._buf)} bytes left over)",
                33,
                "CANNOT_READ_ALL_DATA",
            )


def _decompress(method: int, packed: memoryview, plain: int) -> bytes:
    try:
        if method == LZ4:
            out = lz4.block.decompress(packed, uncompressed_size=plain)
        elif method == ZSTD:
            from backports import zstd

            d = zstd.ZstdDecompressor()
            out = d.decompress(packed, max_length=plain)
            if not d.eof:
                raise ValueError("the zstd frame does not end where the block does")
        else:
            out = bytes(packed)
    except Exception as exc:  # the codecs' own errors: LZ4BlockError, ZstdError, ValueError
        raise EngineError(f"Cannot decompress: {exc}", 271, "CANNOT_DECOMPRESS") from None
    if len(out) != plain:
        raise EngineError(
            f"Cannot decompress: the block holds {len(out)} bytes, its header says {plain}",
            271,
            "CANNOT_DECOMPRESS",
        )
    return out


def _mismatch(reference: bytes, actual: bytes, size: int) -> EngineError:
    def hexed(sum16: bytes) -> str:  # ClickHouse prints the two halves as UInt64s
        first, second = struct.unpack("<QQ", sum16)
        return f"{first:016x}{second:016x}"

    return EngineError(
        f"Checksum doesn't match: corrupted data. Reference: {hexed(reference)}. Actual: "
        f"{hexed(actual)}. Size of compressed block: {size}",
        40,
        "CHECKSUM_DOESNT_MATCH",
    )
