"""Sign-on in the page's application: who asks (a session or the trusted proxy), the login,
its callback and logout, and ``/api/whoami``. Every other path but the page's static files and
``/healthz`` needs a person with a role; ``/metrics`` (every team's figures) answers only the
configured scrapers' addresses."""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gpugap.web.signon import proxy
from gpugap.web.signon.oidc import LoginFailed, Provider
from gpugap.web.signon.roles import NoRole, Person, person
from gpugap.web.signon.sessions import COOKIE, LOGIN_COOKIE, LOGIN_TTL_S, Sessions
from gpugap.web.signon.settings import SignOnSettings

log = logging.getLogger("gpugap.web.signon")

PERSON_KEY = web.RequestKey("person", Person)
OPEN_PATHS = ("/healthz", "/auth/login", "/auth/callback", "/auth/logout")
_LOCAL_PATH = re.compile(r"^/(?![/\\])[A-Za-z0-9_./?=&%-]{0,500}$")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _page(title: str, text: str, status: int, link: str | None = None) -> web.Response:
    more = f'<p><a href="{html.escape(link)}">Sign in</a></p>' if link else ""
    body = (
        f"<!doctype html><title>{html.escape(title)}</title><h1>{html.escape(title)}</h1>"
        f"<p>{html.escape(text)}</p>{more}"
    )
    return web.Response(
        text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"}
    )


class SignOn:
    def __init__(self, settings: SignOnSettings) -> None:
        self.settings = settings
        self.sessions = Sessions(settings.session_ttl_s, settings.max_sessions)
        self.provider = Provider(settings) if settings.mode == "oidc" else None

    def _cookie_options(self, path: str = "/") -> dict[str, Any]:
        return {"httponly": True, "samesite": "Lax", "secure": self.settings.secure_cookies,
                "path": path}  # fmt: skip

    def who(self, request: web.Request) -> Person | None:
        """The person asking; None when not signed in. Raises proxy.Forged, NoRole."""
        if self.settings.mode == "proxy":
            return proxy.identity(self.settings, request.remote, request.headers)
        return self.sessions.find(request.cookies.get(COOKIE))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in OPEN_PATHS or path.startswith("/static/"):
            return await handler(request)
        if path == "/metrics":
            if request.remote not in self.settings.metrics_clients:
                return web.Response(status=403, text="/metrics answers its scrapers only\n")
            return await handler(request)
        api = path.startswith("/api/")
        try:
            found = self.who(request)
        except proxy.Forged as exc:
            log.warning("refused: %s", exc)
            return _refuse(api, 403, "identity headers are accepted from the proxy only")
        except NoRole as exc:
            return _refuse(api, 403, str(exc))
        if found is None:
            if api:  # (the page's script goes there, and comes back)
                login = {"login": "/auth/login"} if self.settings.mode == "oidc" else {}
                return web.json_response({"error": "sign in first", **login}, status=401)
            if self.settings.mode == "proxy":
                return _page("Sign in", "Sign in through the site's proxy.", 401)
            raise web.HTTPSeeOther(f"/auth/login?next={_next(request.path_qs)}")
        request[PERSON_KEY] = found
        return await handler(request)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/auth/login", self.login)
        app.router.add_get("/auth/callback", self.callback)
        app.router.add_post("/auth/logout", self.logout)
        app.router.add_get("/api/whoami", self.whoami)

    async def login(self, request: web.Request) -> web.StreamResponse:
        if self.provider is None:
            return _page("Sign in", "Sign in through the site's proxy.", 404)
        wanted = request.query.get("next", "/")
        pending, cookie = self.sessions.begin_login(wanted if _LOCAL_PATH.match(wanted) else "/")
        try:
            url = await self.provider.login_url(pending)
        except (LoginFailed, OSError, KeyError, ValueError) as exc:
            log.warning("cannot reach the identity provider: %s", exc)
            return _page("Sign-in unavailable", "The identity provider cannot be reached.", 503)
        response = web.HTTPSeeOther(url, headers={"Cache-Control": "no-store"})
        response.set_cookie(LOGIN_COOKIE, cookie, max_age=LOGIN_TTL_S,
                            **self._cookie_options("/auth/"))  # fmt: skip
        raise response

    async def callback(self, request: web.Request) -> web.StreamResponse:
        if self.provider is None:
            return _page("Sign in", "Sign in through the site's proxy.", 404)
        if "error" in request.query:
            error = re.sub(r"[^a-z_]", "", request.query.get("error", ""))[:64]
            return _page(
                "Not signed in", f"The identity provider said: {error}.", 403, "/auth/login"
            )
        pending = self.sessions.take_login(
            request.query.get("state", ""), request.cookies.get(LOGIN_COOKIE)
        )
        if pending is None:
            return _page(
                "Not signed in",
                "This login was not started in this browser, was used already or has expired.",
                400,
                "/auth/login",
            )
        try:
            claims = await self.provider.finish(request.query.get("code", ""), pending)
            signed_in = person(self.settings, claims.user, claims.email, claims.groups)
        except LoginFailed as exc:
            log.warning("login refused: %s", exc)
            return _page("Not signed in", str(exc), 403, "/auth/login")
        except NoRole as exc:
            return _page("No access", str(exc), 403)
        except (OSError, KeyError, ValueError) as exc:
            log.warning("login failed: %s", type(exc).__name__)
            return _page("Sign-in unavailable", "The identity provider cannot be reached.", 503)
        cookie, lifetime = self.sessions.start(signed_in, claims.expires_at)
        response = web.HTTPSeeOther(pending.next_path, headers={"Cache-Control": "no-store"})
        response.set_cookie(COOKIE, cookie, max_age=int(lifetime), **self._cookie_options())
        response.del_cookie(LOGIN_COOKIE, path="/auth/")
        log.info("%s signed in as %s%s", signed_in.user, signed_in.role,
                 f" of {signed_in.team}" if signed_in.team else "")  # fmt: skip
        raise response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        site = request.headers.get("Sec-Fetch-Site")
        if site not in (None, "same-origin", "none"):
            return web.Response(status=403, text="sign out from the page itself\n")
        if self.settings.mode == "proxy":
            raise web.HTTPSeeOther("/oauth2/sign_out")
        self.sessions.end(request.cookies.get(COOKIE))
        response = _page("Signed out", "You are signed out of gpugap.", 200, "/auth/login")
        response.del_cookie(COOKIE, path="/")
        return response

    async def whoami(self, request: web.Request) -> web.StreamResponse:
        found: Person | None = request.get(PERSON_KEY)
        if found is None:  # (the middleware lets nobody without one reach here)
            return web.json_response({"error": "sign in first"}, status=401)
        return web.json_response({**found.public(), "mode": self.settings.mode})


def _next(path_qs: str) -> str:
    import urllib.parse

    return urllib.parse.quote(path_qs if _LOCAL_PATH.match(path_qs) else "/", safe="")


def _refuse(api: bool, status: int, message: str) -> web.StreamResponse:
    if api:
        return web.json_response({"error": message}, status=status)
    return _page("No access", message, status)
