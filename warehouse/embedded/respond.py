"""Answers as ClickHouse sends them: the body framed for the client's Native revision, block
compressed for ``compress=1``, HTTP-encoded for ``enable_http_compression`` (in that order,
ClickHouse's layering), written piece by piece from a worker thread's output so that neither
a large result is held twice nor the event loop does the compressing; the headers say what
the engine did (X-ClickHouse-Summary) and in what terms (format, timezone, query id)."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from gpugap.warehouse.embedded import blocks
from gpugap.warehouse.embedded.connection import Outcome
from gpugap.warehouse.embedded.errors import EngineError

CONTENT_TYPES = {
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8",
    "CSVWithNames": "text/csv; charset=UTF-8",
}
BINARY_FORMATS = frozenset(
    {"Native", "RowBinary", "Arrow", "Parquet", "ArrowStream", "RowBinaryWithNamesAndTypes"}
)
HTTP_STATUS = {  # ClickHouse's own mapping of exception codes to HTTP statuses
    194: 401, 516: 401, 164: 403, 497: 403, 564: 403, 60: 404, 81: 404, 46: 404, 47: 404,
    115: 404, 73: 404, 62: 400, 6: 400, 26: 400, 27: 400, 33: 400, 38: 400, 41: 400, 53: 400,
    72: 400, 117: 400, 43: 400, 44: 400, 36: 400, 452: 400, 48: 501, 159: 408, 209: 408,
    202: 503, 241: 500,
}  # fmt: skip
WRITE = 1 << 20  # bytes handed to the socket at a time
# on every answer: a browser never takes one for a script or a style (browser.py)
SAFE_HEADERS = {"X-Content-Type-Options": "nosniff"}


class _Encoder(Protocol):
    def compress(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class _Zlib:
    def __init__(self, wbits: int, level: int) -> None:
        self._c = zlib.compressobj(level, zlib.DEFLATED, wbits)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data)

    def flush(self) -> bytes:
        return self._c.flush()


class _Brotli:
    def __init__(self) -> None:
        import brotli

        self._c = brotli.Compressor()

    def compress(self, data: bytes) -> bytes:
        return bytes(self._c.process(data))

    def flush(self) -> bytes:
        return bytes(self._c.finish())


class _Lz4:
    def __init__(self) -> None:
        import lz4.frame

        self._c = lz4.frame.LZ4FrameCompressor()
        self._head: bytes | None = self._c.begin()

    def compress(self, data: bytes) -> bytes:
        head, self._head = self._head or b"", None
        return head + bytes(self._c.compress(data))

    def flush(self) -> bytes:
        return (self._head or b"") + bytes(self._c.flush())


def _encoder(name: str, level: int) -> _Encoder | None:
    if name == "gzip":
        return _Zlib(16 + zlib.MAX_WBITS, level)
    if name == "deflate":
        return _Zlib(zlib.MAX_WBITS, level)
    if name == "br":
        return _Brotli()
    if name == "lz4":
        return _Lz4()
    if name == "zstd":
        from backports import zstd

        c = zstd.ZstdCompressor()
        return _Std(c.compress, c.flush)
    if name == "xz":
        import lzma

        x = lzma.LZMACompressor()
        return _Std(x.compress, x.flush)
    if name in ("bz2", "bzip2"):
        import bz2

        b = bz2.BZ2Compressor()
        return _Std(b.compress, b.flush)
    return None


@dataclass
class _Std:
    compress: Callable[[bytes], bytes]
    flush: Callable[[], bytes]


ENCODINGS = ("gzip", "deflate", "br", "zstd", "lz4", "xz", "bz2", "bzip2")


def choose_encoding(params: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """What ``enable_http_compression`` + Accept-Encoding ask for (the client's first that we
    have), or None."""
    if params.get("enable_http_compression") not in ("1", "true"):
        return None
    accepted = [
        e.split(";")[0].strip().lower() for e in headers.get("Accept-Encoding", "").split(",")
    ]
    return next((e for e in accepted if e in ENCODINGS), None)


@dataclass
class Shape:
    """How this request's answer is sent."""

    encoding: str | None = None  # HTTP Content-Encoding
    level: int = 3  # http_zlib_compression_level (ClickHouse's default 3)
    compress: bool = False  # compress=1: ClickHouse's block compression
    revision: int = 0  # client_protocol_version, for Native

    def pipeline(self, pieces: Iterable[bytes | memoryview]) -> tuple[Iterator[Any], bool]:
        """The body's pieces, and whether their sizes are those sent (no compression)."""
        out: Iterable[Any] = _coalesce(pieces)
        if self.compress:
            out = blocks.frames(out)
        encoder = _encoder(self.encoding, self.level) if self.encoding else None
        if encoder is not None:
            out = _encode(out, encoder)
        return iter(out), not (self.compress or encoder)


def _encode(pieces: Iterable[Any], encoder: _Encoder) -> Iterator[bytes]:
    for piece in pieces:
        if out := encoder.compress(bytes(piece)):
            yield out
    yield encoder.flush()


def _coalesce(pieces: Iterable[Any]) -> Iterator[Any]:
    """Many small pieces (the Native markers between column slices) as ~WRITE-byte writes."""
    buf = bytearray()
    for piece in pieces:
        if len(piece) >= WRITE:  # a column's data: sent in views of it, never copied
            if buf:
                yield bytes(buf)
                buf.clear()
            view = memoryview(piece)
            yield from (view[i : i + WRITE] for i in range(0, len(view), WRITE))
            continue
        buf += piece
        if len(buf) >= WRITE:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


@dataclass
class Context:
    query_id: str
    timezone: str
    display_name: str

    def headers(self) -> dict[str, str]:
        return {
            "X-ClickHouse-Query-Id": self.query_id,
            "X-ClickHouse-Timezone": self.timezone,
            "X-ClickHouse-Server-Display-Name": self.display_name,
        }


def summary(out: Outcome, result_rows: int | None = None) -> str:
    extra = out.extra
    fields = {
        "read_rows": out.rows_read,
        "read_bytes": out.bytes_read,
        "written_rows": out.rows_written,
        "written_bytes": out.bytes_written,
        "total_rows_to_read": extra.get("total_rows_to_read", out.rows_read),
        "result_rows": out.result_rows or result_rows or 0,
        "result_bytes": extra.get("result_bytes", len(out.data)),
        "elapsed_ns": int(out.elapsed_s * 1e9),
    }
    return json.dumps({k: str(v) for k, v in fields.items()}, separators=(",", ":"))


async def send(
    request: web.BaseRequest,
    out: Outcome,
    fmt: str | None,
    shape: Shape,
    ctx: Context,
    *,
    timeout_s: float,
) -> web.StreamResponse:
    """Send ``out``; a client that accepts nothing more for ``timeout_s`` is cut off."""
    loop = asyncio.get_running_loop()
    pieces: list[Any] = out.pieces if out.pieces is not None else [out.data] if out.data else []
    headers = {**ctx.headers(), "X-ClickHouse-Summary": summary(out)}
    content_type = "text/plain; charset=UTF-8"
    if fmt is not None:
        headers["X-ClickHouse-Format"] = fmt
        content_type = CONTENT_TYPES.get(
            fmt, "application/octet-stream" if fmt in BINARY_FORMATS else content_type
        )
    if shape.encoding and pieces:
        headers["Content-Encoding"] = shape.encoding
    body, plain = shape.pipeline(pieces) if pieces else (iter(()), True)
    resp = web.StreamResponse(headers={**headers, **SAFE_HEADERS, "Content-Type": content_type})
    if plain:
        resp.content_length = sum(len(p) for p in pieces)
    await resp.prepare(request)
    try:
        while (chunk := await loop.run_in_executor(None, next, body, None)) is not None:
            await asyncio.wait_for(resp.write(chunk), timeout_s)
        await asyncio.wait_for(resp.write_eof(), timeout_s)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()  # the connection goes, and the slot with it
        raise
    return resp


def error(exc: EngineError, version: str, shape: Shape | None, ctx: Context) -> web.Response:
    """ClickHouse's error answer; once the query's output is set up (``shape``), in the same
    compression as its data would have been (a clickhouse-go client reads it through that)."""
    body = f"{exc.message} (version {version})\n".encode()
    headers = {**ctx.headers(), "X-ClickHouse-Exception-Code": str(exc.code)}
    if shape is not None and (shape.compress or shape.encoding):
        pipeline, _ = Shape(shape.encoding, shape.level, shape.compress).pipeline([body])
        body = b"".join(bytes(p) for p in pipeline)
        if shape.encoding:
            headers["Content-Encoding"] = shape.encoding
    headers["Content-Type"] = "text/plain; charset=UTF-8"
    headers.update(SAFE_HEADERS)
    return web.Response(
        status=exc.status or HTTP_STATUS.get(exc.code, 500), body=body, headers=headers
    )
