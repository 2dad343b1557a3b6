"""``gpugap produce kubernetes-capacity``: every ``interval_s``, one ``node-capacity.v1``
record per node that offers GPUs, with every pod bound to it (GPU or not: CPUs and memory are
what strand GPUs).

Read-only: it lists Nodes and Pods (GET, paged), nothing else. A 403 stops it with the RBAC
rule it lacks; any other failed read skips that poll (logged) and the next one tries again. A
node whose record breaks the schema becomes one dead letter, and the others are published; a
node with more pods than a record may list is published with the largest and the rest named
in a dead letter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
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
from gpugap.producers.kubernetes.bounds import Rejected, why
from gpugap.producers.kubernetes.capacity import GpuShares, PodUse, amount, node_capacity, pod_use
from gpugap.producers.kubernetes.poll_settings import CapacitySettings
from gpugap.schemas import Record, Topic, utc_now
from gpugap.schemas.errors import FatalError
from gpugap.schemas.topics import DEAD_LETTER, NODE_CAPACITY
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
ENV_PREFIX = "GPUGAP_K8S_CAPACITY_"
CONSUMER = "kubernetes-capacity-producer"
#: pods that hold a node: bound to it and not ended (field selectors the API serves for pods)
LIVE_BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

Obj = Mapping[str, Any]


class CapacityProducer(Producer):
    name: ClassVar[str] = "kubernetes-capacity"

    def __init__(self, settings: Settings, config: CapacitySettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = config or CapacitySettings()
        self.cluster = self.cfg.cluster or settings.cluster
        self.interval_s = self.cfg.interval_s
        self.shares = GpuShares.of(
            self.cfg.gpu_resources, self.cfg.gpu_resource_prefixes, self.cfg.gpu_model_label
        )
        self.api: ReadOnlyApi | None = None
        self.dead_letters = 0
        self.skipped_polls = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return NODE_CAPACITY

    def _read(self) -> tuple[list[Obj], dict[str, list[PodUse]], int]:
        """GPU nodes, what the pods bound to them hold, and how many pods could not be read."""
        if self.api is None:
            timeout = (self.cfg.connect_timeout_s, self.cfg.request_timeout_s)
            self.api = ReadOnlyApi(
                client_config(self.cfg.kubeconfig, self.cfg.context, ENV_PREFIX), timeout
            )
        page, limit = self.cfg.page_size, self.cfg.max_nodes
        nodes = [
            n
            for n in self.api.list(
                "/api/v1/nodes", page_size=page, limit=limit, rule=rbac_rule("", "nodes")
            )
            if self._offers_gpus(n)
        ]
        names = {str((n.get("metadata") or {}).get("name")) for n in nodes}
        uses: dict[str, list[PodUse]] = {name: [] for name in names}
        unreadable = 0
        pods = self.api.list(
            "/api/v1/pods", page_size=page, limit=self.cfg.max_pods, rule=rbac_rule("", "pods"),
            query={"fieldSelector": LIVE_BOUND_PODS},
        )  # fmt: skip
        for pod in pods:
            try:
                found = pod_use(pod)
            except (Rejected, AttributeError, TypeError, ValueError):  # a spec it cannot read
                unreadable += 1
                continue
            if found is not None and found[0] in uses:  # pods of nodes without GPUs: not kept
                uses[found[0]].append(found[1])
        return nodes, uses, unreadable

    def _offers_gpus(self, node: Obj) -> bool:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        return any(self.shares.is_gpu(k) and amount(v) for k, v in allocatable.items())

    async def poll(self) -> Iterable[Record]:
        now = utc_now()
        try:
            nodes, uses, unreadable = await asyncio.to_thread(self._read)
        except Forbidden as exc:
            raise FatalError(f"kubernetes-capacity: {exc}") from None
        except ReadFailed as exc:
            self.skipped_polls += 1
            log.warning(
                "kubernetes-capacity: poll skipped, next in %.0f s: %s", self.interval_s, exc
            )
            return []
        if unreadable:
            log.warning("kubernetes-capacity: %d pod specs unreadable, left out", unreadable)
        records: list[Record] = []
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name"))
            key = f"{self.cluster}/{name}"
            try:
                report = node_capacity(
                    node,
                    uses.get(name, ()),
                    cluster=self.cluster,
                    time=now,
                    interval_s=self.interval_s,
                    shares=self.shares,
                    pool_labels=self.cfg.pool_labels,
                )
            except (ValidationError, Rejected, AttributeError, TypeError, ValueError) as exc:
                kind, reason = why(exc)
                await self._dead(key, node, kind, f"node {name}: {reason}")
                continue
            if report is None:
                continue
            records.append(report.record)
            if report.left_out:
                kept = len(report.record.allocations)
                reason = (
                    f"node {name}: {kept + len(report.left_out)} pods, more than a record lists; "
                    f"published the {kept} largest, left out these"
                )
                log.error("kubernetes-capacity: %s", reason)
                await self._dead(key, {"node": name, "left_out": report.left_out},
                                 DeadLetterKind.REJECTED, reason)  # fmt: skip
        return records

    async def _dead(self, key: str, what: object, kind: DeadLetterKind, reason: str) -> None:
        self.dead_letters += 1
        await self.emit(
            polled_dead_letter(
                NODE_CAPACITY.name, key, what, kind=kind, reason=reason, consumer=CONSUMER
            ),
            DEAD_LETTER,
        )

    async def close(self) -> None:
        if self.api is not None:
            self.api.close()
