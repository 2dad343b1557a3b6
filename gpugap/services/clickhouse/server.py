"""ClickHouse's HTTP interface in front of the in-process engine, close enough that unmodified
clients (clickhouse-connect sync/async, curl, Grafana's and Superset's drivers) work.

Who may do what is the engine's business (execute.py, policy.py, limits.py); this layer
authenticates, bounds what a request may take before the engine sees it (size, time, a slot),
keeps sessions per (user, session_id) and answers in ClickHouse's words."""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import logging
import re
import signal
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cramjam
import lz4.frame
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from gpugap.services.clickhouse import body, policy
from gpugap.services.clickhouse.engine import Engine, EngineError, Outcome, literal
from gpugap.services.clickhouse.execute import Call, Execution, Result
from gpugap.services.clickhouse.limits import EndpointLimits, write_engine_config
from schemas.errors import ConfigError

log = logging.getLogger(__name__)

# URL parameters that steer the HTTP layer rather than being engine settings.
TRANSPORT_PARAMS = frozenset(
    {
        "query", "database", "default_format", "session_id", "session_timeout", "session_check",
        "query_id", "user", "password", "quota_key", "compress", "decompress",
        "enable_http_compression", "http_zlib_compression_level", "wait_end_of_query",
        "send_progress_in_http_headers", "http_headers_progress_interval_ms",
        "client_protocol_version", "buffer_size", "cancel_http_readonly_queries_on_client_close",
        "readonly", "role", "http_response_buffer_size", "http_wait_end_of_query",
        "default_session_timeout",
    }
)  # fmt: skip
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
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: bytes(cramjam.gzip.compress(b)),
    "deflate": lambda b: bytes(cramjam.zlib.compress(b)),
    "br": lambda b: bytes(cramjam.brotli.compress(b)),
    "zstd": lambda b: bytes(cramjam.zstd.compress(b)),
    "lz4": lz4.frame.compress,  # several times faster than cramjam's lz4 here
}
HTTP_STATUS = {  # ClickHouse's own mapping of exception codes to HTTP statuses
    194: 401, 516: 401, 164: 403, 497: 403, 564: 403, 60: 404, 81: 404, 46: 404, 47: 404,
    115: 404, 73: 404, 62: 400, 6: 400, 26: 400, 27: 400, 33: 400, 38: 400, 41: 400, 53: 400,
    72: 400, 117: 400, 43: 400, 44: 400, 36: 400, 452: 400, 48: 501, 159: 408, 209: 408,
    202: 503, 241: 500,
}  # fmt: skip
_SECRET_PARAM = re.compile(r"((?:^|[?&])(?:password|key)=)[^&]*", re.IGNORECASE)


@dataclass(frozen=True)
class User:
    name: str
    password: str  # '' = no password
    readonly: bool = False


@dataclass
class Session:
    settings: dict[str, str] = field(default_factory=dict)
    used: float = field(default_factory=time.monotonic)


class Endpoint:
    def __init__(self, engine: Engine, users: Mapping[str, User], limits: EndpointLimits) -> None:
        self.engine, self.users, self.limits = engine, users, limits
        self.sessions: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self._slots = asyncio.Semaphore(limits.max_concurrent_queries)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        query_id = request.query.get("query_id") or str(uuid.uuid4())
        try:
            if request.path in ("/ping", "/ping/"):
                return web.Response(text="Ok.\n")
            if request.path not in ("/", "/query"):
                raise EngineError(f"There is no handle {request.path}", 36, "BAD_ARGUMENTS")
            user = self._authenticate(request)
            if request.method == "GET" and not request.query.get("query"):
                return web.Response(text="Ok.\n")
            try:
                await asyncio.wait_for(self._slots.acquire(), self.limits.queue_wait_s)
            except TimeoutError:
                raise EngineError(
                    f"Too many simultaneous queries: all {self.limits.max_concurrent_queries} "
                    f"slots stayed busy for {self.limits.queue_wait_s:g} s",
                    202,
                    "TOO_MANY_SIMULTANEOUS_QUERIES",
                ) from None
            try:
                result = await self._execute(request, user, query_id)
            finally:
                self._slots.release()
        except EngineError as exc:
            return self._error(exc, query_id)
        return self._respond(request, result.outcome, result.fmt, query_id)

    def _authenticate(self, request: web.BaseRequest) -> User:
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

    async def _execute(self, request: web.BaseRequest, user: User, query_id: str) -> Result:
        params = request.query
        if params.get("decompress") in ("1", "true"):
            raise EngineError(
                "ClickHouse-native block compression (decompress=1) is not "
                "supported; use Content-Encoding",
                48,
                "NOT_IMPLEMENTED",
            )
        readonly = user.readonly or request.method == "GET" or params.get("readonly", "0") != "0"
        if user.readonly and params.get("readonly") == "0":
            policy.check_setting("readonly", reader=True)
        settings: dict[str, str] = {}
        for name, value in params.items():
            if name not in TRANSPORT_PARAMS and not name.startswith("param_"):
                policy.check_setting(name, reader=readonly)
                settings[name] = literal(value)
        sid = params.get("session_id")
        session = self._session(user.name, sid) if sid else None
        call = Call(
            readonly=readonly,
            url_query=params.get("query", ""),
            stream=body.chunks(
                request,
                limit=self.limits.max_insert_bytes,
                what="the INSERT's data",
                timeout_s=self.limits.receive_timeout_s,
            ),
            database=params.get("database") or None,
            settings={**(session.settings if session else {}), **settings},
            params={k[6:]: v for k, v in params.items() if k.startswith("param_")},
            default_format=params.get("default_format"),
            marker=f"gpugap:{uuid.uuid4()}",
        )
        result = await Execution(self.engine, self.limits, call).run()
        if result.set_settings and session is not None:
            session.settings.update(result.set_settings)
        return result

    def _session(self, user: str, sid: str) -> Session:
        """Sessions belong to (user, id); idle ones end, the oldest goes when they are many."""
        now = time.monotonic()
        while self.sessions:
            oldest = next(iter(self.sessions.values()))
            if now - oldest.used < self.limits.session_timeout_s and len(self.sessions) < (
                self.limits.max_sessions
            ):
                break
            self.sessions.popitem(last=False)
        session = self.sessions.pop((user, sid), None) or Session()
        session.used = now
        self.sessions[(user, sid)] = session
        return session

    def _respond(
        self, request: web.BaseRequest, out: Outcome, fmt: str | None, query_id: str
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
                fmt, "application/octet-stream" if fmt in BINARY_FORMATS else content_type
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
        resp = web.Response(body=data, headers=headers)
        resp.headers["Content-Type"] = content_type
        return resp

    def _error(self, exc: EngineError, query_id: str) -> web.Response:
        text = f"{exc.message} (version {self.engine.version})\n"
        return web.Response(
            status=exc.status or HTTP_STATUS.get(exc.code, 500),
            text=text,
            headers={
                "X-ClickHouse-Exception-Code": str(exc.code),
                "X-ClickHouse-Query-Id": query_id,
                "X-ClickHouse-Timezone": "UTC",
            },
        )


class AccessLog(AbstractAccessLogger):
    """One line a request; passwords in the URL are masked."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        path = _SECRET_PARAM.sub(r"\1***", request.path_qs)
        self.logger.info(
            '%s "%s %s" %s %.3fs', request.remote, request.method, path, response.status, time
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, users: Mapping[str, User], insecure: bool) -> None:
    """A listener beyond loopback needs every user to have a password, unless told otherwise."""
    open_users = sorted(u.name for u in users.values() if not u.password)
    if is_loopback(host) or not open_users:
        return
    if insecure:
        log.warning(
            "listening on %s with no password for %s: anyone who reaches this address can "
            "read and change the warehouse",
            host,
            ", ".join(open_users),
        )
        return
    raise ConfigError(
        f"refusing to listen on {host} without a password for {', '.join(open_users)}: anyone "
        "who reaches that address could read and change the warehouse. Set "
        "GPUGAP_CLICKHOUSE_PASSWORD (or _PASSWORD_FILE), listen on 127.0.0.1, or pass "
        "--insecure-no-password if that is really wanted"
    )


def serve(
    path: Path,
    host: str,
    port: int,
    users: Mapping[str, User],
    *,
    ready_file: Path | None = None,
    limits: EndpointLimits | None = None,
    insecure_no_password: bool = False,
) -> None:
    """Run until SIGTERM/SIGINT; then stop accepting, finish requests, close the engine."""
    limits = limits or EndpointLimits()
    check_exposure(host, users, insecure_no_password)
    from gpugap.settings import ServicesSettings

    cache = ServicesSettings().cache_dir / "chdb"
    engine = Engine(path, write_engine_config(path / "gpugap-engine", limits, cache))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # engine calls, decompression and checks run in threads: enough for every slot
        executor = ThreadPoolExecutor(limits.max_concurrent_queries * 2 + 4, "clickhouse")
        loop.set_default_executor(executor)
        endpoint = Endpoint(engine, users, limits)
        server = web.Server(
            endpoint.handle,
            handler_cancellation=True,  # a client that goes away cancels its query
            # aiohttp's keep-alive timer also closes a connection whose request does not
            # arrive in time: the bound on slow headers
            keepalive_timeout=limits.receive_timeout_s,
            # after an answer to a body not read whole (refused, timed out), aiohttp reads and
            # drops the rest for this long before it closes (default 10 s)
            lingering_time=min(2.0, limits.receive_timeout_s),
            max_line_size=limits.max_uri_bytes,
            max_field_size=65536,
            auto_decompress=False,  # bodies are decompressed, bounded, in body.py
            access_log_class=AccessLog,
            access_log=logging.getLogger("aiohttp.access"),
        )
        runner = web.ServerRunner(server, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ready_file is not None:
            ready_file.write_text(f"{host}:{port}\n")
        print(f"clickhouse endpoint: http://{host}:{port} (data in {path})", flush=True)
        await stop.wait()
        await runner.cleanup()
        executor.shutdown(wait=True, cancel_futures=True)

    try:
        asyncio.run(main())
    finally:
        engine.close()
