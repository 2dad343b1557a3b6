"""``gpugap backfill kubernetes``: kube-state-metrics history in Prometheus -> pod events.

Each chunk asks ``query_range`` (at the scrape interval, one query per series of
``ksm.SERIES``, only pods that request a GPU resource) what kube-state-metrics said at every
step. Step by step, in order, each pod's series become the pod object (``ksm.PodView``) and
go through the live Kubernetes producer's own ``Tracker`` with its enrichment (owner chain,
class, owner/team, gang, carried labels: ``GPUGAP_K8S_*``): the same events, ids
``k8s/<cluster>/<uid>/<kind>`` and times the live watcher would have given. A pod whose
series stop is deleted then: at its deletion request or termination if the series showed
one, else at the last step that showed it. Owners one hop up (ReplicaSet -> Deployment, Job
-> CronJob) come from ``kube_replicaset_owner`` / ``kube_job_owner``.

Chunks are fetched in parallel but go through the tracker in order; each chunk's query
starts one step early, so a run resumed from a checkpoint sees the pods alive at its start
(their bound/running events again, same ids: downstream dedupes) and those that went.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.kubernetes.owners import OwnerResolver
from gpugap.producers.kubernetes.producer import make_enricher
from gpugap.producers.kubernetes.resources import GpuRule
from gpugap.producers.kubernetes.settings import KubernetesSettings
from gpugap.producers.kubernetes.tracker import Tracker
from gpugap.schemas import Topic
from gpugap.schemas.topics import DEAD_LETTER, K8S_PODS

from .ksm import SERIES, PodView, label_keys, prom_name, resource_names
from .plan import Chunk
from .promql import PromClient, Series
from .runner import Backfill, Published
from .settings import BackfillSettings

#: the steps, the answers per series, the owners' owners
Fetched = tuple[list[int], dict[str, list[Series]], list[tuple[dict[str, str], float]]]


class KubeStateHistory(Backfill):
    source: ClassVar[str] = "kubernetes"

    def __init__(self, settings: Settings, config: BackfillSettings, **kw: Any) -> None:
        super().__init__(settings, config, **kw)
        self.client = PromClient(config)
        self.k8s = k8s = KubernetesSettings()
        self.rule = GpuRule(k8s.gpu_resources, k8s.gpu_resource_prefixes)
        self.owners: dict[tuple[str, str, str], tuple[str, str]] = {}
        resolver = OwnerResolver(self._owner_object, self.rule, retries=0)
        self._now = datetime.fromtimestamp(self.since_ms / 1000, UTC)
        self.tracker = Tracker(self.cluster, self.rule, make_enricher(k8s, resolver), self._clock)
        self.exact, self.prefixes = label_keys(
            (*k8s.owner_labels, *k8s.team_labels, k8s.class_label), k8s.carry_labels
        )
        self.step_ms = round(config.scrape_interval_s * 1000)
        extra = f",{config.matchers.strip()}" if config.matchers.strip() else ""
        self.matchers = extra
        self.resources = resource_names(k8s.gpu_resources)
        # the configured resources exactly, the prefixes (MIG profiles) as prefixes
        wanted = [
            *self.resources,
            *(prom_name(p) + ".*" for p in k8s.gpu_resource_prefixes),
        ]
        gpu = '{resource=~"' + "|".join(wanted) + '"' + extra + "}"
        self.gpu_pods = (
            f"(kube_pod_container_resource_requests{gpu} > 0 or "
            f"kube_pod_init_container_resource_requests{gpu} > 0)"
        )
        self._last: dict[str, tuple[int, dict[str, Any]]] = {}  # uid -> last step, object

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return K8S_PODS

    def checkpoint_key(self) -> dict[str, str]:
        return {
            **super().checkpoint_key(),
            "prometheus": self.client.url,
            "matchers": self.matchers,
            "interval_s": f"{self.cfg.scrape_interval_s:g}",
        }

    def _clock(self) -> datetime:
        return self._now

    def _owner_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Mapping[str, Any] | None:
        """An owner as the API would answer a GET, from kube-state-metrics' owner series."""
        up = self.owners.get((namespace, plural, name))
        meta: dict[str, Any] = {"name": name}
        if up is not None:
            api = {"Deployment": "apps/v1", "CronJob": "batch/v1"}.get(up[0], "")
            meta["ownerReferences"] = [
                {"apiVersion": api, "kind": up[0], "name": up[1], "controller": True}
            ]
        return {"apiVersion": f"{group}/{version}" if group else version, "metadata": meta}

    def _selector(self, metric: str) -> str:
        return f"{metric}{{{self.matchers.lstrip(',')}}}" if self.matchers else metric

    def steps(self, chunk: Chunk) -> list[int]:
        first = math.ceil(chunk[0] / self.step_ms) * self.step_ms
        return list(range(first, chunk[1], self.step_ms))

    async def fetch(self, chunk: Chunk) -> Fetched | None:
        steps = self.steps(chunk)
        if not steps:
            return None
        lo, hi = steps[0] - self.step_ms, steps[-1]  # one step early: who was there before
        queries = {
            what: f"{self._selector(metric)} and on (uid) {self.gpu_pods}"
            for what, metric in SERIES.items()
        }
        found = await asyncio.gather(
            *(self.client.range(q, lo, hi, self.cfg.scrape_interval_s) for q in queries.values())
        )
        span = f"[{hi - lo + 1}ms]"
        owners = await self.client.instant(
            "max by (namespace, replicaset, job_name, owner_kind, owner_name) ("
            f"last_over_time({self._selector('kube_replicaset_owner')}{span}) or "
            f"last_over_time({self._selector('kube_job_owner')}{span}))",
            hi,
        )
        return [lo, *steps], dict(zip(queries, found, strict=True)), owners

    async def transform(self, chunk: Chunk, fetched: Fetched | None) -> Published:
        """The tracker, step by step: this runs for one chunk at a time, in chunk order."""
        if fetched is None:
            return []
        steps, found, owners = fetched
        for labels, _ in owners:
            plural = "replicasets" if labels.get("replicaset") else "jobs"
            name = labels.get("replicaset") or labels.get("job_name") or ""
            if labels.get("owner_kind") not in (None, "", "<none>"):
                key = (labels.get("namespace", ""), plural, name)
                self.owners[key] = (labels["owner_kind"], labels.get("owner_name", ""))
        views: dict[int, dict[str, PodView]] = {t: {} for t in steps}
        for what, series in found.items():
            for labels, values in series:
                uid = labels.get("uid")
                if not uid:
                    continue
                for t, value in values:
                    if t in views:
                        views[t].setdefault(uid, PodView(uid)).add(what, labels, value)
        out: list[tuple[Topic[Any], Any]] = []
        for t in steps:
            self._now = datetime.fromtimestamp(t / 1000, UTC)
            present = set()
            for uid, view in sorted(views[t].items()):
                pod = view.pod(self.exact, self.prefixes, self.resources)
                if pod is None:
                    continue
                present.add(uid)
                self._last[uid] = (t, pod)
                out += [(K8S_PODS, e) for e in self.tracker.observe("MODIFIED", pod)]
            for uid in [u for u, (seen, _) in self._last.items() if u not in present and seen < t]:
                seen, pod = self._last.pop(uid)
                self._now = datetime.fromtimestamp(seen / 1000, UTC)  # there then, gone now
                out += [(K8S_PODS, e) for e in self.tracker.observe("DELETED", pod)]
            out += [(DEAD_LETTER, d) for d in self.tracker.take_dead()]
        if chunk[1] >= self.until_ms:
            self._last.clear()  # still there at the end of the range: alive, not deleted
        events = [r for r in out if r[0] is K8S_PODS]
        events.sort(key=lambda r: r[1].time)
        return [r for r in out if r[0] is DEAD_LETTER] + events

    async def close(self) -> None:
        await self.client.close()
