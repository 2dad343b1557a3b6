"""Owner chains: pod -> ReplicaSet -> Deployment, Job -> CronJob, Job -> JobSet, training
operators, notebooks... resolved with read-only GETs through the kubernetes client and kept in
a bounded cache (keyed by the owner's uid, so a re-created owner is never confused with the
old one). Only the kinds in ``RESOLVABLE`` are fetched; the RBAC manifest grants exactly those.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpugap.groundfloor.classify import Owner
from gpugap.producers.kubernetes.bounds import str_map
from gpugap.producers.kubernetes.resources import GpuRule
from gpugap.producers.kubernetes.settings import KubernetesSettings

log = logging.getLogger(__name__)

#: (API group, kind) -> resource (plural) for the owners the producer may GET
RESOLVABLE: dict[tuple[str, str], str] = {
    ("apps", "ReplicaSet"): "replicasets",
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("batch", "Job"): "jobs",
    ("batch", "CronJob"): "cronjobs",
    ("kubeflow.org", "PyTorchJob"): "pytorchjobs",
    ("kubeflow.org", "TFJob"): "tfjobs",
    ("kubeflow.org", "MPIJob"): "mpijobs",
    ("kubeflow.org", "XGBoostJob"): "xgboostjobs",
    ("kubeflow.org", "PaddleJob"): "paddlejobs",
    ("kubeflow.org", "JAXJob"): "jaxjobs",
    ("kubeflow.org", "Notebook"): "notebooks",
    ("trainer.kubeflow.org", "TrainJob"): "trainjobs",
    ("jobset.x-k8s.io", "JobSet"): "jobsets",
    ("batch.volcano.sh", "Job"): "jobs",
    ("ray.io", "RayCluster"): "rayclusters",
    ("ray.io", "RayJob"): "rayjobs",
    ("ray.io", "RayService"): "rayservices",
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "leaderworkersets",
    ("serving.kserve.io", "InferenceService"): "inferenceservices",
}
MAX_DEPTH = 6
#: what groundfloor.classify reads from an owner's labels and annotations besides the configured
#: owner, team and class keys (``owner_map_keys``): gang_of, a Kueue queue on a Job
OWNER_RULE_KEYS = ("kueue.x-k8s.io/queue-name",)


def owner_map_keys(k8s: KubernetesSettings) -> frozenset[str]:
    """The label/annotation keys of an owner that the rules read: all the cache keeps."""
    return frozenset((*k8s.owner_labels, *k8s.team_labels, k8s.class_label, *OWNER_RULE_KEYS))


def controller_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = meta.get("ownerReferences") or ()
    for ref in refs:
        if ref.get("controller"):
            return ref
    return refs[0] if refs else None


def expected_gpu_pods(kind: str, spec: Mapping[str, Any], rule: GpuRule) -> int | None:
    """How many GPU pods an owner runs when all of it is up (gang size), from its spec."""
    if kind == "Job" and "tasks" in spec:  # Volcano
        tasks = spec["tasks"]
        return sum(
            int(t.get("replicas", 1)) for t in tasks if rule.template_gpus(t.get("template"))
        )
    if kind == "Job":
        if not rule.template_gpus(spec.get("template")):
            return 0
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        return min(parallelism, int(completions)) if completions is not None else parallelism
    if kind == "JobSet":
        total = 0
        for rj in spec.get("replicatedJobs") or ():
            job = (rj.get("template") or {}).get("spec") or {}
            per_job = expected_gpu_pods("Job", job, rule) or 0
            total += int(rj.get("replicas", 1)) * per_job
        return total
    replica_specs = [
        v for k, v in spec.items() if k.endswith("ReplicaSpecs") and isinstance(v, dict)
    ]
    if replica_specs:  # Kubeflow training operator: {"Master": {...}, "Worker": {...}}
        return sum(
            int(r.get("replicas", 1))
            for specs in replica_specs
            for r in specs.values()
            if rule.template_gpus(r.get("template"))
        )
    return None


Fetch = Callable[[str, str, str, str, str], Mapping[str, Any] | None]


class OwnerResolver:
    """Resolves a pod's controller chain, nearest first. Thread-safe; one per producer.

    ``fetch(group, version, namespace, plural, name)`` returns the object, ``None`` when it
    is gone or forbidden (the chain stops there), and raises on transient errors (retried a
    few times, then the chain stops short and is not cached). With ``keys``, an owner keeps
    only those labels and annotations: owners carry large ones (kubectl's
    last-applied-configuration) and the cache holds thousands of owners.
    """

    def __init__(
        self,
        fetch: Fetch,
        rule: GpuRule,
        *,
        max_entries: int = 10_000,
        ttl_s: float = 600.0,
        retries: int = 2,
        clock: Callable[[], float] = time.monotonic,
        keys: Collection[str] | None = None,
    ) -> None:
        self._fetch = fetch
        self._rule = rule
        self._keys = keys
        self._cache: OrderedDict[tuple[str, ...], tuple[float, Owner | None, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries, self.ttl_s, self.retries, self._clock = max_entries, ttl_s, retries, clock
        self.gets = 0

    def chain(self, namespace: str, meta: Mapping[str, Any]) -> list[Owner]:
        out: list[Owner] = []
        ref = controller_ref(meta)
        while ref is not None and len(out) < MAX_DEPTH:
            api_version, kind, name = ref.get("apiVersion", ""), ref.get("kind", ""), ref["name"]
            group, _, version = api_version.rpartition("/")
            plural = RESOLVABLE.get((group, kind))
            if plural is None:  # not ours to fetch: the chain ends with what the ref says
                out.append(Owner(kind=kind, name=name, api_version=api_version))
                break
            key = (namespace, group, kind, name, str(ref.get("uid", "")))
            owner, next_ref = self._resolve(key, version, plural)
            if owner is None:
                out.append(Owner(kind=kind, name=name, api_version=api_version))
                break
            out.append(owner)
            ref = next_ref
        return out

    def _resolve(
        self, key: tuple[str, ...], version: str, plural: str
    ) -> tuple[Owner | None, Mapping[str, Any] | None]:
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1], hit[2]
        namespace, group, kind, name, _ = key
        obj: Mapping[str, Any] | None = None
        for attempt in range(self.retries + 1):
            try:
                self.gets += 1
                obj = self._fetch(group, version, namespace, plural, name)
                break
            except Exception as exc:
                if attempt == self.retries:
                    log.warning("owner %s %s/%s: %s (chain left short)", kind, namespace, name, exc)
                    return None, None
                time.sleep(0.05 * (attempt + 1))
        owner, next_ref = self._owner(kind, obj) if obj is not None else (None, None)
        with self._lock:
            self._cache[key] = (now + self.ttl_s, owner, next_ref)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return owner, next_ref

    def _owner(self, kind: str, obj: Mapping[str, Any]) -> tuple[Owner, Mapping[str, Any] | None]:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        try:
            gpu_pods = expected_gpu_pods(kind, spec, self._rule)
        except (TypeError, ValueError, AttributeError):
            gpu_pods = None
        owner = Owner(
            kind=kind,
            name=meta.get("name", ""),
            api_version=obj.get("apiVersion", ""),
            labels=str_map(meta.get("labels"), self._keys),
            annotations=str_map(meta.get("annotations"), self._keys),
            gpu_pods=gpu_pods,
        )
        return owner, controller_ref(meta)


def client_fetch(api_client: Any, timeout: tuple[float, float]) -> Fetch:
    """A ``fetch`` that GETs through the kubernetes client (CustomObjectsApi builds the
    ``/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}`` path for every group here)."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    api = CustomObjectsApi(api_client)

    def fetch(
        group: str, version: str, namespace: str, plural: str, name: str
    ) -> Mapping[str, Any] | None:
        try:
            resp = api.get_namespaced_custom_object(
                group, version, namespace, plural, name,
                _preload_content=False, _request_timeout=timeout,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status in (403, 404, 410):
                if exc.status == 403:
                    log.warning("owner GET forbidden for %s.%s (check the RBAC)", plural, group)
                return None
            raise
        raw: Any = resp
        try:
            body: Mapping[str, Any] = json.loads(raw.data)
        finally:
            raw.release_conn()
        return body

    return fetch
