"""``gpugap produce xpum``: scrape Intel XPU Manager exporters into node samples.

The scrape loop (all endpoints at once, bounded bodies, an endpoint down costs only its
sample, an unusable scrape -> one dead letter with the body) is the exporters' shared one
(``producers/prometheus/scrape.py``); this module names XPU Manager, hands each scrape to
``producers/xpum/parse.py`` (1.x ``xpum_*`` and 2.x ``hw_*``) and counts what the parse
noticed: repeated series (issue #112, harmless) and impossible power readings (issue #130,
dropped, one log line each: they are rare, after a D3 -> D0 transition).

The 1.x exporter's gauges are averages since the previous query of its statistics session 1
(tests/fixtures/intel/NOTES.md §2), i.e. since the previous scrape by anyone: two scrapers of
one exporter (gpugap and a Prometheus) each see part of the time. Read-only: plain GETs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.prometheus.scrape import ScrapeProducer
from gpugap.producers.xpum.parse import parse_scrape
from gpugap.producers.xpum.settings import XpumSettings
from gpugap.schemas import NodeSample, utc_now


class XpumProducer(ScrapeProducer):
    name: ClassVar[str] = "xpum"
    exporter: ClassVar[str] = "XPU Manager exporter"
    example_endpoint: ClassVar[str] = "http://node-1:29999/metrics"
    env_prefix: ClassVar[str] = "GPUGAP_XPUM_"

    def __init__(self, settings: Settings, config: XpumSettings | None = None) -> None:
        cfg = config or XpumSettings()
        super().__init__(settings, cfg)
        self.tiles_as_devices = cfg.tiles_as_devices

    def parse(self, text: str, default_node: str) -> Sequence[NodeSample]:
        scrape = parse_scrape(
            text,
            cluster=self.cluster,
            default_node=default_node,
            time=utc_now(),
            interval_s=float(self.interval_s),
            tiles_as_devices=self.tiles_as_devices,
        )
        if scrape.duplicates:
            self.counts["duplicate_series"] += scrape.duplicates
        for spike in scrape.discarded_power:
            self.counts["power_discarded"] += 1
            self.log.warning(
                "%s: %s: impossible power discarded: %s", self.name, default_node, spike
            )
        return scrape.samples
