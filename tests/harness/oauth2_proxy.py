"""A real oauth2-proxy v7 (built by tests/harness/signon_build.py) for the sign-on tests: in
front of an upstream URL, signing people in with OpenID Connect against a test's Hydra
(tests/harness/hydra.py), and passing who they are on to the upstream in headers:
``X-Forwarded-User`` (the ID token's ``sub``), ``-Email``, ``-Preferred-Username`` and
``-Groups`` (the ``groups`` claim).

It listens on plain http on a free loopback port (so ``--cookie-secure=false``), registers a
confidential client of its own at Hydra (its callback as the one redirect URI), uses PKCE
(S256) and checks the ID token's nonce. Its session cookie is named after its port: cookies
ignore ports, and two proxies on 127.0.0.1 would otherwise overwrite each other's.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.harness.hydra import Hydra
from tests.harness.prom_process import PromProcess

SCOPE = "openid email profile groups"


class OAuth2Proxy(PromProcess):
    """``with OAuth2Proxy(exe, hydra, "http://127.0.0.1:8080") as proxy:`` (Hydra started);
    ``extra_args`` go after the rest (a later flag overrides an earlier one)."""

    name = "oauth2-proxy"
    poll_s = 0.1

    def __init__(
        self,
        exe: Path,
        hydra: Hydra,
        upstream: str,
        *,
        extra_args: Sequence[str] = (),
        root: Path | None = None,
    ) -> None:
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="gpugap-oauth2-proxy-"))
        self.root.mkdir(parents=True, exist_ok=True)
        super().__init__(exe, self.root / "oauth2-proxy.log")
        self.upstream = upstream
        self.issuer = hydra.issuer
        self.redirect_url = f"{self.url}/oauth2/callback"
        client_id, client_secret = hydra.add_client([self.redirect_url])
        assert client_secret is not None
        self.client_id, self.client_secret = client_id, client_secret
        self.cookie_name = f"_oauth2_proxy_{self.port}"
        self.extra_args = list(extra_args)
        # 32 bytes: an AES-256 key for the session cookie; on the command line (not secret
        # beyond this test)
        self._cookie_secret = secrets.token_hex(16)

    def args(self) -> list[str]:
        return [
            f"--http-address=127.0.0.1:{self.port}",
            f"--upstream={self.upstream}",
            "--provider=oidc",
            "--provider-display-name=Test sign-on",
            f"--oidc-issuer-url={self.issuer}",
            f"--client-id={self.client_id}",
            f"--client-secret={self.client_secret}",
            f"--redirect-url={self.redirect_url}",
            f"--scope={SCOPE}",
            "--code-challenge-method=S256",
            "--insecure-oidc-skip-nonce=false",  # check the nonce it sent (the default skips)
            "--oidc-groups-claim=groups",
            "--email-domain=*",
            "--pass-user-headers=true",
            "--skip-provider-button",
            f"--cookie-secret={self._cookie_secret}",
            f"--cookie-name={self.cookie_name}",
            "--cookie-secure=false",
            "--silence-ping-logging",
            *self.extra_args,
        ]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def close(self) -> None:
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
