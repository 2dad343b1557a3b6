"""``gpugap produce slurm-quotas``: every ``interval_s`` (default 300 s), one
``queue-quotas.v1`` record per Slurm QOS and association whose ``GrpTRES`` caps GPUs
(quotas.py reads the text).

Read-only: ``sacctmgr -P -n show qos`` and ``show assoc`` (any user may list them unless
slurmdbd's PrivateData hides associations: then run it as a Slurm operator or the
SlurmUser), and ``scontrol show config`` once for ClusterName. When sacctmgr cannot reach
slurmdbd (or fails, or is late) the poll is skipped with one log line naming the error, and
the next poll tries again: the producer never stops for it.
"""

from __future__ import annotations

import base64
import logging
from typing import Any, ClassVar

from pydantic import ValidationError

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.slurm import quotas
from gpugap.producers.slurm.capacity import cluster_name
from gpugap.producers.slurm.poll_settings import SlurmQuotaSettings
from gpugap.producers.slurm.sources import CommandError, run
from gpugap.schemas import DeadLetter, Record, Topic, utc_now
from gpugap.schemas.topics import DEAD_LETTER, QUEUE_QUOTAS
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
CONSUMER = "slurm-quotas-producer"


class SlurmQuotaProducer(Producer):
    name: ClassVar[str] = "slurm-quotas"

    def __init__(self, settings: Settings, config: SlurmQuotaSettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = config or SlurmQuotaSettings()
        explicit = "cluster" in settings.model_fields_set
        self.cluster = self.cfg.cluster or (settings.cluster if explicit else None)
        self.slurm_cluster: str | None = None  # Slurm's ClusterName: whose associations
        self.interval_s = self.cfg.interval_s
        self.dead_letters = 0
        self.skipped_polls = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return QUEUE_QUOTAS

    async def poll(self) -> list[Record]:
        now = utc_now()
        t, sacctmgr = self.cfg.command_timeout_s, self.cfg.sacctmgr
        try:
            if self.slurm_cluster is None:
                config = await run([self.cfg.scontrol, "show", "config"], t)
                self.slurm_cluster = cluster_name(config) or "default"
            qos = await run([sacctmgr, "-P", "-n", "show", "qos", f"format={quotas.QOS_FORMAT}"], t)
            assoc = await run(
                [sacctmgr, "-P", "-n", "show", "assoc", f"format={quotas.ASSOC_FORMAT}"], t
            )
        except (CommandError, OSError) as exc:
            self.skipped_polls += 1
            log.error(
                "slurm-quotas: %s (is slurmdbd up and reachable?); next try in %.0fs",
                exc,
                self.interval_s,
            )
            return []
        limits, bad = quotas.parse_qos(qos)
        by_assoc, bad_assoc = quotas.parse_associations(assoc, self.slurm_cluster)
        for raw, reason in [*bad, *bad_assoc]:
            await self._dead_letter(raw, reason)
        cluster = self.cluster or self.slurm_cluster
        out: list[Record] = []
        for limit in [*limits, *by_assoc]:
            try:
                out.append(
                    quotas.queue_quota(limit, cluster=cluster, time=now, interval_s=self.interval_s)
                )
            except ValidationError as exc:
                await self._dead_letter(repr(limit), f"{limit.queue}: {exc}")
        return out

    async def _dead_letter(self, raw: str, reason: str) -> None:
        log.warning("slurm-quotas: unreadable, dead-lettered: %s", reason[:300])
        self.dead_letters += 1
        record = DeadLetter(
            time=utc_now(),
            source_topic=QUEUE_QUOTAS.name,
            value_b64=base64.b64encode(raw.encode()[:262_144]).decode(),
            kind=DeadLetterKind.MALFORMED,
            reason=reason[:4000],
            consumer=CONSUMER,
        )
        await self.emit(record, DEAD_LETTER)
