"""The truth of stranded GPUs (docs/architecture.md#stranded-gpus), from the plan, in exact
fractions, with no reference to the emitted records or to the warehouse's SQL.

Each node is polled every ``capacity_interval`` seconds from the window's start (capacity.py);
a poll at ``T`` stands for ``interval`` seconds and sees the allocations holding the node at
``T`` (``start <= T < end``). Per poll: allocated = the GPU-equivalents held (at most the
node's GPUs), free = GPUs - allocated. A node no scheduler places work on (``spare``: drained)
has its free GPUs unavailable. Else the free CPUs feed ``free_cpus x gpus / cpus`` GPUs, the
free memory ``free_memory x gpus / memory``; the free GPUs beyond the lesser of the two are
stranded, by CPU first (those beyond what the CPUs feed), by memory for the rest; the others
are usable. Who stranded them: each cause's stranded GPUs split over the allocations holding
more than their GPUs' share of the node (excess = held x gpus / node's - their GPUs), in
proportion to their excess. GPU-hours: GPUs x interval / 3600."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from typing import Any

from gpugap.simulator import scenario
from gpugap.simulator.plan import Allocation, Plan
from gpugap.simulator.resources import gpu_equivalent

FIGURES = (
    "allocated_gpu_h",
    "unallocated_gpu_h",
    "usable_free_gpu_h",
    "stranded_cpu_gpu_h",
    "stranded_memory_gpu_h",
    "stranded_gpu_h",
    "unavailable_gpu_h",
)

#: (allocation, GPU-equivalents, CPUs, memory MiB) on one node
Held = tuple[Allocation, Fraction, Fraction, Fraction]


def split(
    gpus: Fraction, cpus: Fraction, memory: Fraction, schedulable: bool, held: list[Held]
) -> tuple[dict[str, Fraction], dict[tuple[str, str], Fraction]]:
    """One poll of one node: its GPUs by figure (GPUs, not hours), and the stranded GPUs per
    (allocation id, cause)."""
    allocated = min(sum((h[1] for h in held), Fraction(0)), gpus)
    free = gpus - allocated
    out = dict.fromkeys(
        ("allocated", "free", "usable", "cpu", "memory", "unavailable"), Fraction(0)
    )
    out["allocated"], out["free"] = allocated, free
    who: dict[tuple[str, str], Fraction] = {}
    if not schedulable:
        out["unavailable"] = free
        return out, who
    free_cpus = max(cpus - sum((h[2] for h in held), Fraction(0)), Fraction(0))
    free_mem = max(memory - sum((h[3] for h in held), Fraction(0)), Fraction(0))
    cpu_fed = free_cpus * gpus / cpus if cpus > 0 else free
    mem_fed = free_mem * gpus / memory if memory > 0 else free
    stranded = max(free - min(cpu_fed, mem_fed), Fraction(0))
    out["cpu"] = min(stranded, max(free - cpu_fed, Fraction(0)))
    out["memory"] = stranded - out["cpu"]
    out["usable"] = free - stranded
    for cause, total, node_amount in (("cpu", out["cpu"], cpus), ("memory", out["memory"], memory)):
        if total <= 0 or node_amount <= 0:
            continue
        excess = {
            a.id: max((c if cause == "cpu" else m) * gpus / node_amount - g, Fraction(0))
            for a, g, c, m in held
        }
        whole = sum(excess.values(), Fraction(0))
        if whole <= 0:
            continue
        for ident, e in excess.items():
            if e > 0:
                who[ident, cause] = who.get((ident, cause), Fraction(0)) + total * e / whole
    return out, who


def compute(sc: scenario.Scenario, plan: Plan, window: int) -> dict[str, Any]:
    """Per cluster the GPU-hours of every figure, and per allocation its stranded GPU-hours
    by cause, over the polls in the window (none without ``capacity_interval``)."""
    interval = sc.scenario.capacity_interval
    held: dict[tuple[str, str], list[Held]] = defaultdict(list)
    for a in [*plan.allocations, *plan.cpu_only]:
        per: dict[str, Fraction] = defaultdict(Fraction)
        for h in a.holdings:
            per[h.device.node] += gpu_equivalent(h.device)
        for name in set(per) | set(a.cpus):
            held[a.cluster, name].append(
                (a, per.get(name, Fraction(0)), a.cpus.get(name, Fraction(0)),
                 a.memory_mib.get(name, Fraction(0)))
            )  # fmt: skip
    times = range(0, window, interval) if interval > 0 else range(0)
    sums: dict[str, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    by_alloc: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    polls = 0
    for node in plan.estate.nodes:
        mine = held.get((node.cluster, node.name), [])
        gpus = Fraction(node.gpus)
        c = sums[node.cluster]
        cache: dict[frozenset[int], Any] = {}
        for t in times:
            now = [h for h in mine if h[0].start <= t < h[0].end]
            key = frozenset(id(h[0]) for h in now)
            if key not in cache:
                cache[key] = split(gpus, node.cpus, node.memory_mib, not node.spare, now)
            fig, who = cache[key]
            polls += 1
            c["capacity"] += gpus
            for k, v in fig.items():
                c[k] += v
            for (ident, cause), v in who.items():
                by_alloc[node.cluster, ident, cause] += v
    hours = Fraction(interval, 3600)
    by_cluster = {
        cluster: {
            "capacity_gpu_h": float(s["capacity"] * hours),
            "allocated_gpu_h": float(s["allocated"] * hours),
            "unallocated_gpu_h": float(s["free"] * hours),
            "usable_free_gpu_h": float(s["usable"] * hours),
            "stranded_cpu_gpu_h": float(s["cpu"] * hours),
            "stranded_memory_gpu_h": float(s["memory"] * hours),
            "stranded_gpu_h": float((s["cpu"] + s["memory"]) * hours),
            "unavailable_gpu_h": float(s["unavailable"] * hours),
        }
        for cluster, s in sorted(sums.items())
    }
    allocations: dict[tuple[str, str], dict[str, Any]] = {}
    for (cluster, ident, cause), v in sorted(by_alloc.items()):
        row = allocations.setdefault(
            (cluster, ident),
            {"cluster": cluster, "allocation_id": ident, "cpu_gpu_h": 0.0, "memory_gpu_h": 0.0},
        )
        row[f"{cause}_gpu_h"] = float(v * hours)
    for row in allocations.values():
        row["stranded_gpu_h"] = row["cpu_gpu_h"] + row["memory_gpu_h"]
    totals = {k: sum(c[k] for c in by_cluster.values()) for k in ("capacity_gpu_h", *FIGURES)}
    return {
        "interval_s": interval,
        "polls": polls,
        "totals": totals,
        "by_cluster": by_cluster,
        "by_allocation": list(allocations.values()),
    }
