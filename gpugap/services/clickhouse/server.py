"""ClickHouse's HTTP interface in front of the in-process engine, close enough that unmodified
clients (clickhouse-connect sync/async, curl, Grafana's and Superset's drivers) work."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import cramjam
import lz4.frame
from aiohttp import web

from . import body
from . import sql as q
from .engine import Engine, EngineError, Outcome

log = logging.getLogger(__name__)

# URL parameters that steer the HTTP layer rather than being engine settings.
TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "session_id",
        "session_timeout",
        "session_check",
        "query_id",
        "user",
        "password",
        "quota_key",
        "compress",
        "decompress",
        "enable_http_compression",
        "http_zlib_compression_level",
        "wait_end_of_query",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "client_protocol_version",
        "buffer_size",
        "cancel_http_readonly_queries_on_client_close",
        "readonly",
        "role",
        "http_response_buffer_size",
        "http_wait_end_of_query",
        "default_session_timeout",
    }
)
CONTENT_TYPES = {
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8",
    "CSVWithNames": "text/csv; charset=UTF-8",
}
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: bytes(cramjam.gzip.compress(b)),
    "deflate": lambda b: bytes(cramjam.zlib.compress(b)),
    "br": lambda b: bytes(cramjam.brotli.compress(b)),
    "zstd": lambda b: bytes(cramjam.zstd.compress(b)),
    "lz4": lz4.frame.compress,  # several times faster than cramjam's lz4 here
}
MAX_SESSIONS = 10_000
HTTP_STATUS = {  # ClickHouse's own mapping of exception codes to HTTP statuses
    194: 401,
    516: 401,
    164: 403,
    497: 403,
    60: 404,
    81: 404,
    46: 404,
    47: 404,
    115: 404,
    73: 404,
    62: 400,
    6: 400,
    26: 400,
    27: 400,
    33: 400,
    38: 400,
    41: 400,
    53: 400,
    72: 400,
    117: 400,
    43: 400,
    44: 400,
    36: 400,
    48: 501,
    159: 408,
    202: 503,
}


@dataclass(frozen=True)
class User:
    name: str
    password: str  # '' = no password
    readonly: bool = False


@dataclass
class Endpoint:
    engine: Engine
    users: Mapping[str, User]
    sessions: dict[str, dict[str, str]] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query_id = request.query.get("query_id") or str(uuid.uuid4())
        try:
            if request.path in ("/ping", "/ping/"):
                return web.Response(text="Ok.\n")
            if request.path not in ("/", "/query"):
                raise EngineError(f"There is no handle {request.path}", 36, "BAD_ARGUMENTS")
            user = self._authenticate(request)
            if request.method == "GET" and not request.query.get("query"):
                return web.Response(text="Ok.\n")
            outcome, fmt = await self._execute(request, user)
        except EngineError as exc:
            return self._error(exc, query_id)
        return self._respond(request, outcome, fmt, query_id)

    def _authenticate(self, request: web.Request) -> User:
        name = request.headers.get("X-ClickHouse-User") or request.query.get("user")
        password = request.headers.get("X-ClickHouse-Key") or request.query.get("password") or ""
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            try:
                name, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            except ValueError:
                raise EngineError(
                    "Malformed Authorization header", 516, "AUTHENTICATION_FAILED"
                ) from None
        name = name or "default"
        user = self.users.get(name)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            raise EngineError(
                f"{name}: Authentication failed: password is incorrect, or there "
                "is no user with such name",
                516,
                "AUTHENTICATION_FAILED",
            )
        return user

    async def _execute(self, request: web.Request, user: User) -> tuple[Outcome, str | None]:
        params = request.query
        if params.get("decompress") in ("1", "true"):
            raise EngineError(
                "ClickHouse-native block compression (decompress=1) is not "
                "supported; use Content-Encoding",
                48,
                "NOT_IMPLEMENTED",
            )
        database = params.get("database") or None
        sid = params.get("session_id")
        session = self.sessions.get(sid, {}) if sid else {}
        settings = {
            **session,
            **{
                k: _literal(v)
                for k, v in params.items()
                if k not in TRANSPORT_PARAMS and not k.startswith("param_")
            },
        }
        bound = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
        readonly = user.readonly or request.method == "GET" or params.get("readonly", "0") != "0"
        loop = asyncio.get_running_loop()
        url_query = params.get("query", "")
        stream = body.chunks(request)

        insert = q.insert_statement(url_query) if url_query else None
        if insert is not None:  # query in the URL, data in the body
            self._check(url_query, readonly)
            out = await self._insert(
                insert[0], insert[1], b"", rest=stream, database=database, settings=settings
            )
            return out, None
        first = await body.head(stream)
        inline = None if url_query else q.split_insert(first)
        if inline is not None:  # 'INSERT ... FORMAT X' then the data, in the body
            self._check(inline.statement, readonly)
            out = await self._insert(
                inline.statement,
                inline.fmt,
                inline.data,
                rest=stream,
                database=database,
                settings=settings,
            )
            return out, None
        data = first + b"".join([c async for c in stream])
        text = f"{url_query}\n{data.decode()}" if url_query and data else url_query or data.decode()
        self._check(text, readonly)
        if q.first_keyword(text) == "SET":
            await loop.run_in_executor(None, lambda: self._set(text, sid))
            return Outcome(), None
        out_fmt = q.trailing_format(text) or params.get("default_format") or "TabSeparated"
        out = await loop.run_in_executor(
            None,
            lambda: self.engine.query(
                q.strip_trailing_semicolon(text),
                out_fmt,
                database=database,
                settings=settings,
                params=bound,
            ),
        )
        returns_rows = q.first_keyword(text) in q.READ_KEYWORDS
        return out, out_fmt if returns_rows else None

    async def _insert(
        self,
        statement: str,
        fmt: str,
        first: bytes,
        *,
        rest: AsyncIterator[bytes],
        database: str | None,
        settings: Mapping[str, str],
    ) -> Outcome:
        """Stream the data into the engine while it arrives: the next chunk is read and
        decompressed while the engine parses the previous one."""
        loop = asyncio.get_running_loop()
        ins = await loop.run_in_executor(
            None,
            lambda: self.engine.begin_insert(statement, fmt, database=database, settings=settings),
        )
        pending: asyncio.Future[None] | None = None
        try:
            if first:
                pending = loop.run_in_executor(None, ins.append, first)
            async for chunk in rest:
                if pending is not None:
                    await pending
                pending = loop.run_in_executor(None, ins.append, chunk)
            if pending is not None:
                await pending
                pending = None
            return await loop.run_in_executor(None, ins.finish)
        except BaseException:
            # synchronous on purpose: even a cancelled request must hand the engine back
            # (cancel waits for an append still in flight, then releases the lock)
            ins.cancel()
            if pending is not None:  # its error, if any, is this one's consequence
                pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    @staticmethod
    def _check(text: str, readonly: bool) -> None:
        if not text.strip():
            raise EngineError("Empty query", 62, "SYNTAX_ERROR")
        if q.is_multi_statement(text):
            raise EngineError("Syntax error: Multi-statements are not allowed", 62, "SYNTAX_ERROR")
        if readonly and q.first_keyword(text) not in q.READ_KEYWORDS | {"SET"}:
            raise EngineError("Cannot execute query in readonly mode", 164, "READONLY")

    def _set(self, text: str, sid: str | None) -> None:
        pairs = dict(q.split_set(text))
        self.engine.query("SELECT 1", "TabSeparated", settings=pairs)  # validates the names
        if sid:  # like ClickHouse: a SET outside a session changes nothing after this request
            if sid not in self.sessions and len(self.sessions) >= MAX_SESSIONS:
                self.sessions.pop(next(iter(self.sessions)))  # the oldest session goes
            self.sessions.setdefault(sid, {}).update(pairs)

    def _respond(
        self, request: web.Request, out: Outcome, fmt: str | None, query_id: str
    ) -> web.Response:
        summary = {
            "read_rows": str(out.rows_read),
            "read_bytes": str(out.bytes_read),
            "written_rows": str(out.rows_written),
            "written_bytes": str(out.bytes_written),
            "total_rows_to_read": str(out.rows_read),
            "result_rows": str(out.result_rows),
            "result_bytes": str(len(out.data)),
            "elapsed_ns": str(int(out.elapsed_s * 1e9)),
        }
        headers = {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": "UTC",
            "X-ClickHouse-Summary": json.dumps(summary, separators=(",", ":")),
            "X-ClickHouse-Server-Display-Name": "gpugap-embedded",
        }
        content_type = "text/plain; charset=UTF-8"
        if fmt is not None:
            headers["X-ClickHouse-Format"] = fmt
            content_type = CONTENT_TYPES.get(
                fmt,
                "application/octet-stream"
                if fmt
                in (
                    "Native",
                    "RowBinary",
                    "Arrow",
                    "Parquet",
                    "ArrowStream",
                    "RowBinaryWithNamesAndTypes",
                )
                else content_type,
            )
        data = out.data
        if request.query.get("enable_http_compression") in ("1", "true") and data:
            accepted = [
                e.split(";")[0].strip().lower()
                for e in request.headers.get("Accept-Encoding", "").split(",")
            ]
            chosen = next((e for e in accepted if e in ENCODERS), None)
            if chosen:
                data = ENCODERS[chosen](data)
                headers["Content-Encoding"] = chosen
        return _response(data, headers, content_type)

    def _error(self, exc: EngineError, query_id: str) -> web.Response:
        body = f"{exc.message} (version {self.engine.version})\n"
        return web.Response(
            status=HTTP_STATUS.get(exc.code, 500),
            text=body,
            headers={
                "X-ClickHouse-Exception-Code": str(exc.code),
                "X-ClickHouse-Query-Id": query_id,
                "X-ClickHouse-Timezone": "UTC",
            },
        )


def _response(data: bytes, headers: dict[str, str], content_type: str) -> web.Response:
    resp = web.Response(body=data, headers=headers)
    resp.headers["Content-Type"] = content_type
    return resp


def _literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_app(engine: Engine, users: Mapping[str, User]) -> web.Application:
    endpoint = Endpoint(engine, users)
    # bodies are decompressed here for every encoding ClickHouse accepts, aiohttp knows fewer
    app = web.Application(client_max_size=4 << 30, handler_args={"auto_decompress": False})
    app.router.add_route("*", "/{tail:.*}", endpoint.handle)
    return app


def serve(
    path: Path, host: str, port: int, users: Mapping[str, User], ready_file: Path | None = None
) -> None:
    """Run until SIGTERM/SIGINT; then stop accepting, finish requests, close the engine."""
    engine = Engine(path)

    async def main() -> None:
        runner = web.AppRunner(build_app(engine, users), handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ready_file is not None:
            ready_file.write_text(f"{host}:{port}\n")
        print(f"clickhouse endpoint: http://{host}:{port} (data in {path})", flush=True)
        await stop.wait()
        await runner.cleanup()

    try:
        asyncio.run(main())
    finally:
        engine.close()
