"""Node capacity from Node and Pod objects (their JSON as the API server sends it): what each
GPU node offers and what every pod bound to it requests. Pure functions on dicts, no I/O
(``capacity_producer.py`` reads the API and publishes), so the rules are tested on recorded
objects.

A pod's request is Kubernetes' effective request (the scheduler's and kubelet's rule,
``k8s.io/component-helpers/resource.PodRequests``): the larger of the app containers plus the
restartable (sidecar) init containers and each ordinary init container plus the sidecars
started before it, plus ``spec.overhead``. GPUs count in physical-GPU equivalents: a MIG
slice is its share of its GPU (``schemas.shares``), an AMD compute partition its share of its
GPU (``gpu_resources.amd_partition_share``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpugap.producers.kubernetes.bounds import Rejected
from gpugap.producers.kubernetes.gpu_resources import (
    AMD_GPU,
    AMD_PARTITION_RESOURCES,
    MIG_PREFIX,
    MODEL_LABELS,
    NVIDIA_GPU,
    amd_partition_share,
)
from gpugap.producers.kubernetes.resources import MAX_CONTAINERS
from gpugap.schemas.models import NodeAllocation, NodeCapacity, k8s_allocation_id
from gpugap.schemas.shares import mig_share
from gpugap.schemas.types import MAX_ALLOCATIONS_PER_NODE, Scheduler

Obj = Mapping[str, Any]
MIB = float(2**20)
#: pods in these phases hold nothing any more (their containers have all ended)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: NVIDIA's device plugin, MIG "single" strategy: ``nvidia.com/gpu`` counts MIG devices, and
#: the product label names the profile ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
_SINGLE_MIG_PRODUCT = re.compile(r"-MIG-(\S+)$")

_DECIMAL = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)|[eE]([+-]?[0-9]+))?$"
)
_SCALE = {
    None: 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
    "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip


def amount(value: object) -> float:
    """A Kubernetes quantity as a number: "63500m" -> 63.5, "1Gi" -> 2**30, 8 -> 8.0. Missing,
    negative or unreadable: 0 (the API server validates quantities; this is for the odd one)."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        return max(float(value), 0.0)
    m = _DECIMAL.match(value.strip()) if isinstance(value, str) else None
    if m is None:
        return 0.0
    scale = _SCALE[m.group(2)] if m.group(3) is None else 10.0 ** int(m.group(3))
    return max(float(m.group(1)) * scale, 0.0)


@dataclass(frozen=True)
class GpuShares:
    """Which resources are GPUs and what one unit of each is worth in physical GPUs."""

    names: frozenset[str]
    prefixes: tuple[str, ...]
    model_labels: tuple[str, ...] = MODEL_LABELS

    @classmethod
    def of(
        cls, names: Collection[str], prefixes: Collection[str], model_labels: Sequence[str]
    ) -> GpuShares:
        return cls(frozenset(names), tuple(prefixes), tuple(model_labels))

    def is_gpu(self, resource: str) -> bool:
        return resource in self.names or resource.startswith(self.prefixes)

    def model(self, node_labels: Obj) -> str | None:
        return first_label(node_labels, self.model_labels)

    def per_unit(self, resource: str, node_labels: Obj) -> float:
        model = self.model(node_labels)
        if resource == AMD_GPU or resource in AMD_PARTITION_RESOURCES:
            return amd_partition_share(resource, dict(node_labels), model)
        for prefix in self.prefixes:
            if resource.startswith(prefix):
                # a MIG profile's share of its GPU; another prefix's unit counts as one GPU
                share = mig_share(resource[len(prefix) :], model) if prefix == MIG_PREFIX else None
                return share if share is not None else 1.0
        if resource == NVIDIA_GPU and node_labels.get(MIG_STRATEGY_LABEL) == "single":
            m = _SINGLE_MIG_PRODUCT.search(model or "")
            share = mig_share(m.group(1), model) if m else None
            return share if share is not None else 1.0
        return 1.0

    def gpus(self, resources: Mapping[str, float], node_labels: Obj) -> float:
        return sum(
            n * self.per_unit(name, node_labels)
            for name, n in resources.items()
            if n and self.is_gpu(name)
        )


def _container_requests(container: Obj) -> dict[str, float]:
    res = container.get("resources") or {}
    # the API server defaults a missing request to the limit; read limits too for objects
    # that were never through it (recorded specs, templates)
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {name: n for name, v in merged.items() if (n := amount(v))}


def _containers(spec: Obj, key: str) -> Sequence[Obj]:
    found: Sequence[Obj] = spec.get(key) or ()
    if len(found) > MAX_CONTAINERS:
        raise Rejected(f"spec.{key}: {len(found)} containers (more than {MAX_CONTAINERS})")
    return found


def _add(into: dict[str, float], more: Mapping[str, float]) -> None:
    for name, n in more.items():
        into[name] = into.get(name, 0.0) + n


def effective_requests(spec: Obj) -> dict[str, float]:
    """Every resource a pod spec requests, by Kubernetes' effective-request rule."""
    total: dict[str, float] = {}
    for c in _containers(spec, "containers"):
        _add(total, _container_requests(c))
    sidecars: dict[str, float] = {}
    peak: dict[str, float] = {}
    for c in _containers(spec, "initContainers"):
        req = _container_requests(c)
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the app containers
            _add(total, req)
            _add(sidecars, req)
            for name in req:
                peak[name] = max(peak.get(name, 0.0), sidecars[name])
        else:  # runs alone, beside the sidecars started before it
            for name in req.keys() | sidecars.keys():
                peak[name] = max(peak.get(name, 0.0), req.get(name, 0.0) + sidecars.get(name, 0.0))
    out = {
        name: max(total.get(name, 0.0), peak.get(name, 0.0)) for name in total.keys() | peak.keys()
    }
    _add(out, {name: amount(v) for name, v in (spec.get("overhead") or {}).items()})
    return {name: n for name, n in out.items() if n}


@dataclass(frozen=True, slots=True)
class PodUse:
    """What one pod holds of its node, before the node's labels say what a GPU unit is."""

    uid: str
    requests: dict[str, float]


def pod_use(pod: Obj) -> tuple[str, PodUse] | None:
    """(node, what it holds) for a pod bound to a node and not yet ended; else None."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node, uid = spec.get("nodeName"), (pod.get("metadata") or {}).get("uid")
    if not node or not uid or status.get("phase") in TERMINAL_PHASES:
        return None
    return str(node), PodUse(str(uid), effective_requests(spec))


def allocation(cluster: str, use: PodUse, shares: GpuShares, node_labels: Obj) -> NodeAllocation:
    return NodeAllocation(
        allocation_id=k8s_allocation_id(cluster, use.uid),
        gpus=shares.gpus(use.requests, node_labels),
        cpus=use.requests.get("cpu", 0.0),
        memory_mib=use.requests.get("memory", 0.0) / MIB,
    )


def schedulable(node: Obj) -> bool:
    """Cordoned (spec.unschedulable) or not Ready: its free GPUs cannot be had."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False  # a node that never said it is Ready (no kubelet) runs nothing


def first_label(labels: Obj, keys: Sequence[str]) -> str | None:
    for key in keys:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass(frozen=True)
class NodeReport:
    record: NodeCapacity
    #: allocations left out: the node had more than the record may list (the smallest go)
    left_out: tuple[str, ...] = ()


def node_capacity(
    node: Obj, uses: Sequence[PodUse], *, cluster: str, time: datetime, interval_s: float,
    shares: GpuShares, pool_labels: Sequence[str],
) -> NodeReport | None:  # fmt: skip
    """The node's record, or None when it offers no GPUs."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    labels: Obj = meta.get("labels") or {}
    allocatable = {name: amount(v) for name, v in (status.get("allocatable") or {}).items()}
    gpus = shares.gpus(allocatable, labels)
    if not gpus:
        return None
    allocations = sorted(
        (allocation(cluster, u, shares, labels) for u in uses),
        key=lambda a: (-a.gpus, -a.cpus, -a.memory_mib, a.allocation_id),
    )
    kept, left_out = allocations[:MAX_ALLOCATIONS_PER_NODE], allocations[MAX_ALLOCATIONS_PER_NODE:]
    model = shares.model(labels)
    record = NodeCapacity(
        cluster=cluster,
        node=str(meta.get("name")),
        time=time,
        interval_s=interval_s,
        scheduler=Scheduler.KUBERNETES,
        source="kubernetes",
        pool=first_label(labels, pool_labels),
        gpu_model=model,
        gpus=gpus,
        cpus=allocatable.get("cpu", 0.0),
        memory_mib=allocatable.get("memory", 0.0) / MIB,
        schedulable=schedulable(node),
        allocations=tuple(sorted(kept, key=lambda a: a.allocation_id)),
    )
    return NodeReport(record, tuple(a.allocation_id for a in left_out))
