"""Placement, the seed's "where workloads should actually run": multi-node batch on
Kubernetes that spends GPU-hours in partial gangs -> Slurm (which allocates a job whole);
variable-demand services on Slurm -> Kubernetes (which scales replicas with the demand; the
demand profile is services.py's)."""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

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
    sh,
    sql_literal,
)
from gpugap.recommend.services import (
    TARGET_UTILISATION,
    VARIABLE_DEMAND,
    ServiceDemand,
    evidence_for,
    k8s_name,
    keda_cron,
    worth_it,
)
from gpugap.schemas.models import (
    Recommendation,
    RecommendationChange,
    RecommendationTarget,
)
from gpugap.schemas.types import Scheduler, WorkloadClass


@dataclass(frozen=True)
class PartialGang:
    """One partial-gang episode of a Kubernetes gang (one alert, open to resolved)."""

    target: RecommendationTarget
    gang_id: str
    alert_id: str
    idle_gpu_hours: float
    pods: int
    nodes: int
    gpus_per_pod: int


# --- (d) placement: multi-node batch with partial gangs -> Slurm ---------------------------


def placement(
    target: RecommendationTarget, gangs: Sequence[PartialGang], w: HistoryWindow, now: datetime
) -> Recommendation | None:
    """Multi-pod batch on Kubernetes that spent GPU-hours in partial gangs (some pods
    running at the barrier, others Pending): Slurm allocates all nodes or none, so those
    GPU-hours go. Saved: the partial-gang GPU-hours."""
    kind = "placement"
    if len(gangs) < MIN_TO_RECOMMEND[kind] or max(g.pods for g in gangs) < 2:
        return None
    saved = sum(g.idle_gpu_hours for g in gangs)
    per_week = saved / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    gang_ids = sorted({g.gang_id for g in gangs})
    ids = ", ".join(sql_literal(g) for g in gang_ids)
    query = (
        "SELECT alert_id, gang_id, min(opened_at) AS opened_at, max(time) AS updated_at, "
        "max(running_pods) AS running_pods, max(pending_pods) AS pending_pods, "
        "max(idle_gpu_hours) AS idle_gpu_hours FROM alerts WHERE kind = 'partial_gang' "
        f"AND cluster = {sql_literal(target.cluster)} AND gang_id IN ({ids}) "
        f"AND time >= {sql_literal(w.since)} AND time < {sql_literal(w.until)} "
        "GROUP BY alert_id, gang_id ORDER BY opened_at"
    )
    pods = max(g.pods for g in gangs)
    per_pod = max(g.gpus_per_pod for g in gangs)
    nodes = max(g.nodes for g in gangs)
    evidence = evidence_in(
        w,
        query,
        allocations=len(gang_ids),
        samples=len(gangs),
        hours=0.0,
        gpu_hours=round(saved, 3),
        spread=round(cv([g.idle_gpu_hours for g in gangs]), 4),
        figures={
            "partial_gang_gpu_h": round(saved, 3),
            "episodes": float(len(gangs)),
            "pods": float(pods),
            "nodes": float(nodes),
        },
    )
    apply = (
        f"# run {said(target.namespace)}/{said(target.owner_name)} as one Slurm job: all "
        f"{pods} workers start together or not at all\n"
        f"sbatch --nodes={pods} --ntasks-per-node=1 --gpus-per-node={max(per_pod, 1)} "
        f"--job-name={sh(target.owner_name)} train.sbatch   # srun torchrun ... inside\n"
        "# or keep it on Kubernetes with gang admission (Kueue, Volcano minAvailable)"
    )
    rationale = (
        f"{len(gangs)} partial-gang episodes ({pods} pods, up to {nodes} nodes): "
        f"{saved:.1f} GPU-hours held by running pods waiting at the barrier for pending ones. "
        "Slurm allocates a multi-node job whole, so nothing waits holding GPUs."
    )
    change = RecommendationChange(parameter="scheduler", from_value="kubernetes", to_value="slurm")
    return build(
        kind=kind, target=target, workload_class=WorkloadClass.BATCH, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip


def to_kubernetes(d: ServiceDemand, w: HistoryWindow, now: datetime) -> Recommendation | None:
    """A service on Slurm whose demand varies by hour (the busiest hour needs at least
    VARIABLE_DEMAND times the replicas of the quietest): a Slurm job holds its GPUs whole
    for its life, a Kubernetes Deployment scales with the demand. Saved: the GPU-hours
    allocated above services.py's schedule."""
    if d.target.scheduler is not Scheduler.SLURM:
        return None
    found = worth_it(d, w)
    if found is None:
        return None
    s, per_week = found
    if max(s.replicas) < VARIABLE_DEMAND * min(s.replicas):
        return None
    t = d.target
    name = k8s_name(t.job_name or t.user or "service")
    apply = (
        f"# serve {said(t.user)}'s {said(t.job_name or 'service')} (account {said(t.account)}) "
        "from a Kubernetes "
        f"Deployment, {d.gpus_per_replica} GPU a replica, scaled by the hour (UTC):\n"
        f"{keda_cron('serving', name, 'Deployment', s.replicas)}\n"
        f"# then end the Slurm job (a person does: scancel); gpugap changes no scheduler"
    )
    rationale = (
        f"a Slurm service holding {s.current} GPUs all day while its demand by hour needs "
        f"{min(s.replicas)} to {max(s.replicas)} at {TARGET_UTILISATION:.0%} utilisation "
        f"over {s.days} days: on Kubernetes it can scale with the demand."
    )
    change = RecommendationChange(parameter="scheduler", from_value="slurm", to_value="kubernetes")
    evidence = evidence_for(d, s, w)
    return build(
        kind="placement", target=t, workload_class=d.workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
