"""``GPUGAP_SLACK_*``: the incoming webhook (a secret: whoever has it can post)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, model_validator

from gpugap.groundfloor.settings import env_config, read_secret
from gpugap.sinks.routing import TargetSettings


class SlackSettings(TargetSettings):
    model_config = env_config("GPUGAP_SLACK_")

    webhook_url: SecretStr | None = Field(
        default=None, description="https://hooks.slack.com/services/... (or a compatible one)"
    )
    webhook_url_file: Path | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    evidence_url: str | None = Field(
        default=None,
        description="a link per alert ({alert_id}, {allocation_id}, {cluster} URL-quoted)",
    )

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        url = read_secret(self.webhook_url, self.webhook_url_file, "the Slack webhook URL")
        object.__setattr__(self, "webhook_url", url)
        return self
