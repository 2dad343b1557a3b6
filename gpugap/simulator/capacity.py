"""Node capacity polls (node-capacity.v1) from the plan: every ``capacity_interval`` seconds
from the window's start, one record per node with its GPUs, CPUs and memory and what each
allocation holding it at that instant holds of them (Slurm jobs and pods alike, GPU ones and
CPU-only ones), as ``gpugap produce slurm-capacity`` / ``kubernetes-capacity`` poll. A spare
node (``spare``: no scheduler places work on it) is drained: not schedulable. A poll stands for
``interval_s`` seconds from its time (docs/architecture.md#stranded-gpus)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from fractions import Fraction

from gpugap.schemas.models import NodeAllocation, NodeCapacity
from gpugap.simulator.estate import Node
from gpugap.simulator.plan import Allocation, Plan
from gpugap.simulator.resources import gpu_equivalent

SOURCE = {"slurm": "slurm_scontrol", "kubernetes": "kubernetes"}

#: (allocation, GPU-equivalents it holds of the node)
Claim = tuple[Allocation, Fraction]


def claims(plan: Plan) -> dict[tuple[str, str], list[Claim]]:
    """Per (cluster, node): every allocation that ever holds some of it."""
    out: dict[tuple[str, str], list[Claim]] = defaultdict(list)
    for a in plan.allocations:
        per: dict[str, Fraction] = defaultdict(Fraction)
        for h in a.holdings:
            per[h.device.node] += gpu_equivalent(h.device)
        for node, gpus in per.items():
            out[a.cluster, node].append((a, gpus))
    for a in plan.cpu_only:
        for node in a.cpus:
            out[a.cluster, node].append((a, Fraction(0)))
    return out


def poll_times(interval: int, window: int) -> range:
    return range(0, window, interval) if interval > 0 else range(0)


def polls(plan: Plan, origin: datetime, interval: int, window: int) -> Iterator[
    tuple[int, NodeCapacity]
]:  # fmt: skip
    """(time s, record) of every poll in the window, by time then node."""
    held = claims(plan)
    nodes = plan.estate.nodes
    for t in poll_times(interval, window):
        for node in nodes:
            mine = held.get((node.cluster, node.name), [])
            yield t, record(node, plan, mine, origin=origin, t=t, interval=interval)


def record(
    node: Node, plan: Plan, held: list[Claim], *, origin: datetime, t: int, interval: int
) -> NodeCapacity:
    scheduler = plan.estate.clusters[node.cluster].scheduler
    allocations = tuple(
        NodeAllocation(
            allocation_id=a.id,
            gpus=float(gpus),
            cpus=float(a.cpus.get(node.name, 0)),
            memory_mib=float(a.memory_mib.get(node.name, 0)),
        )
        for a, gpus in sorted(held, key=lambda c: c[0].id)
        if a.start <= t < a.end
    )
    return NodeCapacity(
        cluster=node.cluster,
        node=node.name,
        time=origin + timedelta(seconds=t),
        interval_s=float(interval),
        scheduler=scheduler,
        source=SOURCE[scheduler],
        pool=node.group,
        gpu_model=node.model,
        gpu_memory_mib=node.gpu_memory_mib,
        gpus=float(node.gpus),
        cpus=float(node.cpus),
        memory_mib=float(node.memory_mib),
        schedulable=not node.spare,
        allocations=allocations,
    )
