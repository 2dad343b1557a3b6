"""``GPUGAP_WEB_SIGNON_*``: how ``gpugap web`` knows who asks, and who may see what."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import CommaList, comma_list, env_config, read_secret
from gpugap.schemas.errors import ConfigError


class SignOnSettings(BaseSettings):
    model_config = env_config("GPUGAP_WEB_SIGNON_")

    mode: Literal["off", "oidc", "proxy"] = Field(
        default="off", description="off: no sign-on (the page on 127.0.0.1, operators only)"
    )
    # --- OpenID Connect
    issuer: str | None = Field(default=None, description="the provider's issuer URL")
    client_id: str | None = None
    client_secret: SecretStr | None = None
    client_secret_file: Path | None = None
    public_url: str | None = Field(
        default=None, description="the page's URL as browsers reach it (the redirect URI's base)"
    )
    scopes: str = "openid email profile groups"
    user_claim: str = Field(default="preferred_username", description="the user name's claim")
    email_claim: str = "email"
    groups_claim: str = "groups"
    session_ttl_s: int = Field(default=8 * 3600, ge=60, le=7 * 86400)
    max_sessions: int = Field(default=10_000, ge=1, le=1_000_000)
    # --- a trusted authenticating proxy (oauth2-proxy --pass-user-headers)
    trusted_proxies: CommaList = Field(
        default_factory=list, description="the proxy's addresses, each named (no ranges)"
    )
    user_header: str = "X-Forwarded-Preferred-Username"
    fallback_user_header: str = "X-Forwarded-User"
    email_header: str = "X-Forwarded-Email"
    groups_header: str = "X-Forwarded-Groups"
    # --- roles: each group and user named
    admin_users: CommaList = Field(default_factory=list)
    admin_groups: CommaList = Field(default_factory=list)
    lead_groups: dict[str, str] = Field(
        default_factory=dict, description="group -> the team its members lead"
    )
    team_groups: dict[str, str] = Field(
        default_factory=dict, description="group -> the team its members belong to"
    )
    # who may read /metrics (every team's figures) with sign-on on: Prometheus's address
    metrics_clients: CommaList = Field(default_factory=lambda: ["127.0.0.1", "::1"])

    _lists = field_validator(
        "trusted_proxies", "admin_users", "admin_groups", "metrics_clients", mode="before"
    )(comma_list)

    @field_validator("lead_groups", "team_groups", mode="before")
    @classmethod
    def _mapping(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError('a JSON object, {"group": "team", ...}') from None
        return value

    @model_validator(mode="after")
    def _complete(self) -> Self:
        secret = read_secret(self.client_secret, self.client_secret_file, "the OIDC client secret")
        object.__setattr__(self, "client_secret", secret)
        if self.mode == "oidc":
            missing = [
                f"GPUGAP_WEB_SIGNON_{n.upper()}"
                for n in ("issuer", "client_id", "client_secret", "public_url")
                if not getattr(self, n)
            ]
            if missing:
                raise ConfigError(f"sign-on with OpenID Connect needs {', '.join(missing)}")
        if self.mode == "proxy" and not self.trusted_proxies:
            raise ConfigError(
                "sign-on through a proxy needs GPUGAP_WEB_SIGNON_TRUSTED_PROXIES (its addresses): "
                "headers from anyone else are refused"
            )
        if self.mode != "off" and not (
            self.admin_users or self.admin_groups or self.lead_groups or self.team_groups
        ):
            raise ConfigError(
                "sign-on gives nobody a role: set GPUGAP_WEB_SIGNON_ADMIN_GROUPS, _LEAD_GROUPS "
                "or _TEAM_GROUPS (docs/security.md#sign-on)"
            )
        return self

    @property
    def redirect_uri(self) -> str:
        return f"{(self.public_url or '').rstrip('/')}/auth/callback"

    @property
    def secure_cookies(self) -> bool:
        return (self.public_url or "").startswith("https://")
