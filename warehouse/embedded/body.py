"""Request bodies as a stream of decompressed chunks, each bounded in size, read with a timeout
and counted against a limit, so neither a huge body, a slow one nor a decompression bomb can hold
memory or a slot: a large INSERT is parsed by the engine while it is still arriving."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, Protocol

from aiohttp import web

from gpugap.warehouse.embedded import blocks
from gpugap.warehouse.embedded.errors import EngineError

CHUNK = 1 << 20  # raw bytes per read, and decompressed bytes per step


# re-exported: the endpoint's one error for a body past its limit
TooLarge = blocks.TooLarge


class _Frames(Protocol):  # the decompressors, behind one face
    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...

    def step(self, data: bytes) -> bytes: ...
    def more(self) -> bool: ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._d = zlib.decompressobj(wbits)

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    def step(self, data: bytes) -> bytes:
        return self._d.decompress(self._d.unconsumed_tail + data, CHUNK)

    def more(self) -> bool:
        return bool(self._d.unconsumed_tail) and not self._d.eof


class _Std:  # lz4.frame and backports.zstd share the bz2/lzma interface
    def __init__(self, d: Any) -> None:
        self._d = d

    @property
    def eof(self) -> bool:
        return bool(self._d.eof)

    @property
    def unused_data(self) -> bytes:
        return bytes(self._d.unused_data or b"")

    def step(self, data: bytes) -> bytes:
        return bytes(self._d.decompress(data, CHUNK))

    def more(self) -> bool:
        return not self._d.needs_input and not self._d.eof


class _Brotli:
    def __init__(self) -> None:
        import brotli

        self._d = brotli.Decompressor()

    @property
    def unused_data(self) -> bytes:
        return b""

    @property
    def eof(self) -> bool:
        return bool(self._d.is_finished())

    def step(self, data: bytes) -> bytes:
        return bytes(self._d.process(data, output_buffer_limit=CHUNK))

    def more(self) -> bool:
        return not self._d.can_accept_more_data() and not self._d.is_finished()


def _factory(encoding: str) -> Callable[[], _Frames] | None:
    if encoding == "gzip":
        return lambda: _Zlib(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return lambda: _Zlib(zlib.MAX_WBITS)
    if encoding == "lz4":
        import lz4.frame

        return lambda: _Std(lz4.frame.LZ4FrameDecompressor())
    if encoding == "zstd":
        from backports import zstd

        return lambda: _Std(zstd.ZstdDecompressor())
    if encoding == "br":
        return _Brotli
    if encoding == "xz":
        import lzma

        return lambda: _Std(lzma.LZMADecompressor())
    if encoding in ("bz2", "bzip2"):
        import bz2

        return lambda: _Std(bz2.BZ2Decompressor())
    return None


class Inflater:
    """One body's decoder: bytes in, pieces of at most ~CHUNK bytes out. A body may be several
    frames (clickhouse-connect compresses block by block) or gzip members back to back."""

    def __init__(self, encoding: str) -> None:
        make = _factory(encoding)
        if make is None:
            raise EngineError(f"Unknown HTTP content encoding: {encoding}", 48, "NOT_IMPLEMENTED")
        self.encoding, self._make = encoding, make
        self._d = make()
        self._fed = False  # the current frame has input: it must end before the body does

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data or self._d.more():
            out = self._d.step(data)
            self._fed = self._fed or bool(data)
            data = b""
            if out:
                yield out
            if self._d.eof:
                data = self._d.unused_data
                self._d, self._fed = self._make(), False

    def close(self) -> None:
        if self._fed and not self._d.eof:
            raise EngineError(
                f"The {self.encoding} request body ends inside a frame (truncated)",
                432,
                "UNKNOWN_CODEC",
            )


async def chunks(
    request: web.BaseRequest,
    *,
    limit: int,
    what: str,
    timeout_s: float,
    executor: Executor | None = None,
    unframe: bool = False,
    verify: bool = True,
) -> AsyncIterator[bytes]:
    """The decompressed body, chunk by chunk; TooLarge past ``limit`` bytes (decompressed), a
    timeout when the client sends nothing for ``timeout_s``. With ``unframe`` (decompress=1)
    the body, once its Content-Encoding is undone, is ClickHouse's block compression
    (blocks.py): frames checked against their checksums unless ``verify`` is off."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    inflater = None if encoding in ("", "identity") else Inflater(encoding)
    unframer = blocks.Unframer(limit, what, verify) if unframe else None

    def decode(chunk: bytes) -> Iterator[bytes]:
        pieces = inflater.feed(chunk) if inflater is not None else iter((chunk,))
        if unframer is None:
            yield from pieces
            return
        for piece in pieces:
            yield from unframer.feed(piece)

    loop = asyncio.get_running_loop()
    raw = request.content
    total = 0
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(raw.read(CHUNK), timeout_s)
            except TimeoutError:
                raise EngineError(
                    f"Timeout exceeded while reading the request body ({timeout_s:g} s without "
                    "data; GPUGAP_CLICKHOUSE_SERVE_RECEIVE_TIMEOUT_S)",
                    209,
                    "SOCKET_TIMEOUT",
                ) from None
            if not chunk:
                break
            if inflater is None and unframer is None:
                total += len(chunk)
                if total > limit:
                    raise TooLarge(what, limit)
                yield chunk
                continue
            # piece by piece, off the event loop (decompression is CPU work and releases the
            # GIL): a bomb never has more than one piece in memory before the limit stops it
            pieces = decode(chunk)
            while (piece := await loop.run_in_executor(executor, next, pieces, None)) is not None:
                total += len(piece)
                if total > limit:
                    raise TooLarge(what, limit)
                yield piece
        if inflater is not None:
            inflater.close()
        if unframer is not None:
            unframer.close()
    except EngineError:
        raise
    except Exception as exc:
        raise EngineError(
            f"Cannot decompress {encoding or 'the'} request body: {exc}", 432, "UNKNOWN_CODEC"
        ) from None


async def head(stream: AsyncIterator[bytes], limit: int) -> bytes:
    """At least ``limit`` bytes from the stream (all of it if shorter)."""
    buf = bytearray()
    while len(buf) < limit:
        try:
            buf += await anext(stream)
        except StopAsyncIteration:
            break
    return bytes(buf)
