"""A smaller GPU model: job families whose GPUs stay nearly idle in little memory, moved to
a smaller model the estate really has (Princeton's Job Defense Shield rule of thumb).

The rule: a family (a Slurm job family, a Kubernetes workload) on whole GPUs of one model
whose utilisation (consumed / measured GPU-hours) and the p95 of its GPU-hours' peak
activity (fit.py's hourly peaks, at p95) both stay <= LOW_UTILISATION, whose peak memory
(the highest minute's reading, memory known in fit.MEMORY_KNOWN of its minutes) stays
<= SMALL_MEMORY_MIB, over >= MIN_GPU_HOURS measured GPU-hours in the window. The candidate
models are the estate's: ``node_capacity`` polls in the window (cluster, pool, gpu_model, the
largest gpu_memory_mib reported), in the family's own cluster. A candidate differs from the
current model, holds the peak memory x MEMORY_MARGIN, and is smaller: a lower GPU-hour rate on
the rate card when both models have one (preferred; said in the rationale), else less memory.
The candidate is the same vendor's (its nodes' devices in the window name it; a node without
telemetry counts as NVIDIA's, as every identity did before other vendors): moving from an AMD
or Intel GPU to an NVIDIA one is a port, not a downsize.
The cheapest such model wins (else the one with least memory; then the pool's name). Saved:
the current model's GPU-hours the family held, per week, freed for work that needs them.
Nothing smaller in the estate: no recommendation (a MIG slice is fit.py's).
"""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import json
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
    family_filter,
    said,
    sh,
    sql_literal,
)
from gpugap.recommend.fit import MEMORY_KNOWN
from gpugap.schemas.models import Recommendation, RecommendationChange, RecommendationTarget
from gpugap.schemas.types import Scheduler, Vendor, WorkloadClass

#: utilisation (consumed / measured) and the p95 of the hourly peaks stay at or below this
LOW_UTILISATION = 0.20
#: peak memory at or below this (10 GiB)
SMALL_MEMORY_MIB = 10 * 1024.0
#: measured GPU-hours in the window, at least
MIN_GPU_HOURS = 24.0
#: the candidate's memory holds the peak memory times this
MEMORY_MARGIN = 1.25
#: the quantile of the GPU-hours' peak activity that must stay low
PEAK_QUANTILE = 0.95
#: Kubernetes: the node label naming a node's GPU product, and how it spells a space: NVIDIA's
#: GPU feature discovery ("NVIDIA-H100-80GB-HBM3"), AMD's node labeller
#: ("AMD_Instinct_MI300X_OAM"); Intel's GPU plugin labels no product (the pool's label it is)
PRODUCT_LABELS: dict[Vendor, tuple[str, str]] = {
    Vendor.NVIDIA: ("nvidia.com/gpu.product", "-"),
    Vendor.AMD: ("amd.com/gpu.product-name", "_"),
}


@dataclass(frozen=True)
class GpuModel:
    """One GPU model in one pool (Slurm partitions, a Kubernetes node pool) of a cluster."""

    cluster: str
    pool: str
    gpu_model: str
    memory_mib: float | None  # one GPU's, the largest reported
    rate: float | None  # the rate card's GPU-hour rate for its nodes (None: no card)
    currency: str = ""
    vendor: Vendor = Vendor.NVIDIA


@dataclass(frozen=True)
class ModelUse:
    """A family's whole-GPU allocations on one model."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    current: GpuModel
    gpus: int  # per allocation (the most)
    allocations: int
    gpu_hours: float  # measured
    consumed_gpu_hours: float
    measured_minutes: int
    memory_minutes: int
    allocation_peaks: tuple[float, ...]  # each allocation's p95 of hourly peaks
    peak_memory_mib: float

    @property
    def utilisation(self) -> float:
        return self.consumed_gpu_hours / self.gpu_hours if self.gpu_hours > 0 else 0.0

    @property
    def peak_activity(self) -> float:
        return max(self.allocation_peaks, default=0.0)


def _smaller(c: GpuModel, cur: GpuModel) -> bool:
    if c.rate is not None and cur.rate is not None:
        return c.rate < cur.rate
    return c.memory_mib is not None and cur.memory_mib is not None and c.memory_mib < cur.memory_mib


def smaller_model(u: ModelUse, estate: Sequence[GpuModel]) -> GpuModel | None:
    """The estate's model the family would fit on and that is smaller (rule in the module
    docstring), or None."""
    need = u.peak_memory_mib * MEMORY_MARGIN
    fits = [
        c
        for c in estate
        if c.cluster == u.current.cluster
        and c.vendor == u.current.vendor
        and c.gpu_model != u.current.gpu_model
        and c.memory_mib is not None
        and c.memory_mib >= need
        and _smaller(c, u.current)
    ]
    return min(
        fits,
        key=lambda c: (c.rate if c.rate is not None else float("inf"), c.memory_mib, c.pool),
        default=None,
    )


def gpu_model(
    u: ModelUse, estate: Sequence[GpuModel], w: HistoryWindow, now: datetime
) -> Recommendation | None:
    """A smaller model from the estate when the family stays low, small and long enough."""
    kind = "gpu_model"
    days = int(u.measured_minutes / 1440)
    if u.gpu_hours < MIN_GPU_HOURS or days < MIN_TO_RECOMMEND[kind]:
        return None
    if u.memory_minutes < MEMORY_KNOWN * u.measured_minutes or u.peak_memory_mib <= 0:
        return None  # memory unknown: no model can be said to hold it
    if u.utilisation > LOW_UTILISATION or u.peak_activity > LOW_UTILISATION:
        return None
    if u.peak_memory_mib > SMALL_MEMORY_MIB:
        return None
    to = smaller_model(u, estate)
    if to is None:
        return None
    per_week = u.gpu_hours / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    cur, t = u.current, u.target
    priced = to.rate is not None and cur.rate is not None
    query = (
        "SELECT g.allocation_id, g.node, n.gpu_model, sum(g.allocated_s - g.unmeasured_s) / 3600 "
        "AS gpu_h, sum(g.consumed_gpu_s) / 3600 AS consumed_gpu_h, quantileExact(0.95)"
        "(g.activity_max) AS p95_peak_activity, max(g.memory_max_mib) AS peak_memory_mib "
        "FROM gpu_hours AS g FINAL LEFT JOIN (SELECT cluster, node, argMax(gpu_model, time) "
        "AS gpu_model FROM node_capacity FINAL GROUP BY cluster, node) AS n "
        "ON n.cluster = g.cluster AND n.node = g.node "
        f"WHERE g.hour >= {sql_literal(w.since)} AND g.hour < {sql_literal(w.until)} "
        "AND g.allocation_id IN "
        f"(SELECT allocation_id FROM v_allocations WHERE {family_filter(t)}) "
        "GROUP BY g.allocation_id, g.node, n.gpu_model ORDER BY g.allocation_id, g.node"
    )
    figures = {
        "utilisation": round(u.utilisation, 4),
        "p95_peak_activity": round(u.peak_activity, 4),
        "peak_memory_mib": round(u.peak_memory_mib, 1),
        "to_memory_mib": float(to.memory_mib or 0.0),
        "gpus": float(u.gpus),
    }
    if cur.memory_mib is not None:
        figures["from_memory_mib"] = float(cur.memory_mib)
    cost = ""
    if priced:
        assert to.rate is not None and cur.rate is not None
        per_week_cost = u.gpu_hours * (cur.rate - to.rate) / w.weeks
        figures |= {"from_rate": cur.rate, "to_rate": to.rate,
                    "saved_cost_per_week": round(per_week_cost, 2)}  # fmt: skip
        cost = (
            f"; on the rate card {said(to.gpu_model)} costs {to.rate:.2f} a GPU-hour against "
            f"{cur.rate:.2f} for {said(cur.gpu_model)} (the rate decides what is smaller): "
            f"{per_week_cost:.2f} {said(cur.currency or to.currency)} a week less"
        )
    else:
        cost = (
            f"; no rate card prices both, so smaller means less memory ({said(to.gpu_model)} "
            f"{(to.memory_mib or 0) / 1024:.0f} GiB against "
            f"{(cur.memory_mib or 0) / 1024:.0f} GiB)"
        )
    evidence = evidence_in(
        w,
        query,
        allocations=u.allocations,
        samples=days,
        hours=round(u.measured_minutes / 60, 3),
        gpu_hours=round(u.gpu_hours, 3),
        spread=round(cv(u.allocation_peaks), 4),
        figures=figures,
    )
    product = PRODUCT_LABELS.get(to.vendor)
    if t.scheduler is Scheduler.KUBERNETES:
        apply = (
            f"# {said(t.namespace)}/{said(t.owner_name)}: run on {said(to.gpu_model)} "
            f"(node pool {said(to.pool)}) instead of {said(cur.gpu_model)}:\n"
        )
        if product is None:  # no product label: the pool's own label is the one to select
            apply += "# select the pool by its node label"
        else:
            key, space = product
            label = said(to.gpu_model).replace(" ", space)  # as the vendor's labeller spells it
            patch = {"spec": {"template": {"spec": {"nodeSelector": {key: label}}}}}
            apply += (
                f"kubectl -n {sh(t.namespace)} patch {sh((t.owner_kind or 'pod').lower())} "
                f"{sh(t.owner_name)} --type=merge -p {sh(json.dumps(patch))}\n"
                "# or select the pool by its node label instead of the GPU product"
            )
    else:
        apply = (
            f"# in the job script of {said(t.user)}'s {said(t.job_name or 'jobs')}: run on "
            f"{said(to.gpu_model)} instead of {said(cur.gpu_model)}:\n"
            f"#SBATCH --partition={sh(to.pool)}\n"
            f"#SBATCH --gres=gpu:{sh(to.gpu_model)}:{u.gpus}"
        )
    rationale = (
        f"{u.allocations} allocations on {said(cur.gpu_model)} used {u.utilisation:.1%} of "
        f"{u.gpu_hours:.1f} GPU-hours (p95 of the hourly peaks {u.peak_activity:.1%}; at most "
        f"{LOW_UTILISATION:.0%}) in at most {u.peak_memory_mib / 1024:.1f} GiB (at most "
        f"{SMALL_MEMORY_MIB / 1024:.0f} GiB): {said(to.gpu_model)} in {said(to.pool)} holds "
        f"that x {MEMORY_MARGIN}" + cost + f"; the {said(cur.gpu_model)} GPU-hours are freed "
        "for work that needs them."
    )
    change = RecommendationChange(
        parameter="gpu_model", from_value=f"{u.gpus} x {cur.gpu_model}",
        to_value=f"{u.gpus} x {to.gpu_model} ({to.pool})",
    )  # fmt: skip
    return build(
        kind=kind, target=t, workload_class=u.workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
