"""``GPUGAP_ALERTMANAGER_*``: where alerts go, how often active ones are re-sent."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, field_validator, model_validator

from gpugap.groundfloor.settings import CommaList, comma_list, env_config, read_secret
from gpugap.sinks.routing import TargetSettings


class AlertmanagerSettings(TargetSettings):
    model_config = env_config("GPUGAP_ALERTMANAGER_")

    urls: CommaList = Field(
        default_factory=list,
        description="Alertmanager base URLs, e.g. http://am-0:9093,http://am-1:9093 (an HA "
        "set: each gets every alert)",
    )
    resend_interval_s: float = Field(
        default=60.0,
        ge=1.0,
        description="re-send active alerts this often (shorter than Alertmanager's "
        "resolve_timeout, default 5 min); endsAt is 4 intervals ahead",
    )
    timeout_s: float = Field(default=10.0, gt=0)
    evidence_url: str | None = Field(
        default=None,
        description="a link per alert, e.g. https://grafana/d/gpugap?var-allocation="
        "{allocation_id} ({alert_id}, {allocation_id}, {cluster} are URL-quoted)",
    )
    bearer_token: SecretStr | None = None
    bearer_token_file: Path | None = None

    _url_list = field_validator("urls", mode="before")(comma_list)

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        token = read_secret(self.bearer_token, self.bearer_token_file, "the Alertmanager token")
        object.__setattr__(self, "bearer_token", token)
        return self
