"""``gpugap backfill prometheus``: dcgm-exporter history in Prometheus -> node samples.

Each chunk is one query for the raw samples of every DCGM field the live scraper reads
(``producers.dcgm.parse.FIELDS``). The samples of one node at one scrape time are one
``NodeSample``, built by the scraper's own ``node_samples``: the same activity preference
(SM active, else GR engine active, else GPU_UTIL / 100), memory, power, MIG naming and
pod / ``hpc_job`` attribution, from either label style (``Hostname``/``UUID``/``gpu`` as
dcgm-exporter writes them, the node from ``instance`` when no ``Hostname`` label is kept).

Prometheus's own target labels: scraped through a Kubernetes service, a series gets the
*exporter's* ``pod``/``namespace``/``container``, and dcgm-exporter's labels become
``exported_pod``/``exported_namespace``/``exported_container``; those are the workload's.
A ``pod`` label naming the exporter itself (a GPU nobody holds) is not attribution.
"""

from __future__ import annotations

import base64
import json
import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.dcgm.parse import FIELDS, ScrapeError, node_samples
from gpugap.schemas import DeadLetter, Topic, utc_now
from gpugap.schemas.topics import DEAD_LETTER, SAMPLES

from .plan import Chunk
from .promql import PromClient, node_of
from .runner import Backfill, Published
from .settings import BackfillSettings

log = logging.getLogger(__name__)

_POD_LABELS = ("pod", "namespace", "container")
#: the DCGM fields the scraper reads; a counter may be stored with OpenMetrics' ``_total``
_NAMES = "|".join(sorted(FIELDS)) + "|DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"


def selector(matchers: str) -> str:
    extra = f",{matchers.strip()}" if matchers.strip() else ""
    return f'{{__name__=~"{_NAMES}"{extra}}}'


def workload_labels(labels: dict[str, str]) -> dict[str, str]:
    """The series' labels with the workload's pod labels where Prometheus renamed them."""
    if any(f"exported_{k}" in labels for k in _POD_LABELS):
        out = {k: v for k, v in labels.items() if k not in _POD_LABELS}
        for k in _POD_LABELS:
            if labels.get(f"exported_{k}"):
                out[k] = labels[f"exported_{k}"]
        return out
    if "dcgm-exporter" in labels.get("pod", "") or "dcgm-exporter" in labels.get("container", ""):
        return {k: v for k, v in labels.items() if k not in _POD_LABELS}
    return labels


class PrometheusTelemetry(Backfill):
    source: ClassVar[str] = "prometheus"

    def __init__(self, settings: Settings, config: BackfillSettings, **kw: Any) -> None:
        super().__init__(settings, config, **kw)
        self.client = PromClient(config)
        self.selector = selector(config.matchers)
        self.dead_letters = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    def checkpoint_key(self) -> dict[str, str]:
        return {
            **super().checkpoint_key(),
            "prometheus": self.client.url,
            "selector": self.selector,
            "interval_s": f"{self.cfg.scrape_interval_s:g}",
        }

    async def fetch(self, chunk: Chunk) -> Published:
        # a sample at t describes (t - interval, t]: the samples about [since, until) are
        # those after since and before until + one interval (the last one ends past until)
        lo, hi = chunk
        if hi >= self.until_ms:
            hi += round(self.cfg.scrape_interval_s * 1000) - 1
        series = await self.client.raw(self.selector, lo, hi)
        by_instant: dict[tuple[int, str], list[tuple[str, dict[str, str], float]]] = defaultdict(
            list
        )
        for labels, values in series:
            name = labels.get("__name__", "")
            node = node_of(labels)
            if not node:
                continue  # no node to put it on (no Hostname, no instance)
            mine = workload_labels(labels)
            for t, value in values:
                by_instant[(t, node)].append((name, mine, value))
        out: list[tuple[Topic[Any], Any]] = []
        for (t, node), found in sorted(by_instant.items()):
            when = datetime.fromtimestamp(t / 1000, UTC)
            try:
                samples = node_samples(
                    found,
                    cluster=self.cluster,
                    default_node=node,
                    time=when,
                    interval_s=self.cfg.scrape_interval_s,
                )
            except ScrapeError as exc:
                out.append((DEAD_LETTER, self._dead_letter(node, when, found, exc)))
                continue
            out += [(SAMPLES, s) for s in samples]
        return out

    def _dead_letter(
        self, node: str, when: datetime, found: list[Any], exc: ScrapeError
    ) -> DeadLetter:
        self.dead_letters += 1
        if self.dead_letters <= 10:
            log.warning("backfill prometheus: %s at %s: %s", node, when, exc.reason)
        body = json.dumps([[n, labels, v] for n, labels, v in found])[: 512 << 10]
        return DeadLetter(
            time=utc_now(),
            source_topic=SAMPLES.name,
            key_b64=base64.b64encode(node.encode()).decode(),
            value_b64=base64.b64encode(body.encode()).decode(),
            kind=exc.kind,
            reason=f"prometheus history of {node} at {when:%Y-%m-%dT%H:%M:%S.%f}: {exc.reason}"[
                :4000
            ],
            consumer="backfill-prometheus",
        )

    async def close(self) -> None:
        await self.client.close()
