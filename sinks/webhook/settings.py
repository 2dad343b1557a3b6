"""``GPUGAP_WEBHOOK_*``: the receiver and the secret its HMAC signature is made with."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, model_validator

from gpugap.groundfloor.settings import env_config, read_secret
from gpugap.sinks.routing import TargetSettings


class WebhookSettings(TargetSettings):
    model_config = env_config("GPUGAP_WEBHOOK_")

    url: str | None = Field(default=None, description="where the alert JSON is POSTed")
    secret: SecretStr | None = Field(
        default=None, description="HMAC-SHA256 key: X-Gpugap-Signature: sha256=<hex>"
    )
    secret_file: Path | None = None
    timeout_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        secret = read_secret(self.secret, self.secret_file, "the webhook secret")
        object.__setattr__(self, "secret", secret)
        return self
