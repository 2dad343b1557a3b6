"""``gpugap web``: the capacity-gap page over the warehouse views, on aiohttp.

- ``/`` is the page, ``/static/...`` its files: every asset ships in the package (the charting
  library included, gpugap/web/static/vendor/), nothing is loaded from anywhere else, and the
  Content-Security-Policy says so to the browser;
- ``/api/NAME?...`` runs the fixed queries of that name (``gpugap.web.api``) with the
  parameters validated and bound: no text from the browser reaches SQL;
- queries run as the read-only user (GPUGAP_CLICKHOUSE_READONLY_USER/_PASSWORD) when its
  password is set, else as the configured user in read-only mode (readonly=2), on a few
  threads of their own, each with its own ClickHouse client;
- it listens on 127.0.0.1 by default and answers only requests addressed to that host (a
  page elsewhere cannot reach it through DNS rebinding); GET and HEAD only;
- ``/metrics`` is the gap as Prometheus gauges (``gpugap.web.metrics``), ``/healthz`` liveness.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from importlib import resources
from typing import Any

from aiohttp import web

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas.errors import ConfigError, GpugapError
from gpugap.web import DEFAULT_PORT, api, decide, metrics, pages, params, team
from gpugap.web.queries import Query
from gpugap.web.signon.roles import Person
from gpugap.web.signon.routes import PERSON_KEY, SignOn
from gpugap.web.signon.settings import SignOnSettings

SCOPE_HEADER = "X-Gpugap-Scope"  # warehouse/embedded/scopes.HEADER

log = logging.getLogger("gpugap.web")

WORKERS = 9  # queries at once: the page asks nine things at once on each change
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
_POSTS = ("/auth/logout", "/api/decide")  # with sign-on, nothing else is ever written
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
          ".md": "text/plain", ".svg": "image/svg+xml", ".png": "image/png"}  # fmt: skip
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def reader(settings: ClickHouseSettings) -> ClickHouseSettings:
    """The settings the page queries with: the read-only user's where its password is set."""
    if settings.readonly_password is None:
        return settings
    return settings.model_copy(
        update={"user": settings.readonly_user, "password": settings.readonly_password}
    )


def assets() -> dict[str, bytes]:
    """Every file of the page, by its path under /static/ (read once, at start)."""
    out: dict[str, bytes] = {}

    def walk(node: Any, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif not child.name.startswith("."):
                out[prefix + child.name] = child.read_bytes()

    walk(resources.files("gpugap.web") / "static", "")
    return out


class Workers:
    """A few threads, each with its own ClickHouse client, running queries in turn; started at
    once and stopped with the server (never a thread per request)."""

    def __init__(self, settings: ClickHouseSettings, n: int = WORKERS) -> None:
        self.settings = settings
        self.jobs: queue.Queue[tuple[Query, Future[api.Rows], str | None] | None] = queue.Queue()
        self.threads = [
            threading.Thread(target=self._work, name=f"gpugap-web-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        from gpugap.warehouse.client import connect, run_query

        client: Any = None
        try:
            while (job := self.jobs.get()) is not None:
                q, fut, scope = job
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    if client is None:
                        client = connect(self.settings)
                    result = self._query(client, q, run_query, scope)
                    fut.set_result((list(result.column_names), list(result.result_rows)))
                except BaseException as exc:  # the caller gets it, the thread goes on
                    fut.set_exception(exc)
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()

    def _query(
        self, client: Any, q: Query, run_query: Callable[..., Any], scope: str | None = None
    ) -> Any:
        if self.settings.readonly_password is None and scope is None:  # readonly=2 on each
            return run_query(client, q.sql, q.params)
        # the read-only user may not even name the readonly setting (the endpoint refuses it),
        # and a scoped query is read-only whoever sends it (warehouse/embedded/scopes.py)
        from gpugap.warehouse.client import as_gpugap_error

        extra = {"transport_settings": {SCOPE_HEADER: scope}} if scope else {}
        try:
            return client.query(q.sql, parameters=q.params, **extra)
        except Exception as exc:
            raise as_gpugap_error(exc, self.settings.url) from None

    async def run(self, q: Query, scope: str | None = None) -> api.Rows:
        """``q``'s rows; narrowed by the endpoint to ``scope`` (a signed-in lead's or user's)."""
        fut: Future[api.Rows] = Future()
        self.jobs.put((q, fut, scope))
        return await asyncio.wrap_future(fut)

    def check_scopes(self) -> None:
        """Sign-on relies on the endpoint to narrow each person's queries: refuse to start
        where it would not (a ClickHouse server ignores the header and would show everyone
        everything)."""
        from gpugap.warehouse.client import connect

        client = connect(self.settings)
        try:
            marker = client.query(
                "SELECT getSetting('log_comment')",
                transport_settings={SCOPE_HEADER: "team=gpugap-scope-check"},
            ).result_rows[0][0]
        except Exception as exc:
            raise ConfigError(f"sign-on cannot check the warehouse's scopes: {exc}") from None
        finally:
            client.close()
        if ":team:" not in str(marker):
            raise ConfigError(
                "sign-on needs a warehouse that narrows each person's queries: "
                f"{self.settings.url} does not (gpugap's embedded endpoint does; for a ClickHouse "
                "server give each team a user of its own, "
                "docs/security.md#row-policies-on-a-clickhouse-server)"
            )

    def stop(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join(timeout=30)


WORKERS_KEY = web.AppKey("workers", Workers)
EXPORTER_KEY = web.AppKey("exporter", metrics.Exporter)


def _json(data: Any, status: int = 200) -> web.Response:
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return web.Response(text=body, status=status, content_type="application/json")


def make_app(  # noqa: PLR0915 (the routes' handlers, each a few lines, share its state)
    settings: ClickHouseSettings, host: str = "127.0.0.1", signon: SignOnSettings | None = None
) -> web.Application:
    """The page's application; its queries run as ``reader(settings)``, narrowed to each
    signed-in person's scope when ``signon`` is on (gpugap.web.signon)."""
    files = assets()
    loopback = host in _LOOPBACK or host.startswith("127.")
    gate = SignOn(signon) if signon is not None and signon.mode != "off" else None

    @web.middleware
    async def guard(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if gate is not None and request.method == "POST" and request.path in _POSTS:
            pass  # signing out, deciding a recommendation
        elif request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="GET only\n", headers={"Allow": "GET, HEAD"})
        if loopback and (request.url.host or "") not in _LOOPBACK | {host}:
            return web.Response(status=421, text="this page answers on the loopback only\n")
        response: web.StreamResponse = await handler(request)
        response.headers.update(HEADERS)
        return response

    middlewares = [guard] if gate is None else [guard, gate.middleware]
    app = web.Application(middlewares=middlewares, client_max_size=1024)

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=files["index.html"], content_type="text/html", charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = files.get(name)
        if body is None:
            raise web.HTTPNotFound()
        kind = _TYPES.get("." + name.rsplit(".", 1)[-1], "application/octet-stream")
        return web.Response(body=body, content_type=kind)

    async def query(request: web.Request) -> web.Response:
        if len(request.query_string) > 8192:
            return _json({"error": "the query string is too long"}, 414)
        given: dict[str, list[str]] = {}
        for k, v in request.query.items():
            given.setdefault(k, []).append(v)
        person: Person | None = request.get(PERSON_KEY)
        scope = person.scope if person is not None else None
        run = functools.partial(app[WORKERS_KEY].run, scope=scope)
        try:
            data = await api.answer(request.match_info["name"], given, run)
        except params.BadRequest as exc:
            return _json({"error": str(exc)}, 400)
        except api.NotFound:
            return _json({"error": f"no query named {request.match_info['name'][:40]!r}"}, 404)
        except GpugapError as exc:
            log.warning("query %s: %s", request.match_info["name"], exc)
            return _json({"error": str(exc)}, 502)
        return _json(data)

    async def run_scoped(q: Query, scope: str | None) -> api.Rows:
        return await app[WORKERS_KEY].run(q, scope)  # (the workers start with the app)

    async def nobody(request: web.Request) -> web.Response:
        return _json({"mode": "off"})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def prometheus(request: web.Request) -> web.Response:
        text = await app[EXPORTER_KEY].text()
        return web.Response(text=text, headers={"Content-Type": metrics.CONTENT_TYPE})

    async def start(app: web.Application) -> None:
        app[WORKERS_KEY] = Workers(reader(settings))
        if gate is not None:
            try:
                await asyncio.to_thread(app[WORKERS_KEY].check_scopes)
            except BaseException:  # (no cleanup runs after a failed start)
                await asyncio.to_thread(app[WORKERS_KEY].stop)
                raise
        app[EXPORTER_KEY] = metrics.Exporter(app[WORKERS_KEY].run)

    async def stop(app: web.Application) -> None:
        await asyncio.to_thread(app[WORKERS_KEY].stop)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/", index)
    pages.add_routes(app, files)  # /job
    app.router.add_get("/healthz", health)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/static/{name:[A-Za-z0-9_./-]+}", static)
    if gate is None:  # the page asks who it shows itself to: nobody in particular
        app.router.add_get("/api/whoami", nobody)
    else:  # (before /api/{name}: these are their own)
        gate.add_routes(app)
        decide.add_routes(app, settings, run_scoped)
        team.add_routes(app, run_scoped)
    app.router.add_get("/api/{name:[a-z_]{1,40}}", query)
    return app


async def serve_until(app: web.Application, host: str, port: int, stop: asyncio.Event,
                 started: Callable[[int], None]) -> None:  # fmt: skip
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    started(sockets[0].getsockname()[1] if sockets else port)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def url_for(host: str, port: int) -> str:
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def serve(
    settings: ClickHouseSettings,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    signon: SignOnSettings | None = None,
) -> None:
    """Run until SIGTERM/SIGINT."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        def started(p: int) -> None:
            print(f"capacity-gap page: {url_for(host, p)}", flush=True)

        await serve_until(make_app(settings, host, signon), host, port, stop, started)

    asyncio.run(main())
