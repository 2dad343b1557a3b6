"""``GPUGAP_AMD_EXPORTER_*``: the AMD Device Metrics Exporter scraper's settings."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from gpugap.groundfloor.settings import env_config
from gpugap.producers.prometheus.settings import ScrapeSettings

#: DME's own rule for ``MetricsFieldPrefix`` (``metricsutil.GetPrefix``)
_PREFIX = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


class AmdExporterSettings(ScrapeSettings):
    """The AMD Device Metrics Exporter scraper (``gpugap produce amd-exporter``): endpoints
    are the exporter's /metrics URLs (port 5000 by default)."""

    model_config = env_config("GPUGAP_AMD_EXPORTER_")

    prefix: str | None = Field(
        default=None,
        description="the exporters' MetricsFieldPrefix (e.g. 'amd_'; '' for none); unset: "
        "found in each scrape",
    )

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value and not re.match(_PREFIX, value):
            raise ValueError(f"{value!r} is not a MetricsFieldPrefix (letters, digits, _)")
        return value
