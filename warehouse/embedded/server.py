"""ClickHouse's HTTP interface in front of the engine's process, close enough that unmodified
clients (clickhouse-connect, clickhouse-go, curl, BI drivers) work. Who may do what is the
engine's business (execute.py, policy.py, engine_config.py), what it may touch the operating
system's (confine.py); this layer authenticates (auth.py), bounds what a request and its answer
may take (size, time, a slot, bytes waiting to be sent), keeps sessions per (user, session_id)
and answers in ClickHouse's words (respond.py). serve.py runs it."""

from __future__ import annotations

import hmac
import logging
import re
import uuid
from collections.abc import Callable, Mapping

from aiohttp import web

from gpugap.warehouse.embedded import allowed, auth, body, form, native, play, policy, scopes
from gpugap.warehouse.embedded.browser import BrowserGuard
from gpugap.warehouse.embedded.connection import literal, unliteral
from gpugap.warehouse.embedded.engine import EngineProcess
from gpugap.warehouse.embedded.engine_config import workload
from gpugap.warehouse.embedded.errors import EngineError
from gpugap.warehouse.embedded.execute import Call, Execution, Result
from gpugap.warehouse.embedded.limits import EndpointLimits
from gpugap.warehouse.embedded.respond import (
    SAFE_HEADERS,
    Context,
    Shape,
    choose_encoding,
    error,
    send,
)
from gpugap.warehouse.embedded.scopes import Scope
from gpugap.warehouse.embedded.sessions import Session, Sessions
from gpugap.warehouse.embedded.slots import Pending, Slots
from gpugap.warehouse.embedded.users import User, role

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


class Endpoint:
    def __init__(
        self,
        engine: EngineProcess,
        users: Mapping[str, User],
        limits: EndpointLimits,
        listen: str = "127.0.0.1",
        *,
        guarded: bool = True,
        warehouse: str | None = None,
    ) -> None:
        self.engine, self.users, self.limits = engine, users, limits
        # the database the scopes' row policies are written for (engine_config.py)
        self.warehouse = warehouse
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

    def _scope(self, user: User, header: str | None) -> Scope | None:
        """The request's scope (scopes.py): the user's own, or the narrower one its header
        asks for; none where the endpoint has no warehouse database to scope."""
        asked = scopes.parse_header(header) if header is not None else None
        found = scopes.narrowed(user.scope, asked)
        if found is not None and (not self.warehouse or not self.guarded):
            raise EngineError(
                "Not enough privileges: this endpoint scopes no reader (it was started with no "
                "warehouse database, GPUGAP_CLICKHOUSE_DATABASE)",
                497,
                "ACCESS_DENIED",
            )
        return found

    async def _execute(
        self,
        request: web.BaseRequest,
        user: User,
        shape: Shape,
        admit: Callable[[int], None],
    ) -> Result:
        params = request.query
        scope = self._scope(user, request.headers.get(scopes.HEADER))
        readonly = scope is not None or user.readonly or request.method in ("GET", "HEAD")
        readonly = readonly or params.get("readonly", "0") != "0"
        if (scope or user.readonly) and params.get("readonly") == "0":
            policy.check_setting("readonly", reader=True)
        settings: dict[str, str] = {}
        multipart = form.is_multipart(request)
        for name, value in params.items():
            if multipart and name.endswith(form.EXTERNAL_TABLE_SUFFIXES):
                continue  # an external table's description, as ClickHouse reads it there
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
            return await self._run(
                request, user, readonly, settings, session=session, admit=admit, scope=scope
            )
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
        scope: Scope | None = None,
    ) -> Result:
        params, headers = request.query, request.headers
        database = headers.get("X-ClickHouse-Database") or params.get("database") or None
        if scope is not None:  # its row policies are the warehouse database's
            if database not in (None, self.warehouse):
                raise EngineError(
                    f"Not enough privileges: a scoped reader reads the database "
                    f"{self.warehouse!r} only",
                    497,
                    "ACCESS_DENIED",
                )
            database = self.warehouse
        reads_as = "reader" if scope is not None else role(user)
        merged = {**(session.settings if session else {}), **settings}
        verify = merged.get("http_native_compression_disable_checksumming_on_decompress", "0")
        if form.is_multipart(request):  # the query and its parameters are the form's
            sent = await form.read(request, self.limits)
            url_query, stream, bind = "", form.once(sent.query.encode()), sent.params
        else:
            url_query, bind = params.get("query", ""), form.bind_params(params.items())
            stream = body.chunks(
                request,
                limit=self.limits.max_insert_bytes,
                what="the INSERT's data",
                timeout_s=self.limits.receive_timeout_s,
                unframe=params.get("decompress") in _TRUE,
                verify=verify.strip("'").lower() not in _TRUE,
            )
        call = Call(
            readonly=readonly,
            url_query=url_query,
            stream=stream,
            # the X-ClickHouse-Database and X-ClickHouse-Format headers win over the
            # parameters (HTTPHandler::processQuery)
            database=database,
            settings=merged,
            filters={k: unliteral(v) for k, v in merged.items() if k in allowed.FILTERS},
            params=bind,
            default_format=headers.get("X-ClickHouse-Format") or params.get("default_format"),
            revision=native.parse_revision(params.get("client_protocol_version")),
            # the engine's row policies read the role from it (engine_config.ROW_POLICIES)
            marker=f"gpugap:{reads_as}:{uuid.uuid4()}" + (f":{scope.marker()}" if scope else ""),
            workload=workload(reads_as) if self.guarded else "default",
            admit=admit,
            # a writer's session keeps its connection (temporary tables); a read-only request
            # runs on one of its own with the session's settings
            conn=await self.sessions.connection(session) if session and not readonly else None,
            transient=frozenset(settings) - frozenset(session.settings if session else ()),
            scoped_to=self.warehouse if scope is not None else None,
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


def _level(value: str | None) -> int:
    try:  # ClickHouse's default http_zlib_compression_level is 3; zlib takes -1..9
        return max(-1, min(9, int(value or 3)))
    except ValueError:
        raise EngineError(
            f"Cannot parse string '{value}' as Int64 (http_zlib_compression_level)",
            6,
            "CANNOT_PARSE_TEXT",
        ) from None
