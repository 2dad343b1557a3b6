"""A real OpenID Connect provider for the sign-on tests: Ory Hydra (built by
tests/harness/signon_build.py) on free loopback ports with its in-memory database, and the
login and consent app Hydra sends people to, served from a thread of the test process.

Hydra itself keeps no users: it redirects to ``URLS_LOGIN`` with a challenge, and whoever serves
that page accepts the login through Hydra's admin API, naming the subject; then the same for
consent, where the ID token's claims are set. The app here is that page, over a table of users
the test gives: a form (``#username``, ``#password``, ``#login``), the password checked against
the table, consent granted to whatever the client asked, logout accepted.

Configuration goes in a file (JSON is YAML) rather than Hydra's environment variables, which
the test process's environment would otherwise leak into.
"""

from __future__ import annotations

import html
import json
import secrets
import shutil
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

from gpugap.services.kafka import free_port
from tests.harness.prom_process import PromProcess

SCOPES = "openid email profile groups offline_access"
#: a request to Hydra: CI's machine runs three test files at once beside the builds, and one
#: discovery after start took more than 5 s there
HTTP_TIMEOUT_S = 60


class User(NamedTuple):
    password: str
    email: str
    groups: Sequence[str]
    name: str


class Hydra(PromProcess):
    """``with Hydra(exe, {"ada": ("pw", "ada@example.org", ["ml"], "Ada L")}) as hydra:``;
    token lifetimes in seconds (a test that wants tokens to expire gives a few)."""

    name = "Ory Hydra"
    poll_s = 0.1

    def __init__(
        self,
        exe: Path,
        users: Mapping[str, tuple[str, str, Sequence[str], str]],
        *,
        access_token_ttl_s: float = 3600,
        id_token_ttl_s: float = 3600,
        refresh_token_ttl_s: float = 86400,
        remember: bool = True,
        root: Path | None = None,
    ) -> None:
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="gpugap-hydra-"))
        self.root.mkdir(parents=True, exist_ok=True)
        super().__init__(exe, self.root / "hydra.log")
        self.users = {name: User(*user) for name, user in users.items()}
        #: whether Hydra remembers a login (a later sign-in skips the form until logout)
        self.remember = remember
        self.admin_port = free_port()
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.issuer = f"{self.url}/"  # replaced by what discovery says, once started
        #: every username whose password the form accepted, in order
        self.logins: list[str] = []
        #: the login, consent and logout pages Hydra sends people to, served from a thread
        self.login_port = free_port()
        self.login_url = f"http://127.0.0.1:{self.login_port}"
        self._app: tuple[ThreadingHTTPServer, threading.Thread] | None = None
        self._ttl = (access_token_ttl_s, id_token_ttl_s, refresh_token_ttl_s)
        self.config = self.root / "hydra.json"
        self._write_config()

    def _write_config(self) -> None:
        access_token_ttl_s, id_token_ttl_s, refresh_token_ttl_s = self._ttl
        app = self.login_url
        config = {
            "dsn": "memory",
            "serve": {"public": {"host": "127.0.0.1", "port": self.port},
                      "admin": {"host": "127.0.0.1", "port": self.admin_port}},
            "urls": {"self": {"issuer": self.issuer}, "login": f"{app}/login",
                     "consent": f"{app}/consent", "logout": f"{app}/logout",
                     "error": f"{app}/error", "post_logout_redirect": f"{app}/logged-out"},
            "secrets": {"system": [secrets.token_hex(32)]},
            "ttl": {"access_token": f"{access_token_ttl_s:g}s", "id_token": f"{id_token_ttl_s:g}s",
                    "refresh_token": f"{refresh_token_ttl_s:g}s"},
            "oauth2": {"expose_internal_errors": True},
            "log": {"level": "warn", "format": "text"},
        }  # fmt: skip
        self.config = self.root / "hydra.json"
        self.config.write_text(json.dumps(config, indent=2))

    def args(self) -> list[str]:
        # --dev: an http issuer on loopback, cookies without Secure
        return ["serve", "all", "--dev", "--sqa-opt-out", "--config", str(self.config)]

    def start(self, timeout_s: float = 60.0) -> None:
        pages = type("Pages", (_Pages,), {"hydra": self})
        server = ThreadingHTTPServer(("127.0.0.1", self.login_port), pages)
        server.daemon_threads = False  # server_close() joins the requests' threads
        serve = threading.Thread(target=server.serve_forever, args=(0.1,), name="hydra-login")
        serve.start()
        self._app = (server, serve)
        try:
            for attempt in range(3):
                try:
                    super().start(timeout_s)
                    break
                except RuntimeError as exc:
                    # a free port taken in between (another test's client, an outgoing
                    # connection's ephemeral port): again, on others
                    if "address already in use" not in str(exc) or attempt == 2:
                        raise
                    self.port, self.admin_port = free_port(), free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    self.admin_url = f"http://127.0.0.1:{self.admin_port}"
                    self.issuer = f"{self.url}/"
                    self._write_config()
            self.issuer = self.discovery()["issuer"]
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.admin_url}/health/ready", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        super().stop()
        app, self._app = self._app, None
        if app is not None:
            app[0].shutdown()
            app[0].server_close()
            app[1].join(timeout=10)

    def close(self) -> None:
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def discovery(self) -> dict[str, Any]:
        """``/.well-known/openid-configuration``."""
        # (generous: the first answer makes Hydra's signing keys, slow on a loaded machine)
        url = f"{self.url}/.well-known/openid-configuration"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as r:
            out: dict[str, Any] = json.load(r)
        return out

    def add_client(
        self, redirect_uris: Sequence[str], *, public: bool = False
    ) -> tuple[str, str | None]:
        """A new OAuth2 client: ``(client_id, client_secret)``, the secret None for a public
        client (PKCE, no secret). A confidential one authenticates with HTTP Basic only: Hydra
        takes one ``token_endpoint_auth_method`` per client."""
        body = {
            "redirect_uris": list(redirect_uris),
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "scope": SCOPES,
            "token_endpoint_auth_method": "none" if public else "client_secret_basic",
        }
        client = self.admin("POST", "/admin/clients", body)
        return client["client_id"], None if public else client["client_secret"]

    def admin(self, method: str, path: str, body: object | None = None) -> Any:
        """One admin API call: its JSON answer; RuntimeError with Hydra's message on an error."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.admin_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as r:
                raw = r.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:2000]
            raise RuntimeError(f"Hydra {method} {path}: {error.code} {detail}") from error
        return json.loads(raw) if raw else None

    def claims(self, username: str) -> dict[str, Any]:
        """The ID token's claims for ``username`` (``sub`` is the login's subject: the name)."""
        user = self.users[username]
        return {
            "preferred_username": username,
            "email": user.email,
            "email_verified": True,
            "name": user.name,
            "groups": list(user.groups),
        }


FORM = """<!doctype html>
<html><head><meta charset="utf-8"><title>Sign in</title></head>
<body><h1>Sign in</h1>{error}
<form method="post" action="/login">
<input type="hidden" name="login_challenge" value="{challenge}">
<label for="username">Username</label> <input id="username" name="username" value="{username}">
<label for="password">Password</label> <input id="password" name="password" type="password">
<button id="login" type="submit">Sign in</button>
</form></body></html>
"""


class _Pages(BaseHTTPRequestHandler):
    hydra: Hydra
    timeout = 10  # a client that stops sending does not hold a thread
    MAX_BODY = 16384

    def log_message(self, format: str, *args: Any) -> None:
        with open(self.hydra.root / "login-app.log", "a") as log:
            log.write(f"{self.address_string()} {format % args}\n")

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        try:
            if url.path == "/login":
                self._login_page(query.get("login_challenge", ""))
            elif url.path == "/consent":
                self._consent(query.get("consent_challenge", ""))
            elif url.path == "/logout":
                challenge = query.get("logout_challenge", "")
                self._redirect(self._flow("logout", challenge, "/accept")["redirect_to"])
            elif url.path == "/logged-out":
                self._html(200, "<!doctype html><title>Signed out</title><p>Signed out.</p>")
            elif url.path == "/error":
                text = html.escape(f"{query.get('error')}: {query.get('error_description')}")
                self._html(200, f"<!doctype html><title>Error</title><p id='error'>{text}</p>")
            else:
                self._html(404, "not found")
        except RuntimeError as error:
            self._html(502, f"<p id='error'>{html.escape(str(error))}</p>")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if urllib.parse.urlsplit(self.path).path != "/login" or length > self.MAX_BODY:
            self._html(400, "bad request")
            return
        form = urllib.parse.parse_qs(self.rfile.read(length).decode(errors="replace"))
        challenge, username, password = (
            form.get(key, [""])[0] for key in ("login_challenge", "username", "password")
        )
        user = self.hydra.users.get(username)
        if user is None or not secrets.compare_digest(user.password, password):
            error = '<p id="error">Wrong username or password.</p>'
            self._html(200, _form(challenge, username, error))
            return
        try:
            self._accept_login(challenge, username, status=303)
            self.hydra.logins.append(username)
        except RuntimeError as error:
            self._html(502, f"<p id='error'>{html.escape(str(error))}</p>")

    def _flow(self, kind: str, challenge: str, action: str = "", body: object = None) -> Any:
        """Hydra's login/consent/logout request ``challenge`` (GET), or ``action`` on it (PUT)."""
        path = f"/admin/oauth2/auth/requests/{kind}{action}?{kind}_challenge="
        method = "PUT" if action else "GET"
        return self.hydra.admin(method, path + urllib.parse.quote(challenge), body)

    def _login_page(self, challenge: str) -> None:
        request = self._flow("login", challenge)
        if request.get("skip"):  # Hydra remembers this browser's login: no form
            self._accept_login(challenge, request["subject"])
        else:
            self._html(200, _form(challenge, "", ""))

    def _accept_login(self, challenge: str, subject: str, status: int = 302) -> None:
        body = {"subject": subject, "remember": self.hydra.remember, "remember_for": 0}
        self._redirect(self._flow("login", challenge, "/accept", body)["redirect_to"], status)

    def _consent(self, challenge: str) -> None:
        request = self._flow("consent", challenge)
        body = {
            "grant_scope": request.get("requested_scope") or [],
            "grant_access_token_audience": request.get("requested_access_token_audience") or [],
            "remember": False,
            "session": {"id_token": self.hydra.claims(request["subject"])},
        }
        self._redirect(self._flow("consent", challenge, "/accept", body)["redirect_to"])

    def _redirect(self, location: str, status: int = 302) -> None:
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _html(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _form(challenge: str, username: str, error: str) -> str:
    return FORM.format(
        challenge=html.escape(challenge), username=html.escape(username), error=error
    )
