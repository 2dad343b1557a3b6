"""``gpugap produce dcgm``: scrape dcgm-exporter endpoints into node samples.

The scrape loop (all endpoints at once, bounded bodies, an endpoint down costs only its
sample, an unusable scrape -> one dead letter with the body) is the exporters' shared one
(``producers/prometheus/scrape.py``); this module only names dcgm-exporter and hands each
scrape to ``producers/dcgm/parse.py``.

Read-only: plain GETs of ``/metrics``, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.dcgm.parse import parse_scrape
from gpugap.producers.dcgm.settings import DcgmSettings
from gpugap.producers.prometheus import scrape
from gpugap.producers.prometheus.scrape import DEAD_LETTER_BODY, ScrapeProducer
from gpugap.schemas import NodeSample, utc_now

__all__ = ["DEAD_LETTER_BODY", "DcgmProducer", "endpoint_url"]

EXAMPLE = "http://node-1:9400/metrics"


def endpoint_url(text: str) -> str:
    """'host:9400' -> 'http://host:9400/metrics'; a full URL is kept as given."""
    return scrape.endpoint_url(text, "dcgm", EXAMPLE)


class DcgmProducer(ScrapeProducer):
    name: ClassVar[str] = "dcgm"
    exporter: ClassVar[str] = "dcgm-exporter"
    example_endpoint: ClassVar[str] = EXAMPLE
    env_prefix: ClassVar[str] = "GPUGAP_DCGM_"

    def __init__(self, settings: Settings, config: DcgmSettings | None = None) -> None:
        super().__init__(settings, config or DcgmSettings())

    def parse(self, text: str, default_node: str) -> Sequence[NodeSample]:
        return parse_scrape(
            text,
            cluster=self.cluster,
            default_node=default_node,
            time=utc_now(),
            interval_s=float(self.interval_s),
        )
