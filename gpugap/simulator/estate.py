"""The estate: clusters, nodes and their GPUs (whole GPUs or MIG slices), with stable UUIDs.

A *device* is the unit that is sampled and allocated: a whole GPU, or one MIG slice of a
partitioned GPU (the unit Kubernetes hands out as ``nvidia.com/mig-<profile>``). GPU-seconds
count physical GPU-equivalents (docs/architecture.md): a second of a MIG slice counts its share
of its GPU (compute slices over the model's: 1g.10gb of an A100 = 1/7,
``schemas.shares.mig_share``), and a partitioned GPU's capacity is one GPU, the share no slice
covers unallocated (2 x 3g.40gb leave 1/7). A device-second of a slice is a slice-second, a
device-level figure."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from gpugap.schemas.types import ActivityMetric
from gpugap.simulator.scenario import Cluster, NodeGroup, Scenario
from gpugap.simulator.specs import MIG_PROFILES

if TYPE_CHECKING:
    from gpugap.simulator.plan import Allocation, Holding


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    """``GPU-<uuid5>``: deterministic per cluster/node/index (as schemas.examples.gpu_uuid)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{cluster}/{node}/{index}"))


def mig_uuid(parent: str, gpu_instance: int) -> str:
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{parent}/mig/{gpu_instance}"))


@dataclass(eq=False, slots=True)
class Device:
    cluster: str
    node: str
    uuid: str
    index: int  # the physical GPU's index (a MIG slice has its parent's index)
    model: str
    memory_mib: float
    idle_w: float
    max_w: float
    metric: ActivityMetric
    parent_uuid: str | None = None  # MIG slices only
    gpu_instance_id: int | None = None
    mig_profile: str | None = None
    #: 10 where the metric is NVML utilization (whole percent), else 1 (thousandths)
    quantum: int = 1
    noise_base: int = 0
    #: what the device holds over time, sorted by start (allocations, unattributed use)
    timeline: list[Holding] = field(default_factory=list)
    #: the time (s) from which it is free, while the plan is being built
    free_at: int = -(10**12)
    #: the static head of its JSON in a node sample: '{"uuid":...,"index":...,"model":...'
    head: bytes = b""
    #: its JSON while nobody holds it and it does nothing (built once)
    idle_json: bytes = b""
    #: the emitter's position in ``timeline``
    cursor: int = 0
    #: its node's sample grid: samples at offset + k * interval
    interval: int = 10
    offset: int = 0

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None


@dataclass(eq=False, slots=True)
class Node:
    cluster: str
    name: str
    group: str
    spare: bool
    interval: int  # seconds between samples
    offset: int  # samples at offset + k * interval (s after the start): agents are not in step
    devices: list[Device]
    #: what its capacity polls say (node-capacity.v1): physical GPUs, CPUs, memory (MiB)
    gpus: int = 0
    cpus: Fraction = Fraction(0)
    memory_mib: Fraction = Fraction(0)
    #: the group's GPU model and one GPU's memory (MiB)
    model: str = ""
    gpu_memory_mib: float = 0.0
    #: while planning: some allocation on it holds other than its GPUs' share of CPUs/memory
    uneven: bool = False
    #: allocations on it that hold CPUs and memory and no GPU (``cpu_only``)
    cpu_only: list[Allocation] = field(default_factory=list)


@dataclass(eq=False)
class Estate:
    nodes: list[Node]
    clusters: dict[str, Cluster]
    by_group: dict[tuple[str, str], list[Node]]

    def devices(self) -> list[Device]:
        return [d for n in self.nodes for d in n.devices]


def build(sc: Scenario) -> Estate:
    rng = random.Random(f"{sc.scenario.seed}/estate")
    nodes: list[Node] = []
    by_group: dict[tuple[str, str], list[Node]] = {}
    for cluster in sc.clusters:
        interval = sc.interval(cluster)
        for group in cluster.node_groups:
            members = by_group[cluster.name, group.name] = []
            for i in range(group.count):
                name = f"{cluster.name}-{group.name}-{i + 1:03d}"
                node = Node(
                    cluster.name,
                    name,
                    group.name,
                    spare=i >= group.count - group.spare,
                    interval=interval,
                    offset=rng.randrange(interval),
                    devices=_devices(cluster, group, name, rng),
                    gpus=group.gpus,
                    cpus=Fraction(group.node_cpus),
                    memory_mib=Fraction(group.node_memory_mib),
                    model=group.model,
                    gpu_memory_mib=group.memory_mib,
                )
                for d in node.devices:
                    d.interval, d.offset = node.interval, node.offset
                members.append(node)
                nodes.append(node)
    return Estate(nodes, {c.name: c for c in sc.clusters}, by_group)


def _devices(cluster: Cluster, group: NodeGroup, node: str, rng: random.Random) -> list[Device]:
    out = []
    idle_w, max_w = group.power_w
    metric = cluster.activity_metric
    quantum = 10 if metric is ActivityMetric.UTILIZATION else 1
    # NVML has no utilization per MIG instance: DCGM's profiling metrics are what there is
    mig_metric = ActivityMetric.GR_ENGINE_ACTIVE if quantum != 1 else metric
    for index in range(group.gpus):
        parent = gpu_uuid(cluster.name, node, index)

        def device(
            uid: str, memory: float, gi: int | None = None, idx: int = index, par: str = parent
        ) -> Device:
            return Device(
                cluster.name,
                node,
                uid,
                idx,
                group.model,
                memory,
                idle_w,
                max_w,
                metric if gi is None else mig_metric,
                parent_uuid=par if gi is not None else None,
                gpu_instance_id=gi,
                mig_profile=group.mig_profile if gi is not None else None,
                quantum=quantum if gi is None else 1,
            )

        if group.mig_profile is None:
            out.append(device(parent, group.memory_mib))
            continue
        slices, memory = MIG_PROFILES[group.mig_profile]
        out += [device(mig_uuid(parent, gi), memory, gi) for gi in range(1, slices + 1)]
    for d in out:
        d.noise_base = rng.randrange(1 << 20)
        d.head = _head(d)
    return out


def _head(d: Device) -> bytes:
    """The part of a GpuSample's JSON that never changes, in the model's field order."""
    head = f'{{"uuid":"{d.uuid}","index":{d.index},"model":{json.dumps(d.model)}'
    if d.parent_uuid is not None:
        head += (
            f',"mig":{{"parent_uuid":"{d.parent_uuid}","gpu_instance_id":{d.gpu_instance_id},'
            f'"compute_instance_id":0,"profile":"{d.mig_profile}"}}'
        )
    return head.encode()
