"""``gpugap produce slurm-metrics``: every ``interval_s`` (default 60 s), slurmctld's own count
of the GPUs its running jobs hold, per cluster, partition, account, user and node, as
``scheduler-gpu-counts.v1`` records (metrics.py reads the pages). The warehouse sets gpugap's
own count beside it (v_scheduler_drift): gpugap checks itself in production.

Read-only: HTTP GETs of slurmctld's ``/metrics/*`` pages (Slurm 25.11+ with
``MetricsType=metrics/openmetrics``; the GPU gauges are 26.05's), each with a timeout and a
size limit. A page that does not answer skips the poll (one log line; the next poll tries
again); a page that cannot be read is a dead letter with the reason.
"""

from __future__ import annotations

import base64
import logging
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.slurm import metrics
from gpugap.producers.slurm.parse import ParseError
from gpugap.producers.slurm.poll_settings import SlurmMetricsSettings
from gpugap.schemas import DeadLetter, Record, Topic, utc_now
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import DEAD_LETTER, SCHEDULER_GPU_COUNTS
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
CONSUMER = "slurm-metrics-producer"


class PageError(Exception):
    pass


class SlurmMetricsProducer(Producer):
    name: ClassVar[str] = "slurm-metrics"

    def __init__(self, settings: Settings, config: SlurmMetricsSettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = config or SlurmMetricsSettings()
        explicit = "cluster" in settings.model_fields_set
        cluster = self.cfg.cluster or (settings.cluster if explicit else None)
        if cluster is None:
            raise ConfigError(
                "slurm-metrics: set GPUGAP_SLURM_METRICS_CLUSTER (or GPUGAP_CLUSTER) to the "
                "cluster name the Slurm producers use"
            )
        self.cluster = cluster
        self.interval_s = self.cfg.interval_s
        self.skipped_polls = 0
        self._session: Any = None

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SCHEDULER_GPU_COUNTS

    async def poll(self) -> list[Record]:
        now = utc_now()
        try:
            pages = [await self._get(page) for page in metrics.PAGES]
        except PageError as exc:
            self.skipped_polls += 1
            log.warning("slurm-metrics: %s; next try in %.0fs", exc, self.interval_s)
            return []
        try:
            return list(
                metrics.gpu_counts(
                    pages, cluster=self.cluster, time=now, interval_s=self.interval_s
                )
            )
        except (ParseError, ValueError) as exc:
            await self._dead_letter("\n".join(pages), str(exc))
            return []

    async def _get(self, page: str) -> str:
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        url = f"{str(self.cfg.url).rstrip('/')}/{page}"
        try:
            async with self._session.get(url) as answer:
                if answer.status != 200:
                    raise PageError(f"{url} answered {answer.status}")
                body = await answer.content.read(self.cfg.max_page_bytes + 1)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PageError(f"{url}: {exc or type(exc).__name__}") from None
        if len(body) > self.cfg.max_page_bytes:
            raise PageError(
                f"{url}: larger than {self.cfg.max_page_bytes} bytes "
                "(raise GPUGAP_SLURM_METRICS_MAX_PAGE_BYTES)"
            )
        return body.decode("utf-8", "replace")

    async def _dead_letter(self, raw: str, reason: str) -> None:
        log.warning("slurm-metrics: a page could not be read: %s", reason[:300])
        record = DeadLetter(
            time=utc_now(),
            source_topic=SCHEDULER_GPU_COUNTS.name,
            value_b64=base64.b64encode(raw.encode()[:1_000_000]).decode(),
            kind=DeadLetterKind.MALFORMED,
            reason=reason[:4000],
            consumer=CONSUMER,
        )
        await self.emit(record, DEAD_LETTER)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
