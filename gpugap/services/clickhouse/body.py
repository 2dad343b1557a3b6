"""Request bodies as a stream of decompressed chunks, so a large INSERT is parsed by the
engine while it is still arriving instead of after it was buffered and decompressed whole."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from typing import Any

import cramjam
from aiohttp import web

from .engine import EngineError

CHUNK = 1 << 20
# whole-body codecs: fine for the sizes that use them (clickhouse-connect defaults to lz4)
WHOLE = {"br": cramjam.brotli, "zstd": cramjam.zstd}


def _streaming(encoding: str) -> Any:
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.LZ4FrameDecompressor()
    if encoding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    return None


async def chunks(request: web.Request) -> AsyncIterator[bytes]:
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    raw = request.content.iter_chunked(CHUNK)
    if not encoding or encoding == "identity":
        async for chunk in raw:
            yield chunk
        return
    try:
        if encoding in WHOLE:
            data = b"".join([c async for c in raw])
            if data:
                yield bytes(WHOLE[encoding].decompress(data))
            return
        decoder = _streaming(encoding)
        if decoder is None:
            raise EngineError(f"Unknown HTTP content encoding: {encoding}", 48, "NOT_IMPLEMENTED")
        loop = asyncio.get_running_loop()
        fed = False  # the current frame has input: it must end before the body does
        async for chunk in raw:
            data = chunk
            # a body may be several frames (clickhouse-connect compresses block by block) or
            # gzip members back to back: each one ends, the next starts on the leftover bytes
            while data:
                # in a worker thread: the previous chunk is being parsed by the engine in
                # another one meanwhile (both release the GIL), the loop keeps receiving
                out = await loop.run_in_executor(None, decoder.decompress, data)
                fed = True
                if out:
                    yield out
                if not decoder.eof:
                    break
                data = decoder.unused_data
                decoder, fed = _streaming(encoding), False
        if fed and not decoder.eof:
            raise EngineError(
                f"The {encoding} request body ends inside a frame (truncated)", 432, "UNKNOWN_CODEC"
            )
    except EngineError:
        raise
    except Exception as exc:
        raise EngineError(
            f"Cannot decompress {encoding} request body: {exc}", 432, "UNKNOWN_CODEC"
        ) from None


async def head(stream: AsyncIterator[bytes], limit: int = 65536) -> bytes:
    """At least ``limit`` bytes from the stream (all of it if shorter)."""
    buf = bytearray()
    while len(buf) < limit:
        try:
            buf += await anext(stream)
        except StopAsyncIteration:
            break
    return bytes(buf)
