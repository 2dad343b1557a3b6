"""``GPUGAP_DCGM_*``: the dcgm-exporter scraper's settings."""

from __future__ import annotations

from gpugap.groundfloor.settings import env_config
from gpugap.producers.prometheus.settings import ScrapeSettings


class DcgmSettings(ScrapeSettings):
    """The dcgm-exporter scraper (``gpugap produce dcgm``): endpoints are dcgm-exporter
    /metrics URLs."""

    model_config = env_config("GPUGAP_DCGM_")
