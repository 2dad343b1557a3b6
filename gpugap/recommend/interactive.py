"""Interactive: an idle-culling timeout for notebooks idle most of the day, from their idle
episodes (minutes in a row with every GPU idle)."""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
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
from gpugap.schemas.models import (
    Recommendation,
    RecommendationChange,
    RecommendationTarget,
)
from gpugap.schemas.types import Scheduler, WorkloadClass
from gpugap.stats import quantile

#: notebooks: idle in at least this share of their measured minutes
NOTEBOOK_IDLE_SHARE = 0.5
#: idle episodes shorter than this are pauses (the user thinking, reading, in a meeting)
PAUSE_MAX_MIN = 60
#: the culling timeout: above 90 % of the pauses, rounded up to 15 min, within these bounds
CULL_MIN_MIN, CULL_MAX_MIN, CULL_GRANULE_MIN = 30, 60, 15
PAUSE_QUANTILE = 0.9


@dataclass(frozen=True)
class NotebookIdle:
    """One notebook allocation's idle episodes (minutes in a row with every GPU idle)."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    allocation_id: str
    gpus: int
    measured_minutes: int
    idle_minutes: int
    episodes: tuple[int, ...]  # lengths in minutes


# --- (c) idle culling for notebooks -------------------------------------------------------


def culling_minutes(episodes: Iterable[int]) -> int:
    """The timeout: above 90 % of the pauses (idle episodes under an hour), rounded up to
    15 minutes, at least 30 and at most 60."""
    pauses = [e for e in episodes if e < PAUSE_MAX_MIN]
    if not pauses:
        return CULL_MIN_MIN
    q = quantile(pauses, PAUSE_QUANTILE)
    t = math.ceil(q / CULL_GRANULE_MIN) * CULL_GRANULE_MIN
    return min(CULL_MAX_MIN, max(CULL_MIN_MIN, t))


def idle_culling(
    target: RecommendationTarget, books: Sequence[NotebookIdle], w: HistoryWindow, now: datetime
) -> Recommendation | None:
    """Notebooks idle most of their life: cull after T idle minutes (culling_minutes). Saved:
    every idle episode longer than T, less T, times the notebook's GPUs."""
    kind = "idle_culling"
    measured = sum(b.measured_minutes for b in books)
    idle = sum(b.idle_minutes for b in books)
    if not books or measured == 0 or idle / measured < NOTEBOOK_IDLE_SHARE:
        return None
    episodes = [e for b in books for e in b.episodes]
    cull = culling_minutes(episodes)
    long = [(e, b.gpus) for b in books for e in b.episodes if e > cull]
    if len(long) < MIN_TO_RECOMMEND[kind]:
        return None
    saved = sum((e - cull) * g for e, g in long) / 60
    per_week = saved / w.weeks
    if per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    ids = ", ".join(sql_literal(b.allocation_id) for b in books)
    query = (
        "SELECT allocation_id, hour, sum(allocated_gpu_h) AS allocated_gpu_h, "
        "sum(idle_gpu_h) AS idle_gpu_h FROM v_capacity_gap "
        f"WHERE hour >= {sql_literal(w.since)} AND hour < {sql_literal(w.until)} "
        f"AND allocation_id IN ({ids}) GROUP BY allocation_id, hour ORDER BY allocation_id, hour"
    )
    gpu_minutes = sum(b.measured_minutes * b.gpus for b in books)
    evidence = evidence_in(
        w,
        query,
        allocations=len(books),
        samples=len(long),
        hours=round(measured / 60, 3),
        gpu_hours=round(gpu_minutes / 60, 3),
        spread=round(cv([e for e, _ in long]), 4),
        figures={
            "idle_share": round(idle / measured, 4),
            "idle_episodes": float(len(episodes)),
            "episodes_over_timeout": float(len(long)),
            "median_episode_min": float(statistics.median(episodes)),
            "longest_episode_min": float(max(episodes)),
        },
    )
    t = target
    if t.scheduler is Scheduler.KUBERNETES:
        apply = (
            f"# Kubeflow notebooks: the controller's culling (CULL_IDLE_TIME in minutes)\n"
            f"kubectl -n kubeflow set env deployment/notebook-controller-deployment "
            f"ENABLE_CULLING=true CULL_IDLE_TIME={cull}\n"
            f"# JupyterHub: jupyterhub-idle-culler --timeout={cull * 60}\n"
            f"# for {said(t.namespace)}/{said(t.owner_name)} only: annotate it and let its "
            "owner decide"
        )
    else:
        apply = (
            f"# interactive Slurm sessions of {said(t.user)}: end an salloc idle for {cull} "
            "min, e.g.\n"
            f"#SBATCH --time for salloc, or a job_submit/lua rule for partition "
            f"{said(t.partition)}"
        )
    rationale = (
        f"idle {idle / measured:.0%} of {measured / 60:.0f} measured hours in {len(episodes)} "
        f"idle episodes; a {cull}-minute idle timeout (above 90% of the pauses under an hour) "
        f"would have released the GPUs in {len(long)} of them."
    )
    change = RecommendationChange(
        parameter="idle_cull_minutes", from_value="none", to_value=str(cull)
    )
    return build(
        kind=kind, target=t, workload_class=WorkloadClass.INTERACTIVE, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip
