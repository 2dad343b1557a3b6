"""Pack on fewer nodes: multi-node GPU work whose runs held GPUs on more nodes than they
needed (``v_spread_work``, migration 017), repeated.

The rule: a family (a Slurm job family, a Kubernetes gang's workload) with at least
MIN_TO_RECOMMEND['pack_nodes'] runs of the same GPU count spread over more nodes than
ceil(GPUs / the largest node's GPUs) is asked to pack: Slurm ``--nodes=<min_nodes>
--gpus-per-node=<ceil(GPUs / min_nodes)>``; a Kubernetes gang fewer, bigger workers (or a
pod affinity on the node). min_nodes is the largest for any of its runs (the smallest
largest-node of any run).

The saving, honestly: packing frees none of the run's own GPU-hours (it holds as many GPUs,
as long, or less long when its GPUs talk within a node). What it changes is where they sit:
the GPU-hours the runs held on the nodes beyond min_nodes are fragments a whole-node job
cannot use. That figure (each run's GPU-hours x extra nodes / nodes: its GPU-hours on the
extra nodes at its average per node) per week is the saving stated, and the rationale says
what it is; the ranking treats it like any other.
"""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpugap.recommend.base import (
    MIN_SAVED_GPU_H_PER_WEEK,
    MIN_TO_RECOMMEND,
    HistoryWindow,
    build,
    cv,
    evidence_in,
    said,
    sql_literal,
)
from gpugap.schemas.models import Recommendation, RecommendationChange, RecommendationTarget
from gpugap.schemas.types import Scheduler, WorkloadClass


@dataclass(frozen=True)
class SpreadRun:
    """One run (a Slurm job, or a gang of pods as one) spread over more nodes than needed."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    unit: str  # v_spread_work's allocation_id: the run, or the gang id
    nodes: int
    gpus: float
    largest_node_gpus: float
    allocated_gpu_h: float
    consumed_gpu_h: float

    @property
    def min_nodes(self) -> int:
        return max(math.ceil(self.gpus / self.largest_node_gpus), 1)

    @property
    def extra_nodes(self) -> int:
        return max(self.nodes - self.min_nodes, 0)

    @property
    def extra_gpu_h(self) -> float:
        return self.allocated_gpu_h * self.extra_nodes / self.nodes if self.nodes else 0.0


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def pack_nodes(
    target: RecommendationTarget, runs: Sequence[SpreadRun], w: HistoryWindow, now: datetime
) -> Recommendation | None:
    """Fewer nodes for a family's repeated spread runs of one GPU count."""
    kind = "pack_nodes"
    runs = [r for r in runs if r.extra_nodes > 0]
    if len(runs) < MIN_TO_RECOMMEND[kind]:
        return None
    gpus = max(r.gpus for r in runs)
    min_nodes = max(r.min_nodes for r in runs)
    per_node = math.ceil(gpus / min_nodes)
    most = max(r.nodes for r in runs)
    if min_nodes >= most:
        return None
    extra = sum(r.extra_gpu_h for r in runs)
    per_week = extra / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    t = target
    units = ", ".join(sql_literal(r.unit) for r in runs)
    query = (
        "SELECT allocation_id, nodes, gpus, largest_node_gpus, min_nodes, extra_nodes, "
        "allocated_gpu_h, consumed_gpu_h, first_day, last_day FROM v_spread_work "
        f"WHERE cluster = {sql_literal(t.cluster)} AND allocation_id IN ({units}) "
        "ORDER BY first_day, allocation_id"
    )
    allocated = sum(r.allocated_gpu_h for r in runs)
    evidence = evidence_in(
        w,
        query,
        allocations=len(runs),
        samples=len(runs),
        hours=round(sum(r.allocated_gpu_h / r.gpus for r in runs if r.gpus), 3),
        gpu_hours=round(allocated, 3),
        spread=round(cv([float(r.nodes) for r in runs]), 4),
        figures={
            "gpus": float(gpus),
            "most_nodes": float(most),
            "min_nodes": float(min_nodes),
            "gpus_per_node": float(per_node),
            "extra_node_gpu_h": round(extra, 3),
            "consumed_gpu_h": round(sum(r.consumed_gpu_h for r in runs), 3),
        },
    )
    g = int(gpus)
    if t.scheduler is Scheduler.KUBERNETES:
        apply = (
            f"# {said(t.namespace)}/{said(t.owner_name)} ({said(t.owner_kind)}): {g} GPUs on "
            f"{_nodes(min_nodes)} instead of up to {most}:\n"
            f"#   {min_nodes} workers of {per_node} GPUs each (a GPU limit of {per_node}), "
            "instead of more, smaller ones;\n"
            "#   or keep the workers and add to their pod template a podAffinity, preferred, "
            "on their gang's label with topologyKey kubernetes.io/hostname (or the scheduler's "
            "MostAllocated scoring), so they share nodes."
        )
    else:
        apply = (
            f"# in the job script of {said(t.user)}'s {said(t.job_name or 'jobs')}:\n"
            f"#SBATCH --nodes={min_nodes}\n"
            f"#SBATCH --gpus-per-node={per_node}    # {g} GPUs, were on up to {most} nodes"
        )
    rationale = (
        f"{len(runs)} runs of {g} GPUs spread over up to {most} nodes where {_nodes(min_nodes)} of "
        f"{int(min(r.largest_node_gpus for r in runs))} GPUs hold them: their GPUs talk across "
        f"the network instead of within a node. Packing frees none of their own GPU-hours; the "
        f"saving stated is the {extra:.1f} GPU-hours they held on the extra nodes, fragments a "
        "whole-node job cannot use."
    )
    change = RecommendationChange(
        parameter="nodes", from_value=f"{g} GPUs on {_nodes(most)}",
        to_value=f"{g} GPUs on {_nodes(min_nodes)} ({per_node} per node)",
    )  # fmt: skip
    return build(
        kind=kind, target=t, workload_class=runs[0].workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
