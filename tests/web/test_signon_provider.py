"""The sign-on tests' provider and proxy, proven with real protocol flows and no browser: an
authorization-code flow with PKCE against Ory Hydra through its login form (tests/harness/
hydra.py), its ID token's signature checked against Hydra's published keys, and oauth2-proxy
(tests/harness/oauth2_proxy.py) signing a person in and passing who they are to an upstream.

The two programs are built from the Go module proxy on first use (tests/harness/
signon_build.py; .ci/run starts that build in the background): a build that fails fails these
tests."""

from __future__ import annotations

import base64
import hashlib
import http.cookiejar
import json
import re
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpugap.services.kafka import free_port
from tests.harness.hydra import Hydra
from tests.harness.oauth2_proxy import OAuth2Proxy
from tests.harness.signon_build import ensure_hydra, ensure_oauth2_proxy

# on a fresh machine the first test waits for the build .ci/run started in the background
# (~4 min alone on 2 cores, longer beside the tests): past the suite's 600 s per test
pytestmark = pytest.mark.timeout(1800)

PASSWORD = "correct horse battery"
USERS = {
    "ada": (PASSWORD, "ada@example.org", ["gpu-admins", "ml research"], "Ada Lovelace"),
    "bob": ("bobs secret", "bob@example.org", [], "Bob"),
}


@pytest.fixture
def hydra(tmp_path: Path) -> Iterator[Hydra]:
    with Hydra(ensure_hydra(), USERS, root=tmp_path / "hydra") as provider:
        yield provider


class Browser:
    """Cookies and redirects by hand (urllib's opener, told not to follow): each hop seen."""

    def __init__(self) -> None:
        self.cookies = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirects()
        )

    def send(
        self, url: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, str]:
        """(status, Location or the request's URL, body) of one request."""
        data = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(url, data=data, headers=headers or {})
        try:
            with self._opener.open(request, timeout=60) as r:
                return r.status, url, r.read().decode()
        except urllib.error.HTTPError as answer:  # 3xx and errors alike
            body = answer.read().decode(errors="replace")
            location = answer.headers.get("Location")
            return answer.code, urllib.parse.urljoin(url, location) if location else url, body

    def follow(self, url: str, until: str = "", **kwargs: Any) -> tuple[int, str, str]:
        """Follow redirects from ``url`` (a POST first, with ``form``) to an answer that is not
        one, or to a redirect to a URL starting with ``until``."""
        status, where, body = self.send(url, **kwargs)
        for _ in range(20):
            if status not in (301, 302, 303, 307) or (until and where.startswith(until)):
                return status, where, body
            status, where, body = self.send(where, headers=kwargs.get("headers"))
        raise AssertionError(f"more than 20 redirects, at {where}")

    def sign_in(
        self, url: str, username: str, password: str, until: str = ""
    ) -> tuple[int, str, str]:
        """Follow ``url`` to the login form, fill it in, and follow on from its answer."""
        status, form_url, page = self.follow(url)
        assert status == 200 and 'id="login"' in page, (status, form_url, page[:500])
        challenge = re.search(r'name="login_challenge" value="([^"]*)"', page)
        assert challenge is not None, page
        form = {"login_challenge": challenge[1], "username": username, "password": password}
        return self.follow(urllib.parse.urljoin(form_url, "/login"), until, form=form)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verified_claims(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """The claims of an RS256 JWT whose signature one of ``jwks``'s keys checks (RSASSA-PKCS1
    v1.5 with SHA-256, RFC 8017 8.2.2, in plain integers: no JOSE library needed)."""
    head, payload, signature = token.split(".")
    header = json.loads(_b64(head))
    assert header["alg"] == "RS256", header
    key = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    n, e = (int.from_bytes(_b64(key[part]), "big") for part in ("n", "e"))
    size = (n.bit_length() + 7) // 8
    decoded = pow(int.from_bytes(_b64(signature), "big"), e, n).to_bytes(size, "big")
    digest_info = bytes.fromhex("3031300d060960864801650304020105000420")
    digest = hashlib.sha256(f"{head}.{payload}".encode()).digest()
    padding = b"\xff" * (size - 3 - len(digest_info) - len(digest))
    assert decoded == b"\x00\x01" + padding + b"\x00" + digest_info + digest, "bad signature"
    claims: dict[str, Any] = json.loads(_b64(payload))
    return claims


def fetch_json(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.load(r)


class Client:
    """One OAuth2 client of Hydra's, and the authorization-code flow with PKCE it starts."""

    def __init__(self, hydra: Hydra, *, public: bool) -> None:
        self.redirect_uri = f"http://127.0.0.1:{free_port()}/callback"  # never served: captured
        self.id, self.secret = hydra.add_client([self.redirect_uri], public=public)
        self.endpoints = hydra.discovery()

    def authorize_url(self, state: str, nonce: str, verifier: str) -> str:
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        return self.endpoints["authorization_endpoint"] + "?" + urllib.parse.urlencode({
            "response_type": "code",
            "client_id": self.id,
            "redirect_uri": self.redirect_uri,
            "scope": "openid email profile groups offline_access",
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge.rstrip(b"=").decode(),
            "code_challenge_method": "S256",
        })  # fmt: skip

    def token(self, grant: dict[str, str]) -> dict[str, Any]:
        """A token endpoint answer: HTTP Basic for a confidential client, else its id."""
        form, auth = dict(grant), {}
        if self.secret is None:
            form["client_id"] = self.id
        else:
            basic = base64.b64encode(f"{self.id}:{self.secret}".encode()).decode()
            auth["Authorization"] = f"Basic {basic}"
        out: dict[str, Any] = fetch_json(
            self.endpoints["token_endpoint"], urllib.parse.urlencode(form).encode(), auth
        )
        return out

    def userinfo(self, access_token: str) -> dict[str, Any]:
        bearer = {"Authorization": f"Bearer {access_token}"}
        out: dict[str, Any] = fetch_json(self.endpoints["userinfo_endpoint"], headers=bearer)
        return out

    def id_token_claims(self, tokens: dict[str, Any]) -> dict[str, Any]:
        return verified_claims(tokens["id_token"], fetch_json(self.endpoints["jwks_uri"]))

    def sign_in(self, username: str, password: str) -> tuple[dict[str, Any], str]:
        """Tokens after signing in on the form, and the nonce the ID token must carry."""
        verifier, state, nonce = (secrets.token_urlsafe(n) for n in (48, 16, 16))
        where = Browser().sign_in(self.authorize_url(state, nonce, verifier), username,
                                  password, until=self.redirect_uri)[1]  # fmt: skip
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(where).query))
        assert where.startswith(self.redirect_uri) and query["state"] == state, where
        grant = {"grant_type": "authorization_code", "code": query["code"],
                 "redirect_uri": self.redirect_uri, "code_verifier": verifier}  # fmt: skip
        return self.token(grant), nonce


@pytest.mark.parametrize("public", [False, True], ids=["confidential", "public"])
def test_code_flow_with_pkce_signs_in_through_the_form(hydra: Hydra, public: bool) -> None:
    client = Client(hydra, public=public)
    verifier, state, nonce = (secrets.token_urlsafe(n) for n in (48, 16, 16))
    authorize = client.authorize_url(state, nonce, verifier)
    browser = Browser()

    status, _, page = browser.sign_in(authorize, "ada", "wrong password", client.redirect_uri)
    assert status == 200 and 'id="error"' in page and 'value="ada"' in page
    assert hydra.logins == []

    status, callback, _ = browser.sign_in(authorize, "ada", PASSWORD, client.redirect_uri)
    assert status in (302, 303) and callback.startswith(client.redirect_uri), callback
    assert hydra.logins == ["ada"]
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(callback).query))
    assert query["state"] == state
    grant = {"grant_type": "authorization_code", "code": query["code"],
             "redirect_uri": client.redirect_uri, "code_verifier": verifier}  # fmt: skip
    tokens = client.token(grant)
    assert tokens["token_type"].lower() == "bearer" and tokens["refresh_token"]

    claims = client.id_token_claims(tokens)
    assert claims["iss"] == hydra.issuer and hydra.issuer.endswith("/")
    assert client.id in claims["aud"] and claims["nonce"] == nonce
    assert claims["sub"] == "ada" and claims["preferred_username"] == "ada"
    assert claims["email"] == "ada@example.org" and claims["email_verified"] is True
    assert claims["groups"] == ["gpu-admins", "ml research"] and claims["name"] == "Ada Lovelace"
    assert claims["exp"] - claims["iat"] == 3600  # the default lifetime
    info = client.userinfo(tokens["access_token"])
    assert info["sub"] == "ada" and info["groups"] == ["gpu-admins", "ml research"]

    with pytest.raises(urllib.error.HTTPError) as reused:  # a code is good once
        client.token(grant)
    assert reused.value.code == 400


def test_a_remembered_login_skips_the_form_until_logout(hydra: Hydra) -> None:
    client = Client(hydra, public=True)
    authorize = client.authorize_url("s" * 16, "n" * 16, secrets.token_urlsafe(48))
    browser = Browser()
    assert browser.sign_in(authorize, "ada", PASSWORD, client.redirect_uri)[0] == 303
    status, where, _ = browser.follow(authorize, until=client.redirect_uri)
    assert status == 303 and where.startswith(client.redirect_uri)  # no form this time
    status, where, _ = browser.follow(f"{hydra.issuer}oauth2/sessions/logout")
    assert status == 200 and where == f"{hydra.login_url}/logged-out"
    status, _, page = browser.follow(authorize, until=client.redirect_uri)
    assert status == 200 and 'id="login"' in page
    assert hydra.logins == ["ada"]


def test_short_lived_tokens_expire_and_refresh(tmp_path: Path) -> None:
    root = tmp_path / "hydra"
    # long enough that a loaded machine uses the token well within it (3 s flaked under CI)
    ttl = 15
    with Hydra(
        ensure_hydra(), USERS, access_token_ttl_s=ttl, id_token_ttl_s=ttl, root=root
    ) as hydra:
        client = Client(hydra, public=False)
        tokens, _ = client.sign_in("bob", "bobs secret")
        claims = client.id_token_claims(tokens)
        assert claims["exp"] - claims["iat"] == ttl and claims["groups"] == []
        assert client.userinfo(tokens["access_token"])["sub"] == "bob"
        time.sleep(max(0.0, claims["exp"] + 1.5 - time.time()))
        with pytest.raises(urllib.error.HTTPError) as expired:
            client.userinfo(tokens["access_token"])
        assert expired.value.code == 401

        fresh = client.token({"grant_type": "refresh_token",
                              "refresh_token": tokens["refresh_token"]})  # fmt: skip
        assert client.userinfo(fresh["access_token"])["sub"] == "bob"
        assert client.id_token_claims(fresh)["email"] == "bob@example.org"


class Echo:
    """The upstream: answers every GET with the path and headers it got, as JSON."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        echo = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                echo.seen.append(self.path)
                body = json.dumps({"path": self.path, "headers": self.headers.items()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="echo-upstream")

    def __enter__(self) -> Echo:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def test_oauth2_proxy_signs_in_and_tells_the_upstream_who(hydra: Hydra) -> None:
    with Echo() as upstream, OAuth2Proxy(ensure_oauth2_proxy(), hydra, upstream.url) as proxy:
        page = f"{proxy.url}/reports/team?day=2026-12-01"
        status, where, _ = Browser().send(page)
        assert status in (302, 303) and upstream.seen == [], (status, where)

        browser = Browser()
        spoofed = {"X-Forwarded-User": "mallory", "X-Forwarded-Groups": "gpu-admins"}
        status, where, body = browser.sign_in(page, "ada", PASSWORD)
        assert status == 200, (status, where, body[:500])
        status, _, body = browser.send(page, headers=spoofed)
        assert status == 200
        seen = json.loads(body)
        headers: dict[str, list[str]] = {}
        for name, value in seen["headers"]:
            headers.setdefault(name.lower(), []).append(value)

    assert seen["path"] == "/reports/team?day=2026-12-01"
    assert upstream.seen == [seen["path"]] * 2  # after sign-in's last redirect, and ours
    assert headers["x-forwarded-user"] == ["ada"]  # the ID token's sub, never the client's
    assert headers["x-forwarded-email"] == ["ada@example.org"]
    assert headers["x-forwarded-preferred-username"] == ["ada"]
    assert headers["x-forwarded-groups"] == ["gpu-admins,ml research"]
    assert any(c.name == proxy.cookie_name for c in browser.cookies)
