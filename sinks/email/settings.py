"""``GPUGAP_EMAIL_*``: the SMTP server (STARTTLS and AUTH), the sender and the recipients."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, field_validator, model_validator

from gpugap.groundfloor.settings import CommaList, comma_list, env_config, read_secret
from gpugap.sinks.routing import TargetSettings


class EmailSettings(TargetSettings):
    model_config = env_config("GPUGAP_EMAIL_")

    host: str | None = Field(default=None, description="the SMTP server")
    port: int = Field(default=587, gt=0, lt=65536)
    security: str = Field(
        default="starttls",
        pattern="^(starttls|tls|none)$",
        description="starttls (port 587), tls (implicit, port 465) or none (a local relay)",
    )
    cafile: Path | None = Field(default=None, description="PEM CA bundle (default: system CAs)")
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    sender: str = Field(default="gpugap@localhost", description="From:")
    to: CommaList = Field(default_factory=list, description="always mailed (an on-call list)")
    owner_domain: str | None = Field(
        default=None, description="also mail the alert's owner at <owner>@<owner_domain>"
    )
    timeout_s: float = Field(default=30.0, gt=0)
    evidence_url: str | None = Field(
        default=None,
        description="a link per alert ({alert_id}, {allocation_id}, {cluster} URL-quoted)",
    )

    _to = field_validator("to", mode="before")(comma_list)

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        pw = read_secret(self.password, self.password_file, "the SMTP password")
        object.__setattr__(self, "password", pw)
        return self
