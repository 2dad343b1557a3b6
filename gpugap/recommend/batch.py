"""Batch recommenders: a Slurm job family's ``--time`` from its elapsed times, and the GPU
count of allocations that leave some of their GPUs idle for most of their life."""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpugap.queue.limits import (
    TIME_MARGIN,
    TIME_QUANTILE,
    right_sized_limit,
)
from gpugap.recommend.base import (
    MIN_SAVED_GPU_H_PER_WEEK,
    MIN_TO_RECOMMEND,
    HistoryWindow,
    build,
    cv,
    evidence_in,
    family_filter,
    hms,
    said,
    sh,
    slurm_target,
    sql_literal,
)
from gpugap.schemas.models import (
    Recommendation,
    RecommendationChange,
    RecommendationTarget,
)
from gpugap.schemas.types import Scheduler, Vendor, WorkloadClass, vendor_of
from gpugap.stats import quantile

#: a GPU idle (below the idle threshold) in at least this share of its measured minutes is
#: "idle for most of its life"
GPU_IDLE_LIFE = 0.9
#: the device plugin's resource a pod asks whole GPUs of, by vendor (Intel's under the xe
#: driver: gpu.intel.com/xe)
DEVICE_RESOURCES = {
    Vendor.NVIDIA: "nvidia.com/gpu",
    Vendor.AMD: "amd.com/gpu",
    Vendor.INTEL: "gpu.intel.com/i915",
}


def vendor_in(uuids: Sequence[str] | None) -> Vendor | None:
    """The one vendor some GPU identities (or their prefixes) name; None: several or none.
    Figures from before the vendors were asked (no identities given) are NVIDIA's."""
    if uuids is None:
        return Vendor.NVIDIA
    found = {vendor_of(u) for u in uuids}
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class SlurmFamily:
    """The jobs of one family that ended in the window."""

    cluster: str
    user: str
    account: str
    job_name: str
    partition: str
    qos: str
    elapsed_s: tuple[float, ...]  # completed jobs
    limit_s: tuple[int, ...]  # their time limits
    gpus: tuple[int, ...]  # their GPUs
    timeouts: int  # jobs that hit their limit (TIMEOUT)
    jobs: int  # every job that ended


@dataclass(frozen=True)
class GpuFamily:
    """Multi-GPU allocations of one workload that asked for the same number of GPUs."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    gpus: int  # requested per allocation (GPUs seen in its minutes)
    allocations: int
    max_busy: int  # the most GPUs any of them kept busy
    mean_busy: float
    sd_busy: float
    hours: float  # wall-clock hours, summed over the allocations
    gpu_hours: float  # GPU-hours allocated
    consumed_gpu_hours: float
    #: who made its GPUs (None: several vendors'), from their identities
    vendor: Vendor | None = Vendor.NVIDIA


# --- (a) Slurm --time per job family ------------------------------------------------------


def time_limit(fam: SlurmFamily, w: HistoryWindow, now: datetime) -> Recommendation | None:
    """--time = the family's p95 elapsed + 20 %, rounded up to 15 min, when that cuts the
    current limit by at least a quarter. The GPU-hours saved are the padding removed: GPUs x
    (old limit - new limit) per job, time the scheduler reserves in its plan and backfill
    cannot use. Families with a TIMEOUT in the window are left alone (the limit binds)."""
    kind = "slurm_time_limit"
    n = len(fam.elapsed_s)
    new = right_sized_limit(fam.elapsed_s, fam.limit_s, fam.timeouts)
    if new is None:
        return None
    current = max(fam.limit_s)
    q = quantile(fam.elapsed_s, TIME_QUANTILE)
    removed = sum(g * max(lim - new, 0) for g, lim in zip(fam.gpus, fam.limit_s, strict=True))
    per_week = removed / 3600 / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    target = slurm_target(fam.cluster, fam.user, fam.account, fam.job_name, fam.partition)
    over = sum(1 for e in fam.elapsed_s if e > new)
    hours = sum(fam.elapsed_s) / 3600
    gpu_hours = sum(g * e for g, e in zip(fam.gpus, fam.elapsed_s, strict=True)) / 3600
    padding = sum(
        g * max(lim - e, 0) for g, lim, e in zip(fam.gpus, fam.limit_s, fam.elapsed_s, strict=True)
    )
    ratios = [lim / max(e, 1) for lim, e in zip(fam.limit_s, fam.elapsed_s, strict=True)]
    query = (
        "SELECT allocation_id, gpus_requested, time_limit_s, elapsed_s, final_state, end_time "
        f"FROM v_slurm_padding WHERE cluster = {sql_literal(fam.cluster)} "
        f"AND user = {sql_literal(fam.user)} AND account = {sql_literal(fam.account)} "
        f"AND name = {sql_literal(fam.job_name)} AND partition = {sql_literal(fam.partition)} "
        f"AND end_time >= {sql_literal(w.since)} AND end_time < {sql_literal(w.until)} "
        "ORDER BY end_time"
    )
    evidence = evidence_in(
        w,
        query,
        allocations=fam.jobs,
        samples=n,
        hours=round(hours, 3),
        gpu_hours=round(gpu_hours, 3),
        spread=round(cv(fam.elapsed_s), 4),
        figures={
            "p95_elapsed_s": round(q, 1),
            "max_elapsed_s": max(fam.elapsed_s),
            "median_limit_ratio": round(statistics.median(ratios), 3),
            "padding_gpu_h": round(padding / 3600, 3),
            "jobs_over_new_limit": float(over),
        },
    )
    name = f" --name={sh(fam.job_name)}" if fam.job_name else ""
    part = f" --partition={sh(fam.partition)}" if fam.partition else ""
    apply = (
        f"# in the job script of {said(fam.user)}'s {said(fam.job_name or 'jobs')} "
        f"(account {said(fam.account)}):\n"
        f"#SBATCH --time={hms(new)}\n"
        f"# jobs already queued (a person runs this; gpugap never does):\n"
        f"squeue -h -t PD -u {sh(fam.user)}{name}{part} -o %i | "
        f"xargs -r -I{{}} scontrol update JobId={{}} TimeLimit={hms(new)}"
    )
    if fam.qos:
        apply += (
            f"\n# or cap it for the QOS: sacctmgr modify qos {sh(fam.qos)} set MaxWall={hms(new)}"
        )
    rationale = (
        f"{n} completed jobs: p95 elapsed {hms(q)}, limit {hms(current)} "
        f"({current / max(q, 1):.1f}x); p95 + {TIME_MARGIN:.0%} rounded up to 15 min = "
        f"{hms(new)}; {over} of {n} past jobs ran longer. Padded limits hold GPUs in the "
        "scheduler's plan, so backfill cannot start smaller jobs in front of them."
    )
    change = RecommendationChange(
        parameter="time_limit_s", from_value=str(current), to_value=str(new)
    )
    return build(
        kind=kind, target=target, workload_class=WorkloadClass.BATCH, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip


# --- (b) GPU count ------------------------------------------------------------------------


def gpu_count(fam: GpuFamily, w: HistoryWindow, now: datetime) -> Recommendation | None:
    """GPUs = the most GPUs any allocation of the family kept busy (a GPU idle in 90 % of its
    measured minutes was not needed): the count that would have done the same work. Saved:
    (requested - needed) GPUs x the allocations' hours."""
    kind = "gpu_count"
    needed = max(fam.max_busy, 1)
    if needed >= fam.gpus or fam.allocations < MIN_TO_RECOMMEND[kind]:
        return None
    saved = (fam.gpus - needed) * fam.hours
    per_week = saved / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    t = fam.target
    spread = fam.sd_busy / fam.mean_busy if fam.mean_busy > 0 and fam.allocations > 1 else 0.0
    query = (
        "SELECT allocation_id, gpu_uuid, sum(allocated_gpu_h) AS allocated_gpu_h, "
        "sum(idle_gpu_h) AS idle_gpu_h, sum(consumed_gpu_h) AS consumed_gpu_h "
        f"FROM v_capacity_gap WHERE hour >= {sql_literal(w.since)} "
        f"AND hour < {sql_literal(w.until)} AND allocation_id IN (SELECT allocation_id "
        f"FROM v_allocations WHERE {family_filter(t)}) "
        "GROUP BY allocation_id, gpu_uuid ORDER BY allocation_id, gpu_uuid"
    )
    evidence = evidence_in(
        w,
        query,
        allocations=fam.allocations,
        samples=fam.allocations,
        hours=round(fam.hours, 3),
        gpu_hours=round(fam.gpu_hours, 3),
        spread=round(spread, 4),
        figures={
            "gpus_requested": float(fam.gpus),
            "max_busy_gpus": float(fam.max_busy),
            "mean_busy_gpus": round(fam.mean_busy, 3),
            "consumed_gpu_h": round(fam.consumed_gpu_hours, 3),
        },
    )
    if t.scheduler is Scheduler.SLURM:
        apply = (
            f"# in the job script of {said(t.user)}'s {said(t.job_name or 'jobs')}:\n"
            f"#SBATCH --gpus={needed}    # was {fam.gpus} (or --gres=gpu:{needed} per node)"
        )
    else:
        # the vendor's device plugin resource ('/' is '~1' in a JSON pointer)
        resource = DEVICE_RESOURCES[fam.vendor] if fam.vendor else "<the GPU resource>"
        res = resource.replace("/", "~1")
        apply = (
            f"kubectl -n {sh(t.namespace)} patch {sh((t.owner_kind or 'pod').lower())} "
            f"{sh(t.owner_name)} "
            f'--type=json -p \'[{{"op": "replace", "path": '
            f'"/spec/template/spec/containers/0/resources/limits/{res}", '
            f'"value": "{needed}"}}]\''
        )
    rationale = (
        f"{fam.allocations} allocations of {fam.gpus} GPUs kept at most {fam.max_busy} busy "
        f"(a GPU idle in {GPU_IDLE_LIFE:.0%}+ of its minutes counts as unused); "
        f"{needed} GPUs would have done the same work."
    )
    change = RecommendationChange(parameter="gpus", from_value=str(fam.gpus), to_value=str(needed))
    return build(
        kind=kind, target=t, workload_class=fam.workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
