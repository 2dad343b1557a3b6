"""``GPUGAP_XPUM_*``: the XPU Manager exporter scraper's settings."""

from __future__ import annotations

from pydantic import Field

from gpugap.groundfloor.settings import CommaList, env_config
from gpugap.producers.prometheus.settings import ScrapeSettings


class XpumSettings(ScrapeSettings):
    """The XPU Manager exporter scraper (``gpugap produce xpum``): the exporter scrapers'
    settings under its own prefix, plus whether a tile is a device."""

    model_config = env_config("GPUGAP_XPUM_")

    endpoints: CommaList = Field(
        default_factory=list,
        description="XPU Manager exporter /metrics URLs (1.x: http://node:29999/metrics)",
    )
    tiles_as_devices: bool = Field(
        default=False,
        description="each tile of a multi-tile card is a device XPU-<uuid>/<tile> (FLAT "
        "hierarchy, e.g. Slurm giving each tile to a job); default: a card is one device",
    )
