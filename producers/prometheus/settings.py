"""The settings every exporter scraper has (``GPUGAP_<NAME>_*``: each subclass sets its
prefix with ``model_config = env_config(...)``)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import CommaList, comma_list


class ScrapeSettings(BaseSettings):
    endpoints: CommaList = Field(default_factory=list, description="the exporters' /metrics URLs")
    cluster: str | None = Field(default=None, description="cluster name (default GPUGAP_CLUSTER)")
    interval_s: float = Field(default=15.0, ge=1.0, description="seconds between scrape rounds")
    timeout_s: float = Field(default=5.0, gt=0, description="per endpoint and scrape")
    max_concurrency: int = Field(default=100, ge=1, description="scrapes in flight at once")
    max_body_bytes: int = Field(default=16 << 20, gt=0, description="larger scrapes are refused")

    _lists = field_validator("endpoints", mode="before")(comma_list)
