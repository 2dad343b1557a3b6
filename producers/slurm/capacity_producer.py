"""``gpugap produce slurm-capacity``: every ``interval_s`` (default 60 s), one
``node-capacity.v1`` record per node that offers GPUs, with every running job run that holds
part of it (GPU or not: CPUs and memory are what strand GPUs). capacity.py reads the text.

Read-only: ``scontrol show config`` (once, for ClusterName when no cluster is set),
``scontrol -o show node``, ``scontrol -o show job -d`` and ``squeue -h -a -t all -o %A``; any
user may run them. A command that fails or is late skips that poll (one log line; the next
poll tries again). A record scontrol printed that cannot be read, and a node the schema
refuses, become dead letters; the rest of the poll is published.
"""

from __future__ import annotations

import base64
import logging
from typing import Any, ClassVar

from pydantic import ValidationError

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.slurm import capacity
from gpugap.producers.slurm.poll_settings import SlurmCapacitySettings
from gpugap.producers.slurm.sources import CommandError, run
from gpugap.schemas import DeadLetter, Record, Topic, utc_now
from gpugap.schemas.topics import DEAD_LETTER, NODE_CAPACITY
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
CONSUMER = "slurm-capacity-producer"


class SlurmCapacityProducer(Producer):
    name: ClassVar[str] = "slurm-capacity"

    def __init__(self, settings: Settings, config: SlurmCapacitySettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = config or SlurmCapacitySettings()
        explicit = "cluster" in settings.model_fields_set
        self.cluster = self.cfg.cluster or (settings.cluster if explicit else None)
        self.interval_s = self.cfg.interval_s
        self.dead_letters = 0
        self.skipped_polls = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return NODE_CAPACITY

    async def poll(self) -> list[Record]:
        now = utc_now()
        t, scontrol = self.cfg.command_timeout_s, self.cfg.scontrol
        try:
            cluster = self.cluster or await self._slurm_cluster()
            nodes_text = await run([scontrol, "-o", "show", "node"], t)
            jobs_text = await run([scontrol, "-o", "show", "job", "-d"], t)
            # after scontrol: every record it printed is a job squeue still lists
            ids = await run([self.cfg.squeue, "-h", "-a", "-t", "all", "-o", "%A"], t)
        except (CommandError, OSError) as exc:
            self.skipped_polls += 1
            log.warning("slurm-capacity: %s; next try in %.0fs", exc, self.interval_s)
            return []
        nodes, bad = capacity.parse_nodes(nodes_text)
        holdings, bad_jobs = capacity.parse_holdings(jobs_text, ids.split())
        for raw, reason in [*bad, *bad_jobs]:
            await self._dead_letter(raw, reason)
        out: list[Record] = []
        for node in nodes:
            if node.gpus <= 0:
                continue
            held = holdings.get(node.name, [])
            try:
                out.append(
                    capacity.node_capacity(
                        node, held, cluster=cluster, time=now, interval_s=self.interval_s
                    )
                )
            except ValidationError as exc:
                await self._dead_letter(repr((node, held)), f"node {node.name}: {exc}")
        return out

    async def _slurm_cluster(self) -> str:
        """Slurm's ClusterName (what the job poller's squeue --json names), asked once."""
        text = await run([self.cfg.scontrol, "show", "config"], self.cfg.command_timeout_s)
        self.cluster = capacity.cluster_name(text) or "default"
        return self.cluster

    async def _dead_letter(self, raw: str, reason: str) -> None:
        log.warning("slurm-capacity: unreadable, dead-lettered: %s", reason[:300])
        self.dead_letters += 1
        record = DeadLetter(
            time=utc_now(),
            source_topic=NODE_CAPACITY.name,
            value_b64=base64.b64encode(raw.encode()[:262_144]).decode(),
            kind=DeadLetterKind.MALFORMED,
            reason=reason[:4000],
            consumer=CONSUMER,
        )
        await self.emit(record, DEAD_LETTER)
