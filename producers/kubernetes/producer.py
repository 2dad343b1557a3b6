"""``gpugap produce kubernetes``: pod lifecycle events for pods that request GPUs.

Read-only towards the cluster: it lists and watches pods and GETs their owners, nothing else
(deploy/kubernetes-producer-rbac.yaml). The blocking kubernetes client runs in one watcher
thread per namespace (``producers/kubernetes/watcher.py``); this event loop publishes what they hand
over, flushes, and only then reports progress (``synced_rv``) and writes the restart ledger.
With ``--once`` it lists, publishes what the list shows, and exits. A pod that cannot be
published goes to ``dead-letter.v1`` with the reason, and the others are published
(``producers/kubernetes/bounds.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from gpugap.groundfloor.classify import Owner, classify_pod, gang_of, owner_and_team
from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.kubernetes.bounds import carried, str_map
from gpugap.producers.kubernetes.handoff import Handoff
from gpugap.producers.kubernetes.ledger import Ledger
from gpugap.producers.kubernetes.owners import OwnerResolver, client_fetch, owner_map_keys
from gpugap.producers.kubernetes.queues import pod_queue
from gpugap.producers.kubernetes.resources import GpuRule
from gpugap.producers.kubernetes.settings import KubernetesSettings
from gpugap.producers.kubernetes.tracker import Enricher, Enrichment, Tracker
from gpugap.producers.kubernetes.watcher import Watcher, WatchOptions
from gpugap.schemas import Topic
from gpugap.schemas.errors import ConfigError, FatalError
from gpugap.schemas.topics import DEAD_LETTER, K8S_PODS

log = logging.getLogger(__name__)


def api_configuration(k8s: KubernetesSettings) -> Any:
    """Client configuration: the kubeconfig given, else in-cluster, else $KUBECONFIG or
    ~/.kube/config. Retries are ours (with backoff), not urllib3's: its silent retries would
    multiply the time it takes to notice a hung connection."""
    import urllib3
    from kubernetes import config as kconfig
    from kubernetes.client import Configuration

    cfg = Configuration()
    try:
        if k8s.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kconfig.load_incluster_config(client_configuration=cfg)
        else:
            kconfig.load_kube_config(
                config_file=str(k8s.kubeconfig) if k8s.kubeconfig else None,
                context=k8s.context,
                client_configuration=cfg,
                persist_config=False,
            )
    except (kconfig.ConfigException, OSError) as exc:
        raise ConfigError(
            f"no usable Kubernetes configuration ({exc}); pass --kubeconfig FILE, set "
            "GPUGAP_K8S_KUBECONFIG or KUBECONFIG, or run in a pod with a service account"
        ) from None
    cfg.retries = urllib3.util.Retry(total=1, connect=1, read=0, redirect=0, status=0)
    return cfg


def make_enricher(k8s: KubernetesSettings, resolver: OwnerResolver) -> Enricher:
    def enrich(pod: Mapping[str, Any]) -> Enrichment:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        # read once per pod; a map the rules cannot read makes the pod a dead letter (tracker)
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        chain: list[Owner] = resolver.chain(ns, meta)
        owner, team = owner_and_team(
            ns, labels=labels, annotations=annotations, chain=chain, owner_keys=k8s.owner_labels,
            team_keys=k8s.team_labels, team_from_namespace=k8s.team_from_namespace,
        )  # fmt: skip
        gang_id, gang_size = gang_of(ns, labels, annotations, chain)
        top = chain[-1] if chain else None
        return Enrichment(
            owner_kind=top.kind if top else None,
            owner_name=top.name if top else None,
            workload_class=classify_pod(
                ns,
                name,
                labels=labels,
                annotations=annotations,
                chain=chain,
                rules=k8s.class_rules,
                class_label=k8s.class_label,
            ),
            owner=owner,
            team=team,
            gang_id=gang_id,
            gang_size=gang_size,
            queue=pod_queue(labels, annotations),
            labels=carried(str_map(labels), k8s.carry_labels),
        )

    return enrich


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], object]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
        loop.call_soon_threadsafe(fn)


class KubernetesProducer(Producer):
    name: ClassVar[str] = "kubernetes"

    def __init__(self, settings: Settings, config: KubernetesSettings | None = None) -> None:
        super().__init__(settings)
        self.k8s = config or KubernetesSettings()
        self.cluster = self.k8s.cluster or settings.cluster
        self.rule = GpuRule(self.k8s.gpu_resources, self.k8s.gpu_resource_prefixes)
        self.watchers: list[Watcher] = []
        #: namespace ('' = all) -> the last resourceVersion whose events are flushed
        self.synced_rv: dict[str, str] = {}
        self.resolver: OwnerResolver | None = None
        self.dead_letters = 0  # pods (or watch lines) sent to dead-letter.v1

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return K8S_PODS

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        from kubernetes.client import ApiClient

        assert self.publisher is not None
        k8s = self.k8s
        cfg = api_configuration(k8s)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        handoff = Handoff(lambda: _call_soon(loop, wake.set))
        timeout = (k8s.connect_timeout_s, k8s.request_timeout_s)
        owners_client = ApiClient(cfg)
        self.resolver = OwnerResolver(
            client_fetch(owners_client, timeout),
            self.rule,
            max_entries=k8s.owner_cache_size,
            ttl_s=k8s.owner_cache_ttl_s,
            keys=owner_map_keys(k8s),
        )
        enrich = make_enricher(k8s, self.resolver)
        ledger = Ledger(k8s.state_file, self.cluster)
        seeded = ledger.load()
        opts = WatchOptions(
            connect_timeout_s=k8s.connect_timeout_s,
            read_timeout_s=k8s.request_timeout_s,
            watch_timeout_s=k8s.watch_timeout_s,
            page_size=k8s.page_size,
            backoff_initial_s=k8s.backoff_initial_s,
            backoff_max_s=k8s.backoff_max_s,
            once=once,
        )
        namespaces: list[str | None] = [*k8s.namespaces] or [None]
        for ns in namespaces:
            tracker = Tracker(self.cluster, self.rule, enrich)
            tracker.seed((k, e) for k, e in seeded if ns is None or e.namespace == ns)
            self.watchers.append(Watcher(ns, ApiClient(cfg), tracker, handoff, opts))
        stopper = asyncio.create_task(stop.wait())
        stopper.add_done_callback(lambda _: wake.set())
        synced: set[str] = set()
        failed = False
        try:
            for w in self.watchers:
                w.start()
            while True:
                wake.clear()
                await self._publish(handoff, ledger, synced)
                if once and len(synced) == len(self.watchers):
                    return
                if stop.is_set():
                    return
                await wake.wait()
        except BaseException:
            failed = True
            raise
        finally:
            stopper.cancel()
            await self._stop_watchers()
            if not failed:  # what the watchers handed over before they stopped
                try:
                    await self._publish(handoff, ledger, synced)
                except Exception as exc:  # the ledger keeps only what was flushed
                    log.warning("kubernetes: could not publish the last batches: %s", exc)
                else:
                    ledger.save(force=True)
            owners_client.close()

    async def _publish(self, handoff: Handoff, ledger: Ledger, synced: set[str]) -> None:
        assert self.publisher is not None
        progress: dict[str, str] = {}
        for batch in handoff.drain():
            if batch.error is not None:
                if isinstance(batch.error, PermissionError):
                    raise FatalError(str(batch.error))
                raise batch.error
            for record in batch.records:
                await self.emit(record)
                ledger.note(record)
            for dead in batch.dead:
                await self.emit(dead, DEAD_LETTER)
            self.dead_letters += len(batch.dead)
            if batch.resource_version:
                progress[batch.namespace] = batch.resource_version
            if batch.synced:
                synced.add(batch.namespace)
        await self.publisher.flush()
        ledger.save()
        self.synced_rv.update(progress)

    async def _stop_watchers(self) -> None:
        for w in self.watchers:
            w.stop()
        deadline = time.monotonic() + self.k8s.connect_timeout_s + self.k8s.request_timeout_s + 5
        while any(w.is_alive() for w in self.watchers) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for w in self.watchers:
            if w.is_alive():
                log.warning("%s did not stop in time", w.name)
            else:
                w.join()
