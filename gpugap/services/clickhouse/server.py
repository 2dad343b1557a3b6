"""ClickHouse's HTTP interface in front of the in-process engine, close enough that unmodified
clients (clickhouse-connect, clickhouse-go, curl, BI drivers) work. Who may do what is the
engine's business (execute.py, policy.py, limits.py); this layer authenticates (auth.py), bounds
what a request may take before the engine sees it (size, time, a slot), keeps sessions per
(user, session_id) and answers in ClickHouse's words (respond.py)."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import re
import signal
import sys
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from gpugap.services.clickhouse import allowed, auth, body, native, password, play, policy
from gpugap.services.clickhouse.browser import BrowserGuard
from gpugap.services.clickhouse.engine import Engine, EngineError, literal, unliteral
from gpugap.services.clickhouse.execute import Call, Execution, Result
from gpugap.services.clickhouse.limits import (
    EndpointLimits,
    prepare_data_dir,
    workload,
    workloads,
    write_engine_config,
)
from gpugap.services.clickhouse.respond import (
    SAFE_HEADERS,
    Context,
    Shape,
    choose_encoding,
    error,
    send,
)
from gpugap.services.clickhouse.sessions import Session, Sessions
from gpugap.services.clickhouse.slots import Pending, Slots
from schemas.errors import ConfigError, ServiceError

log = logging.getLogger(__name__)

# URL parameters that steer the HTTP layer rather than being engine settings.
TRANSPORT_PARAMS = frozenset(
    {
        "query", "database", "default_format", "session_id", "session_timeout", "session_check",
        "query_id", "user", "password", "quota_key", "compress", "decompress", "close_session",
        "enable_http_compression", "wait_end_of_query", "send_progress_in_http_headers",
        "http_headers_progress_interval_ms", "client_protocol_version", "buffer_size",
        "cancel_http_readonly_queries_on_client_close", "readonly", "role", "stacktrace",
        "http_response_buffer_size", "http_wait_end_of_query", "default_session_timeout",
        # accepted and not applied: over HTTP the engine's own log reaches no client (and its
        # text, which a query can put newlines in, stays out of the endpoint's log)
        "send_logs_level",
    }
)  # fmt: skip
# answered without a login, like ClickHouse's static handlers: they hold no data
STATIC = {
    "/ping": ("Ok.\n", "text/plain"),
    "/replicas_status": ("Ok.\n", "text/plain"),
    "/play": (play.PAGE, "text/html"),
}
_SECRET_PARAM = re.compile(r"((?:^|[?&])(?:password|key)=)[^&]*", re.IGNORECASE)
_TRUE = ("1", "true")


@dataclass(frozen=True)
class User:
    name: str
    password: str  # '' = no password
    readonly: bool = False


class Endpoint:
    def __init__(
        self,
        engine: Engine,
        users: Mapping[str, User],
        limits: EndpointLimits,
        listen: str = "127.0.0.1",
        *,
        guarded: bool = True,
    ) -> None:
        self.engine, self.users, self.limits = engine, users, limits
        self.guarded = guarded  # False: every SQL-level check off (a test of the confinement)
        self.sessions = Sessions(engine, limits.max_sessions, limits.session_timeout_s)
        self.slots = Slots(limits, users)
        self.pending = Pending(limits.max_pending_bytes_for_user, limits.queue_wait_s)
        self.readings = policy.Readings()
        self.browser = BrowserGuard(
            listen, limits.names("allowed_hosts"), limits.names("allowed_origins")
        )
        conn = engine.connect()
        try:  # what the engine calls itself and its clock, for the headers ClickHouse sends
            tz, name = conn.query("SELECT timezone(), displayName()", "TSVRaw").data.split(b"\t")
        finally:
            conn.close()
        self.timezone, self.display_name = tz.decode(), name.decode().strip()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            self.browser.check(request.headers)
        except EngineError as exc:
            return error(exc, self.engine.version, None, Context("", self.timezone, ""))
        path = request.path.rstrip("/") or "/"
        if path in STATIC and request.method in ("GET", "HEAD"):
            text, kind = STATIC[path]
            return web.Response(text=text, content_type=kind, headers=SAFE_HEADERS)
        # ClickHouse's root handler: a bare GET / is a health check, answered without a login
        if path == "/" and request.method in ("GET", "HEAD") and not request.query_string:
            return web.Response(text="Ok.\n", headers=SAFE_HEADERS)
        params = request.query
        # the parameter wins over the header (HTTPHandler::processQuery)
        query_id = params.get("query_id") or request.headers.get("X-ClickHouse-Query-Id")
        query_id = query_id or str(uuid.uuid4())
        ctx = Context(query_id, self.timezone, self.display_name)
        shape: Shape | None = None
        try:
            if path not in ("/", "/query"):
                raise EngineError(f"There is no handle {request.path}", 36, "BAD_ARGUMENTS")
            user = self._authenticate(request)
            if request.method in ("GET", "HEAD") and not params.get("query"):
                return web.Response(text="Ok.\n", headers=SAFE_HEADERS)
            shape = Shape(
                encoding=choose_encoding(params, request.headers),
                level=_level(params.get("http_zlib_compression_level")),
                compress=params.get("compress") in _TRUE,
                revision=native.parse_revision(params.get("client_protocol_version")),
            )
            # the answer is produced, framed, compressed and sent in the user's slot, and its
            # bytes count against the user's until they are sent: a reader whose client does
            # not read holds its own slots and budget, nobody else's
            admitted = Admitted(self.pending, user.name)
            async with self.slots.held(user.name):
                try:
                    result = await self._execute(request, user, shape, admitted.take)
                    if result.settings.get("session_timezone"):
                        ctx.timezone = result.settings["session_timezone"].strip("'")
                    return await send(
                        request,
                        result.outcome,
                        result.fmt,
                        shape,
                        ctx,
                        timeout_s=self.limits.send_timeout_s,
                    )
                finally:
                    admitted.give_back()
        except EngineError as exc:
            return error(exc, self.engine.version, shape, ctx)

    def _authenticate(self, request: web.BaseRequest) -> User:
        name, password = auth.credentials(request.headers, request.query)
        user = self.users.get(name)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            raise auth.failed(
                f"{name}: Authentication failed: password is incorrect, or there "
                "is no user with such name"
            )
        return user

    async def _execute(
        self,
        request: web.BaseRequest,
        user: User,
        shape: Shape,
        admit: Callable[[int], None],
    ) -> Result:
        params = request.query
        readonly = user.readonly or request.method in ("GET", "HEAD")
        readonly = readonly or params.get("readonly", "0") != "0"
        if user.readonly and params.get("readonly") == "0":
            policy.check_setting("readonly", reader=True)
        settings: dict[str, str] = {}
        for name, value in params.items():
            if name and name not in TRANSPORT_PARAMS and not name.startswith("param_"):
                if self.guarded:
                    policy.check_setting(name, reader=readonly)
                settings[name] = literal(value)
        sid = params.get("session_id")
        session = None
        if sid:
            session = self.sessions.acquire(
                user.name,
                sid,
                check=params.get("session_check") in _TRUE,
                timeout=params.get("session_timeout"),
            )
        broken = False
        try:
            return await self._run(request, user, readonly, settings, session=session, admit=admit)
        except EngineError:
            raise
        except BaseException:  # cancelled, or the engine failed: the connection's state is unknown
            broken = True
            raise
        finally:
            if session is not None:
                self.sessions.release(session, broken=broken)

    async def _run(
        self,
        request: web.BaseRequest,
        user: User,
        readonly: bool,
        settings: dict[str, str],
        *,
        session: Session | None,
        admit: Callable[[int], None],
    ) -> Result:
        params, headers = request.query, request.headers
        merged = {**(session.settings if session else {}), **settings}
        verify = merged.get("http_native_compression_disable_checksumming_on_decompress", "0")
        call = Call(
            readonly=readonly,
            url_query=params.get("query", ""),
            stream=body.chunks(
                request,
                limit=self.limits.max_insert_bytes,
                what="the INSERT's data",
                timeout_s=self.limits.receive_timeout_s,
                unframe=params.get("decompress") in _TRUE,
                verify=verify.strip("'").lower() not in _TRUE,
            ),
            # the X-ClickHouse-Database and X-ClickHouse-Format headers win over the
            # parameters (HTTPHandler::processQuery)
            database=headers.get("X-ClickHouse-Database") or params.get("database") or None,
            settings=merged,
            filters={k: unliteral(v) for k, v in merged.items() if k in allowed.FILTERS},
            params={k[6:]: v for k, v in params.items() if k.startswith("param_")},
            default_format=headers.get("X-ClickHouse-Format") or params.get("default_format"),
            revision=native.parse_revision(params.get("client_protocol_version")),
            # the engine's row policies read the role from it (limits.ROW_POLICIES)
            marker=f"gpugap:{role(user)}:{uuid.uuid4()}",
            workload=workload(role(user)) if self.guarded else "default",
            admit=admit,
            # a writer's session keeps its connection (temporary tables); a read-only request
            # runs on one of its own with the session's settings
            conn=await self.sessions.connection(session) if session and not readonly else None,
            transient=frozenset(settings) - frozenset(session.settings if session else ()),
        )
        execution = Execution(
            self.engine, self.limits, call, guarded=self.guarded, readings=self.readings
        )
        result = await execution.run()
        result.settings = {**merged, **(result.set_settings or {})}
        if result.set_settings and session is not None:
            session.keep(result.set_settings)
        return result


class Admitted:
    """What one request's answer took of its user's bytes waiting to be sent."""

    def __init__(self, pending: Pending, user: str) -> None:
        self.pending, self.user, self.size = pending, user, 0

    def take(self, size: int) -> None:  # (from the engine call's worker thread)
        self.pending.take(self.user, size)
        self.size += size

    def give_back(self) -> None:
        if self.size:
            self.pending.give(self.user, self.size)
            self.size = 0


def role(user: User) -> str:
    return "reader" if user.readonly else "admin"


def _level(value: str | None) -> int:
    try:  # ClickHouse's default http_zlib_compression_level is 3; zlib takes -1..9
        return max(-1, min(9, int(value or 3)))
    except ValueError:
        raise EngineError(
            f"Cannot parse string '{value}' as Int64 (http_zlib_compression_level)",
            6,
            "CANNOT_PARSE_TEXT",
        ) from None


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


def _with_passwords(path: Path, users: Mapping[str, User]) -> dict[str, User]:
    """Every user with a password: one without gets the generated one (password.py)."""
    out = dict(users)
    for name, user in users.items():
        if user.password:
            continue
        secret, made = password.ensure(path)
        out[name] = replace(user, password=secret)
        where = password.password_file(path)
        if made and sys.stdout.isatty():  # once, where only the person who started it sees it
            print(f"clickhouse endpoint: user {name}'s password is {secret}", flush=True)
        print(
            f"clickhouse endpoint: user {name}'s password is in {where}"
            f"{' (generated now)' if made else ''}; clients: "
            f"GPUGAP_CLICKHOUSE_PASSWORD_FILE={where}",
            flush=True,
        )
    return out


def check_exposure(host: str, users: Mapping[str, User], insecure: bool) -> None:
    """No user without a password but when told so (``--insecure-no-password``), and then a
    listener beyond loopback says it loudly."""
    open_users = sorted(u.name for u in users.values() if not u.password)
    if not open_users:
        return
    if is_loopback(host):
        log.warning(
            "no password for %s (--insecure-no-password): any program of this machine, and "
            "any web page its browsers open that passes the Origin checks, is that user",
            ", ".join(open_users),
        )
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
    sql_guards: bool = True,
) -> None:
    """Run until SIGTERM/SIGINT; then stop accepting, finish requests, close the engine.
    ``sql_guards=False`` turns every SQL-level check and engine grant off: only a test that
    shows the engine process's confinement holds without them passes it."""
    limits = limits or EndpointLimits()
    if not insecure_no_password:
        users = _with_passwords(path, users)
    check_exposure(host, users, insecure_no_password)
    from groundfloor.settings import ServicesSettings

    cache = ServicesSettings().cache_dir / "chdb"
    config = write_engine_config(path / "gpugap-engine", limits, cache, guarded=sql_guards)
    if sql_guards:
        prepare_data_dir(path)
    roles = {role(u) for u in users.values()}
    startup = workloads(limits, roles) if sql_guards else []
    engine = Engine(path, config, confine=limits.confine, startup=startup)
    confinement = engine.confinement
    if not confinement["confined"]:
        log.warning(
            "the ClickHouse engine runs NOT fully confined (%s): SQL that passes the endpoint's "
            "checks could reach the host",
            "; ".join(confinement.get("problems") or [confinement["text"]]),
        )
    ended: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # engine calls, decompression and checks run in threads: enough for every slot
        executor = ThreadPoolExecutor(limits.max_concurrent_queries * 2 + 4, "clickhouse")
        loop.set_default_executor(executor)
        endpoint = Endpoint(engine, users, limits, host, guarded=sql_guards)
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

        def engine_ended(code: int) -> None:  # (from the engine's watcher thread)
            ended.append(code)
            loop.call_soon_threadsafe(stop.set)

        engine.on_exit = engine_ended
        if ready_file is not None:
            ready_file.write_text(f"{host}:{port}\n")
        print(
            f"clickhouse endpoint: http://{host}:{port} (data in {path}; engine: "
            f"{confinement['text']})",
            flush=True,
        )
        await stop.wait()
        await runner.cleanup()
        endpoint.sessions.close()
        executor.shutdown(wait=True, cancel_futures=True)

    try:
        asyncio.run(main())
    finally:
        engine.close()
    if ended:
        raise ServiceError(
            f"the ClickHouse engine process ended unexpectedly (exit status {ended[0]}): the "
            "endpoint stopped; the log above says why"
        )
