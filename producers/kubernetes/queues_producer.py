"""``gpugap produce kubernetes-queues``: every ``interval_s``, the GPU quota of every queue of
the queue managers installed (Kueue ClusterQueues and LocalQueues, KAI Queues, Volcano Queues)
as ``queue-quotas.v1`` records.

Read-only: discovery (which groups and versions are served) and paged lists of the queue
objects, nothing else. A manager whose API group is not served is skipped (debug log: most
clusters run one manager or none). A list the role does not allow is an error naming the rule
to add, each poll, and the other managers are still read; any other failed read skips the poll
and the next one tries again. An object whose records break the schema becomes one dead letter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from pydantic import ValidationError

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.kubernetes.apiread import (
    Forbidden,
    ReadFailed,
    ReadOnlyApi,
    client_config,
    polled_dead_letter,
    rbac_rule,
)
from gpugap.producers.kubernetes.bounds import why
from gpugap.producers.kubernetes.capacity import GpuShares
from gpugap.producers.kubernetes.poll_settings import QueueSettings
from gpugap.producers.kubernetes.queues import (
    KAI_GROUP,
    KUEUE_GROUP,
    VOLCANO_GROUP,
    Poll,
    kai_queue,
    kueue_cluster_queue,
    kueue_gpu_quotas,
    kueue_local_queue,
    volcano_queue,
)
from gpugap.schemas import Record, Topic, utc_now
from gpugap.schemas.models import QueueQuota
from gpugap.schemas.topics import DEAD_LETTER, QUEUE_QUOTAS

log = logging.getLogger(__name__)
ENV_PREFIX = "GPUGAP_K8S_QUEUES_"
CONSUMER = "kubernetes-queues-producer"
Obj = Mapping[str, Any]
#: (group, plural) of every queue kind read, in the order the records are built (LocalQueues
#: after ClusterQueues: they take the flavors and resources their ClusterQueue covers)
KINDS = (
    (KUEUE_GROUP, "clusterqueues"),
    (KUEUE_GROUP, "localqueues"),
    (KAI_GROUP, "queues"),
    (VOLCANO_GROUP, "queues"),
)
Read = dict[tuple[str, str], list[Obj]]


class QueuesProducer(Producer):
    name: ClassVar[str] = "kubernetes-queues"

    def __init__(self, settings: Settings, config: QueueSettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = config or QueueSettings()
        self.cluster = self.cfg.cluster or settings.cluster
        self.interval_s = self.cfg.interval_s
        self.shares = GpuShares.of(self.cfg.gpu_resources, self.cfg.gpu_resource_prefixes, ())
        self.api: ReadOnlyApi | None = None
        self.dead_letters = 0
        self.skipped_polls = 0
        #: (group, plural) -> the RBAC rule it lacked at the last poll
        self.forbidden: dict[tuple[str, str], str] = {}

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return QUEUE_QUOTAS

    def _read(self) -> Read:
        if self.api is None:
            timeout = (self.cfg.connect_timeout_s, self.cfg.request_timeout_s)
            self.api = ReadOnlyApi(
                client_config(self.cfg.kubeconfig, self.cfg.context, ENV_PREFIX), timeout
            )
        found: Read = {}
        versions: dict[str, str | None] = {}
        self.forbidden = {}
        for group, plural in KINDS:
            if group not in versions:
                versions[group] = self.api.preferred_version(group)
                if versions[group] is None:
                    log.debug("kubernetes-queues: API group %s not served, skipped", group)
            version = versions[group]
            if version is None:
                continue
            rule = rbac_rule(group, plural)
            try:
                found[group, plural] = list(
                    self.api.list(
                        f"/apis/{group}/{version}/{plural}",
                        page_size=self.cfg.page_size,
                        limit=self.cfg.max_queues,
                        rule=rule,
                    )
                )
            except Forbidden:
                self.forbidden[group, plural] = rule
        return found

    async def poll(self) -> Iterable[Record]:
        poll = Poll(self.cluster, utc_now(), self.interval_s, self.shares)
        try:
            found = await asyncio.to_thread(self._read)
        except ReadFailed as exc:
            self.skipped_polls += 1
            log.warning("kubernetes-queues: poll skipped, next in %.0f s: %s", self.interval_s, exc)
            return []
        except Forbidden as exc:  # discovery itself refused: nothing can be read
            log.error("kubernetes-queues: %s", exc)
            return []
        for (group, plural), rule in self.forbidden.items():
            log.error("kubernetes-queues: listing %s.%s is forbidden: the ClusterRole needs %s",
                      plural, group, rule)  # fmt: skip
        covered = {
            str((cq.get("metadata") or {}).get("name")): [
                (f, r) for f, r, _ in kueue_gpu_quotas(cq, self.shares)
            ]
            for cq in found.get((KUEUE_GROUP, "clusterqueues"), ())
        }
        convert: dict[tuple[str, str], Callable[[Obj, Poll], list[QueueQuota]]] = {
            (KUEUE_GROUP, "clusterqueues"): kueue_cluster_queue,
            (KUEUE_GROUP, "localqueues"): lambda o, p: kueue_local_queue(o, p, covered),
            (KAI_GROUP, "queues"): kai_queue,
            (VOLCANO_GROUP, "queues"): volcano_queue,
        }
        records: list[Record] = []
        for kind in KINDS:
            for obj in found.get(kind, ()):
                try:
                    records.extend(convert[kind](obj, poll))
                except (ValidationError, AttributeError, TypeError, ValueError) as exc:
                    await self._dead(kind, obj, exc)
        return records

    async def _dead(self, kind: tuple[str, str], obj: Obj, exc: Exception) -> None:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        name = f"{meta.get('namespace') or ''}/{meta.get('name')}"
        what, reason = why(exc)
        self.dead_letters += 1
        dead = polled_dead_letter(
            QUEUE_QUOTAS.name, f"{self.cluster}/{kind[1]}.{kind[0]}/{name}", obj, kind=what,
            reason=f"{kind[1]}.{kind[0]} {name}: {reason}", consumer=CONSUMER,
        )  # fmt: skip
        await self.emit(dead, DEAD_LETTER)

    async def close(self) -> None:
        if self.api is not None:
            self.api.close()
