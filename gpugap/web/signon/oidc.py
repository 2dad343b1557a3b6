"""OpenID Connect, the authorization code flow with PKCE (RFC 7636, S256), as a confidential
client: the provider's metadata from its discovery document, the login URL with state and
nonce, the code exchanged on the back channel (client_secret_basic), and the ID token checked:
signature by the provider's published keys, issuer, audience, expiry and the nonce this login
sent. Tokens never go in a URL or a log; only the claims the roles need are kept."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpugap.web.signon.sessions import PendingLogin
from gpugap.web.signon.settings import SignOnSettings

TIMEOUT = aiohttp.ClientTimeout(total=15)
MAX_DOCUMENT = 1 << 20  # a discovery document, key set or token answer
LEEWAY_S = 30  # clocks of the provider and this host may differ a little
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]


class LoginFailed(Exception):
    """The login cannot be completed: the message says why, without any token."""


@dataclass(frozen=True)
class Claims:
    user: str
    email: str
    groups: list[str]
    expires_at: float


class Provider:
    def __init__(self, settings: SignOnSettings) -> None:
        from gpugap.groundfloor.plugin import require

        # the ID token's signature: PyJWT with cryptography (extra ``signon``)
        require("sign-on with OpenID Connect", "signon", ("jwt", "cryptography"))
        self.settings = settings
        self._metadata: dict[str, Any] | None = None
        self._keys: dict[str, Any] = {}

    async def _get_json(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        async with session.get(url) as response:
            body = await response.content.read(MAX_DOCUMENT + 1)
            if response.status != 200 or len(body) > MAX_DOCUMENT:
                raise LoginFailed(f"{url} answered {response.status}")
        found = json.loads(body)
        if not isinstance(found, dict):
            raise LoginFailed(f"{url} did not answer a JSON object")
        return found

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            issuer = (self.settings.issuer or "").rstrip("/")
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                found = await self._get_json(session, f"{issuer}/.well-known/openid-configuration")
            if found.get("issuer", "").rstrip("/") != issuer:
                raise LoginFailed(
                    f"the provider says its issuer is {found.get('issuer')!r}, not {issuer!r} "
                    "(GPUGAP_WEB_SIGNON_ISSUER must be exactly the provider's)"
                )
            self._metadata = found
        return self._metadata

    async def login_url(self, login: PendingLogin) -> str:
        meta = await self.metadata()
        challenge = base64.urlsafe_b64encode(hashlib.sha256(login.verifier.encode()).digest())
        query = {
            "response_type": "code",
            "client_id": self.settings.client_id,
            "redirect_uri": self.settings.redirect_uri,
            "scope": self.settings.scopes,
            "state": login.state,
            "nonce": login.nonce,
            "code_challenge": challenge.rstrip(b"=").decode(),
            "code_challenge_method": "S256",
        }
        return f"{meta['authorization_endpoint']}?{urllib.parse.urlencode(query)}"

    async def finish(self, code: str, login: PendingLogin) -> Claims:
        """Exchange ``code`` and check the ID token it brings."""
        meta = await self.metadata()
        secret = self.settings.client_secret
        assert secret is not None and self.settings.client_id is not None
        # client_secret_basic: both form-encoded, then Basic (RFC 6749 section 2.3.1)
        pair = (
            f"{urllib.parse.quote(self.settings.client_id, safe='')}:"
            f"{urllib.parse.quote(secret.get_secret_value(), safe='')}"
        )
        auth = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.settings.redirect_uri,
            "code_verifier": login.verifier,
        }
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            async with session.post(meta["token_endpoint"], data=form, headers=auth) as response:
                body = await response.content.read(MAX_DOCUMENT + 1)
                if response.status != 200:
                    # the provider's error code only: its description may echo what was sent
                    error = _field(body, "error") or f"HTTP {response.status}"
                    raise LoginFailed(f"the provider refused the login's code ({error})")
            id_token = _field(body, "id_token")
            if not id_token:
                raise LoginFailed("the provider's answer holds no ID token (is 'openid' a scope?)")
            claims = await self._verify(session, id_token, meta)
        if claims.get("nonce") != login.nonce:
            raise LoginFailed("the ID token's nonce is not this login's")
        s = self.settings
        groups = claims.get(s.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return Claims(
            user=str(claims.get(s.user_claim) or ""),
            email=str(claims.get(s.email_claim) or ""),
            groups=[str(g) for g in groups if isinstance(g, (str, int))],
            expires_at=float(claims["exp"]),
        )

    async def _verify(
        self, session: aiohttp.ClientSession, token: str, meta: dict[str, Any]
    ) -> dict[str, Any]:
        import jwt

        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            raise LoginFailed("the ID token is not a JWT") from None
        if kid not in self._keys:  # a new key: the provider rotated, read its set again
            keys = await self._get_json(session, meta["jwks_uri"])
            self._keys = {
                k.get("kid"): jwt.PyJWK.from_dict(k) for k in keys.get("keys", []) if "kid" in k
            }
        key = self._keys.get(str(kid))
        if key is None:
            raise LoginFailed("the ID token is signed by a key the provider does not publish")
        try:
            return jwt.decode(
                token,
                key=key,
                algorithms=ALGORITHMS,
                audience=self.settings.client_id,
                issuer=meta["issuer"],
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise LoginFailed("the ID token has expired") from None
        except jwt.PyJWTError as exc:
            raise LoginFailed(f"the ID token does not check out ({type(exc).__name__})") from None


def _field(body: bytes, name: str) -> str:
    try:
        found = json.loads(body)
    except ValueError:
        return ""
    value = found.get(name) if isinstance(found, dict) else None
    return value if isinstance(value, str) else ""
