"""``gpugap produce amd-exporter``: scrape AMD Device Metrics Exporter endpoints into node
samples.

The scrape loop (all endpoints at once, bounded bodies, an endpoint down costs only its
sample, an unusable scrape -> one dead letter with the body) is the exporters' shared one
(``producers/prometheus/scrape.py``); this module names the exporter and hands each scrape to
``producers/amd_exporter/parse.py``.

Read-only: plain GETs of ``/metrics``, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.amd_exporter.parse import parse_scrape
from gpugap.producers.amd_exporter.settings import AmdExporterSettings
from gpugap.producers.prometheus import scrape
from gpugap.producers.prometheus.scrape import ScrapeProducer
from gpugap.schemas import NodeSample, utc_now

EXAMPLE = "http://node-1:5000/metrics"


def endpoint_url(text: str) -> str:
    """'host:5000' -> 'http://host:5000/metrics'; a full URL is kept as given."""
    return scrape.endpoint_url(text, "amd-exporter", EXAMPLE)


class AmdExporterProducer(ScrapeProducer):
    name: ClassVar[str] = "amd-exporter"
    exporter: ClassVar[str] = "amd-device-metrics-exporter"
    example_endpoint: ClassVar[str] = EXAMPLE
    env_prefix: ClassVar[str] = "GPUGAP_AMD_EXPORTER_"

    def __init__(self, settings: Settings, config: AmdExporterSettings | None = None) -> None:
        self.amd = config or AmdExporterSettings()
        super().__init__(settings, self.amd)

    def parse(self, text: str, default_node: str) -> Sequence[NodeSample]:
        return parse_scrape(
            text,
            cluster=self.cluster,
            default_node=default_node,
            time=utc_now(),
            interval_s=float(self.interval_s),
            prefix=self.amd.prefix,
        )
