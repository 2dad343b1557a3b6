"""Fewer cores (or less memory) per GPU: job families that hold more CPUs or memory than
their GPUs' share of the node, leaving the node's other GPUs without CPUs or memory beside
them (stranded, ``v_stranded_by_allocation``, migration 017).

The rule: a family whose allocations were charged stranded GPU-hours in the window (the
view splits each poll's stranded GPUs over the allocations beyond their share, in proportion
to their excess) is asked to hold at most the node's per-GPU share: floor(node CPUs / node
GPUs) CPUs per GPU (``--cpus-per-gpu``, a pod's cpu request), floor(node memory / node GPUs)
MiB per GPU (``--mem-per-gpu``, a pod's memory request); the smallest share of the nodes it
ran on, so the request fits on each. One recommendation per family and cause. Saved: the
stranded GPU-hours it was charged, per week. A CPU-only allocation on a GPU node (no GPU to
share against) is not this recommender's: it belongs on a CPU partition.
"""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

from gpugap.recommend.base import (
    MIN_SAVED_GPU_H_PER_WEEK,
    MIN_TO_RECOMMEND,
    HistoryWindow,
    build,
    cv,
    evidence_in,
    family_filter,
    said,
    sh,
    sql_literal,
)
from gpugap.schemas.models import Recommendation, RecommendationChange, RecommendationTarget
from gpugap.schemas.types import Scheduler, WorkloadClass

#: the change's parameter per cause
PARAMETER = {"cpu": "cpus_per_gpu", "memory": "mem_per_gpu_mib"}


@dataclass(frozen=True)
class Stranding:
    """A family's allocations charged stranded GPU-hours for one cause ('cpu' | 'memory')."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    cause: str
    gpus: int  # held per allocation on a node (the most)
    allocations: int
    held_per_gpu: tuple[float, ...]  # each allocation's CPUs (MiB) per GPU held, its most
    node_share: float  # the smallest node CPUs (MiB) per GPU of the nodes it ran on
    stranded_gpu_hours: float
    hours: float  # polled hours of its allocations on those nodes
    nodes: tuple[str, ...]


def _n(value: float) -> str:
    return f"{value:g}"


def cpus_per_gpu(s: Stranding, w: HistoryWindow, now: datetime) -> Recommendation | None:
    """At most the node's per-GPU share, when the family stranded GPU-hours."""
    kind = "cpus_per_gpu"
    if s.allocations < MIN_TO_RECOMMEND[kind] or s.gpus <= 0 or not s.held_per_gpu:
        return None
    share = max(math.floor(s.node_share), 1)
    held = max(s.held_per_gpu)
    if held <= share:
        return None
    per_week = s.stranded_gpu_hours / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    t, cpu = s.target, s.cause == "cpu"
    what = "CPUs" if cpu else "MiB of memory"
    query = (
        "SELECT allocation_id, node, cause, max(gpus) AS gpus, max(cpus) AS cpus, "
        "max(memory_mib) AS memory_mib, round(sum(stranded_gpu_h), 6) AS stranded_gpu_h "
        f"FROM v_stranded_by_allocation WHERE time >= {sql_literal(w.since)} "
        f"AND time < {sql_literal(w.until)} AND cause = {sql_literal(s.cause)} "
        f"AND allocation_id IN (SELECT allocation_id FROM v_allocations WHERE "
        f"{family_filter(t)}) GROUP BY allocation_id, node, cause ORDER BY allocation_id, node"
    )
    evidence = evidence_in(
        w,
        query,
        allocations=s.allocations,
        samples=s.allocations,
        hours=round(s.hours, 3),
        gpu_hours=round(s.hours * s.gpus, 3),
        spread=round(cv(s.held_per_gpu), 4),
        figures={
            "stranded_gpu_h": round(s.stranded_gpu_hours, 3),
            "held_per_gpu": round(held, 3),
            "node_share_per_gpu": round(s.node_share, 3),
            "gpus": float(s.gpus),
            "nodes": float(len(s.nodes)),
        },
    )
    if t.scheduler is Scheduler.KUBERNETES:
        resource, value = ("cpu", str(share * s.gpus)) if cpu else ("memory", f"{share * s.gpus}Mi")
        patch = json.dumps(
            [{"op": "add", "path": f"/spec/template/spec/containers/0/resources/requests/"
              f"{resource}", "value": value}]
        )  # fmt: skip
        apply = (
            f"# {said(t.namespace)}/{said(t.owner_name)}: request at most the node's share per "
            f"GPU ({share} {what} a GPU, {s.gpus} GPUs; its limit too, if it sets one):\n"
            f"kubectl -n {sh(t.namespace)} patch {sh((t.owner_kind or 'pod').lower())} "
            f"{sh(t.owner_name)} --type=json -p {sh(patch)}"
        )
    else:
        flag = f"--cpus-per-gpu={share}" if cpu else f"--mem-per-gpu={share}M"
        apply = (
            f"# in the job script of {said(t.user)}'s {said(t.job_name or 'jobs')} (instead "
            f"of {'--cpus-per-task / -c' if cpu else '--mem'}):\n"
            f"#SBATCH {flag}"
        )
    nodes = ", ".join(said(n) for n in s.nodes[:5]) + (" ..." if len(s.nodes) > 5 else "")
    rationale = (
        f"{s.allocations} allocations held up to {_n(round(held, 2))} {what} per GPU on nodes "
        f"offering {_n(round(s.node_share, 2))} per GPU ({nodes}): the node's other GPUs were "
        f"left without {'CPUs' if cpu else 'memory'} beside them, {s.stranded_gpu_hours:.1f} "
        f"stranded GPU-hours charged to this family; at most {share} per GPU leaves them usable."
    )
    change = RecommendationChange(
        parameter=PARAMETER[s.cause], from_value=_n(round(held, 3)), to_value=str(share)
    )
    return build(
        kind=kind, target=t, workload_class=s.workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
