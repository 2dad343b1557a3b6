"""Smaller or shared GPUs: workloads on whole GPUs whose peak activity and memory fit a MIG
profile (or a share of one GPU by time-slicing or MPS).

The fit: the smallest profile whose compute share (its slices of 7) holds the workload's
peak activity and whose memory holds its peak memory, each with 10 % headroom. Peak activity
is the 99th percentile of its GPU-hours' highest minute (the share of the whole GPU's SMs
busy: one slice of seven has a seventh of them; an hour's peak is never below its minutes',
so this errs towards the bigger slice); peak memory is the highest minute's reading, no
quantile (running out of memory kills the job). Both come from the hourly rollup (migration
010). Saved: the rest of each GPU, (1 - k/7) x its GPU-hours, free for other slices.

The GPU model: the GPU-minute tables carry none, so it comes from the cluster's rate card
(its default model, docs/cost.md), else DEFAULT_GPU_MODEL, said in the rationale. A card
that names a GPU without MIG profiles here (an L40S, an A10) gets no recommendation, and so
does a workload on another vendor's GPUs (its devices' identities name the vendor): MIG is
NVIDIA's, and no catalog of AMD compute partitions or Intel tiles is kept here, so nothing is
said rather than something wrong.
"""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import re
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
from gpugap.schemas.models import (
    Recommendation,
    RecommendationChange,
    RecommendationTarget,
)
from gpugap.schemas.types import Scheduler, Vendor, WorkloadClass

#: MIG profiles smaller than the whole GPU: (name, compute slices of 7, memory GiB), NVIDIA's
#: MIG user guide tables for each GPU
MIG_PROFILES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "A100-40GB": (("1g.5gb", 1, 5), ("2g.10gb", 2, 10), ("3g.20gb", 3, 20), ("4g.20gb", 4, 20)),
    "A100-80GB": (("1g.10gb", 1, 10), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40)),
    "H100-80GB": (("1g.10gb", 1, 10), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40)),
    "H100-94GB": (("1g.12gb", 1, 12), ("2g.24gb", 2, 24), ("3g.47gb", 3, 47), ("4g.47gb", 4, 47)),
    "H200-141GB": (("1g.18gb", 1, 18), ("2g.35gb", 2, 35), ("3g.71gb", 3, 71), ("4g.71gb", 4, 71)),
}
DEFAULT_GPU_MODEL = "H100-80GB"
MIG_SLICES = 7
FIT_HEADROOM = 0.9
PEAK_QUANTILE = 0.99
#: memory readings needed in this share of the measured minutes (unknown memory: no fit)
MEMORY_KNOWN = 0.9
#: nothing whose peak needs more than the largest profile's compute is read further
MAX_FIT_ACTIVITY = 4 / MIG_SLICES * FIT_HEADROOM

_MODEL = re.compile(r"(A100|H100|H200).*?(\d{2,3})\s*GB", re.IGNORECASE)


@dataclass(frozen=True)
class GpuUse:
    """A workload's whole-GPU allocations: their peaks and GPU-hours."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    gpus: int  # per allocation (the most)
    allocations: int
    gpu_hours: float  # allocated
    measured_minutes: int  # GPU-minutes with telemetry
    memory_minutes: int  # of them, with a memory reading
    allocation_peaks: tuple[float, ...]  # each allocation's PEAK_QUANTILE of hourly peaks
    peak_memory_mib: float
    gpu_model: str | None  # the rate card's, where there is one
    #: who made its GPUs (None: several vendors' or unknown)
    vendor: Vendor | None = Vendor.NVIDIA

    @property
    def peak_activity(self) -> float:
        return max(self.allocation_peaks, default=0.0)


def model_key(name: str | None) -> str | None:
    """'NVIDIA H100 80GB HBM3' or 'H100-80GB' -> 'H100-80GB' (None: not a known one)."""
    m = _MODEL.search(name or "")
    if m is None:
        return None
    key = f"{m.group(1).upper()}-{m.group(2)}GB"
    return key if key in MIG_PROFILES else None


def fitting(
    peak_activity: float, peak_memory_mib: float, model: str
) -> tuple[str, int, int] | None:
    for name, slices, gib in MIG_PROFILES[model]:
        if (
            peak_activity <= slices / MIG_SLICES * FIT_HEADROOM
            and peak_memory_mib <= gib * 1024 * FIT_HEADROOM
        ):
            return name, slices, gib
    return None


def gpu_share(u: GpuUse, w: HistoryWindow, now: datetime) -> Recommendation | None:
    """The smallest MIG profile that fits, when the memory is known and the GPU-days enough."""
    kind = "gpu_share"
    days = int(u.measured_minutes / 1440)
    if u.vendor is not Vendor.NVIDIA:
        return None  # MIG profiles are NVIDIA's: no slice to move to
    if u.measured_minutes == 0 or days < MIN_TO_RECOMMEND[kind]:
        return None
    if u.memory_minutes < MEMORY_KNOWN * u.measured_minutes or u.peak_memory_mib <= 0:
        return None
    model = model_key(u.gpu_model)
    if model is None and u.gpu_model:
        return None  # the card names a GPU without MIG (an L40S): no slice to move to
    assumed = model is None
    model = model or DEFAULT_GPU_MODEL
    fit = fitting(u.peak_activity, u.peak_memory_mib, model)
    if fit is None:
        return None
    profile, slices, gib = fit
    per_week = (1 - slices / MIG_SLICES) * u.gpu_hours / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    t = u.target
    query = (
        "SELECT allocation_id, gpu_uuid, quantileExact(0.99)(activity_max) AS peak_activity, "
        "max(memory_max_mib) AS peak_memory_mib, sum(memory_minutes) AS minutes_with_memory "
        f"FROM gpu_hours FINAL WHERE hour >= {sql_literal(w.since)} "
        f"AND hour < {sql_literal(w.until)} AND allocation_id IN "
        f"(SELECT allocation_id FROM v_allocations WHERE {family_filter(t)}) "
        "GROUP BY allocation_id, gpu_uuid ORDER BY allocation_id, gpu_uuid"
    )
    evidence = evidence_in(
        w,
        query,
        allocations=u.allocations,
        samples=days,
        hours=round(u.measured_minutes / 60, 3),
        gpu_hours=round(u.gpu_hours, 3),
        spread=round(cv(u.allocation_peaks), 4),
        figures={
            "peak_activity": round(u.peak_activity, 4),
            "peak_memory_mib": round(u.peak_memory_mib, 1),
            "profile_slices": float(slices),
            "profile_memory_gib": float(gib),
            "gpus": float(u.gpus),
        },
    )
    res = f"nvidia.com/mig-{profile}"
    if t.scheduler is Scheduler.KUBERNETES:
        apply = (
            f"# {said(t.namespace)}/{said(t.owner_name)}: ask for a {profile} slice instead "
            "of a GPU (GPU operator, MIG strategy 'mixed'):\n"
            f"kubectl -n {sh(t.namespace)} patch {sh((t.owner_kind or 'pod').lower())} "
            f"{sh(t.owner_name)} "
            '--type=json -p \'[{"op": "remove", "path": '
            '"/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu"}, '
            '{"op": "add", "path": "/spec/template/spec/containers/0/resources/limits/'
            f'nvidia.com~1mig-{profile}", "value": "{u.gpus}"}}]\'\n'
            "# or share whole GPUs: the device plugin's sharing.timeSlicing (or MPS)"
        )
    else:
        apply = (
            f"# in the job script of {said(t.user)}'s {said(t.job_name or 'jobs')} (gres.conf with "
            "AutoDetect=nvml names MIG slices by profile):\n"
            f"#SBATCH --gres=gpu:{profile}:{u.gpus}    # was --gpus={u.gpus}"
        )
    rationale = (
        f"peak activity {u.peak_activity:.1%} of a whole GPU (p99 of its hourly peaks) and peak "
        f"memory {u.peak_memory_mib / 1024:.1f} GiB fit {profile} ({slices}/7 of the SMs, "
        f"{gib} GiB) with {1 - FIT_HEADROOM:.0%} headroom on a {model}"
        + (" (assumed: set the cluster's gpu_model in the rate card)" if assumed else "")
        + f"; the other {MIG_SLICES - slices}/7 of each GPU is free for other work ({res})."
    )
    change = RecommendationChange(
        parameter="gpu_profile", from_value=f"{u.gpus} x {model}",
        to_value=f"{u.gpus} x {profile}",
    )  # fmt: skip
    return build(
        kind=kind, target=t, workload_class=u.workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
