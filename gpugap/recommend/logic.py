"""The recommenders: pure functions from the rows the warehouse gives (queries.py) to
Recommendation records. No I/O here; every rule and constant is stated and documented in
docs/recommendations.md.

Confidence, the same rule for every recommender::

    confidence = history * amount * steadiness
    history    = 1 / (1 + 1/days)        VPA's history multiplier (1 + 1/days), inverted:
                                         1 day of history -> 0.5, 7 days -> 0.875, 14 -> 0.93
    amount     = min(1, samples / MIN_SAMPLES[kind])   the minimum sample count
    steadiness = 1 / (1 + spread)        spread: coefficient of variation of what the change
                                         rests on (elapsed times, busy GPUs, idle episodes)
"""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from schemas.models import (
    Recommendation,
    RecommendationChange,
    RecommendationEvidence,
    RecommendationTarget,
)
from schemas.types import Scheduler, WorkloadClass

# --- the rules ----------------------------------------------------------------------------

#: samples at which `amount` reaches 1, per recommender (jobs, allocations, idle episodes,
#: partial-gang episodes)
MIN_SAMPLES = {"slurm_time_limit": 10, "gpu_count": 5, "idle_culling": 10, "placement": 5}
#: below this many samples nothing is recommended at all
MIN_TO_RECOMMEND = {"slurm_time_limit": 3, "gpu_count": 2, "idle_culling": 3, "placement": 2}
#: ids read 'time-1a2b3c4d5e6f': the kind's short name and a hash of kind, target and change
ID_PREFIX = {"slurm_time_limit": "time", "gpu_count": "gpus", "idle_culling": "cull",
             "placement": "place"}  # fmt: skip
#: a recommendation saving less than this (GPU-hours per week) is noise
MIN_SAVED_GPU_H_PER_WEEK = 1.0

#: --time: this quantile of the completed jobs' elapsed times, plus the margin, rounded up
TIME_QUANTILE = 0.95
TIME_MARGIN = 0.20  # jobstats / Job Defense Shield: needed time + 20 %
TIME_GRANULE_S = 900
#: a new limit must cut the current one by at least this much to be worth a change
TIME_MIN_CUT = 0.25

#: a GPU idle (below the idle threshold) in at least this share of its measured minutes is
#: "idle for most of its life"
GPU_IDLE_LIFE = 0.9

#: notebooks: idle in at least this share of their measured minutes
NOTEBOOK_IDLE_SHARE = 0.5
#: idle episodes shorter than this are pauses (the user thinking, reading, in a meeting)
PAUSE_MAX_MIN = 60
#: the culling timeout: above 90 % of the pauses, rounded up to 15 min, within these bounds
CULL_MIN_MIN, CULL_MAX_MIN, CULL_GRANULE_MIN = 30, 60, 15
PAUSE_QUANTILE = 0.9


@dataclass(frozen=True)
class Window:
    """The history read: [since, until), and how many days of it hold data."""

    since: datetime
    until: datetime
    history_days: float

    @property
    def weeks(self) -> float:
        """Weeks of history the savings are spread over (at least one day's worth)."""
        return max(self.history_days, 1.0) / 7.0


# --- rows ---------------------------------------------------------------------------------


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


# --- helpers ------------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    if not s:
        raise ValueError("quantile of nothing")
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (population), 0 for fewer than two values or a zero mean."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def confidence(kind: str, samples: int, history_days: float, spread: float) -> float:
    """The rule in the module docstring, rounded to 3 places."""
    if samples <= 0 or history_days <= 0:
        return 0.0
    history = 1.0 / (1.0 + 1.0 / history_days)
    amount = min(1.0, samples / MIN_SAMPLES[kind])
    steadiness = 1.0 / (1.0 + max(spread, 0.0))
    return round(history * amount * steadiness, 3)


def recommendation_id(kind: str, target: RecommendationTarget, change: RecommendationChange) -> str:
    """Deterministic: the same kind, target and change always give the same id."""
    key = json.dumps(
        [kind, target.model_dump(mode="json"), change.model_dump(mode="json")], sort_keys=True
    )
    return f"{ID_PREFIX.get(kind, kind)}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def sql_literal(value: object) -> str:
    """A value as a ClickHouse literal (strings quoted and escaped), for evidence queries."""
    if isinstance(value, datetime):
        return f"toDateTime64('{value.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}', 3, 'UTC')"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def hms(seconds: float) -> str:
    """Slurm's H:MM:SS (days folded into hours: sbatch accepts 30:00:00)."""
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def slurm_target(
    cluster: str, user: str, account: str, job_name: str, partition: str
) -> RecommendationTarget:
    return RecommendationTarget(
        kind="slurm_job_family",
        scheduler=Scheduler.SLURM,
        cluster=cluster,
        user=user or None,
        account=account or None,
        job_name=job_name or None,
        partition=partition or None,
    )


def k8s_target(
    cluster: str, namespace: str, owner_kind: str, owner_name: str, pod: str
) -> RecommendationTarget:
    """The workload a pod belongs to: its owner (a ReplicaSet's Deployment, by the name
    Kubernetes gives the ReplicaSet: '<deployment>-<pod-template-hash>'), else the pod."""
    kind, name = owner_kind, owner_name
    if kind == "ReplicaSet" and "-" in name:
        kind, name = "Deployment", name.rsplit("-", 1)[0]
    if not kind or not name:
        kind, name = "Pod", pod
    return RecommendationTarget(
        kind="k8s_workload",
        scheduler=Scheduler.KUBERNETES,
        cluster=cluster,
        namespace=namespace or None,
        owner_kind=kind,
        owner_name=name,
    )


def _family_filter(t: RecommendationTarget) -> str:
    """WHERE terms selecting a target's allocations in v_allocations."""
    if t.kind == "k8s_workload":
        terms = [f"cluster = {sql_literal(t.cluster)}", "scheduler = 'kubernetes'"]
        terms.append(f"startsWith(name, {sql_literal((t.namespace or '') + '/')})")
        if t.owner_kind == "Pod":
            terms.append(f"name = {sql_literal(f'{t.namespace}/{t.owner_name}')}")
        elif t.owner_kind == "Deployment":
            terms.append("owner_kind = 'ReplicaSet'")
            terms.append(f"startsWith(owner_name, {sql_literal((t.owner_name or '') + '-')})")
        else:
            terms.append(f"owner_kind = {sql_literal(t.owner_kind or '')}")
            terms.append(f"owner_name = {sql_literal(t.owner_name or '')}")
        return " AND ".join(terms)
    return " AND ".join(
        [
            f"cluster = {sql_literal(t.cluster)}",
            "scheduler = 'slurm'",
            f"owner = {sql_literal(t.user or '')}",
            f"team = {sql_literal(t.account or '')}",
            f"name = {sql_literal(t.job_name or '')}",
            f"partition = {sql_literal(t.partition or '')}",
        ]
    )


def _build(
    *,
    kind: str,
    target: RecommendationTarget,
    workload_class: WorkloadClass,
    change: RecommendationChange,
    evidence: RecommendationEvidence,
    saved_per_week: float,
    rationale: str,
    apply: str,
    computed_at: datetime,
) -> Recommendation:
    return Recommendation(
        id=recommendation_id(kind, target, change),
        kind=kind,
        target=target,
        workload_class=workload_class,
        change=change,
        evidence=evidence,
        saved_gpu_hours_per_week=round(saved_per_week, 3),
        confidence=confidence(kind, evidence.samples, evidence.history_days, evidence.spread),
        rationale=rationale,
        apply=apply,
        computed_at=computed_at,
    )


# --- (a) Slurm --time per job family ------------------------------------------------------


def time_limit(fam: SlurmFamily, w: Window, now: datetime) -> Recommendation | None:
    """--time = the family's p95 elapsed + 20 %, rounded up to 15 min, when that cuts the
    current limit by at least a quarter. The GPU-hours saved are the padding removed: GPUs x
    (old limit - new limit) per job, time the scheduler reserves in its plan and backfill
    cannot use. Families with a TIMEOUT in the window are left alone (the limit binds)."""
    kind = "slurm_time_limit"
    n = len(fam.elapsed_s)
    if fam.timeouts or n < MIN_TO_RECOMMEND[kind]:
        return None
    current = max(fam.limit_s)
    q = quantile(fam.elapsed_s, TIME_QUANTILE)
    new = max(TIME_GRANULE_S, math.ceil(q * (1 + TIME_MARGIN) / TIME_GRANULE_S) * TIME_GRANULE_S)
    if new > (1 - TIME_MIN_CUT) * current:
        return None
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
    evidence = RecommendationEvidence(
        query=query,
        since=w.since,
        until=w.until,
        history_days=round(w.history_days, 3),
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
    name = f" --job-name={fam.job_name}" if fam.job_name else ""
    part = f" --partition={fam.partition}" if fam.partition else ""
    apply = (
        f"# in the job script of {fam.user}'s {fam.job_name or 'jobs'} (account {fam.account}):\n"
        f"#SBATCH --time={hms(new)}\n"
        f"# jobs already queued (a person runs this; gpugap never does):\n"
        f"squeue -h -t PD -u {fam.user}{name}{part} -o %i | "
        f"xargs -r -I{{}} scontrol update JobId={{}} TimeLimit={hms(new)}"
    )
    if fam.qos:
        apply += f"\n# or cap it for the QOS: sacctmgr modify qos {fam.qos} set MaxWall={hms(new)}"
    rationale = (
        f"{n} completed jobs: p95 elapsed {hms(q)}, limit {hms(current)} "
        f"({current / max(q, 1):.1f}x); p95 + {TIME_MARGIN:.0%} rounded up to 15 min = "
        f"{hms(new)}; {over} of {n} past jobs ran longer. Padded limits hold GPUs in the "
        "scheduler's plan, so backfill cannot start smaller jobs in front of them."
    )
    change = RecommendationChange(
        parameter="time_limit_s", from_value=str(current), to_value=str(new)
    )
    return _build(
        kind=kind, target=target, workload_class=WorkloadClass.BATCH, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip


# --- (b) GPU count ------------------------------------------------------------------------


def gpu_count(fam: GpuFamily, w: Window, now: datetime) -> Recommendation | None:
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
        f"FROM v_allocations WHERE {_family_filter(t)}) "
        "GROUP BY allocation_id, gpu_uuid ORDER BY allocation_id, gpu_uuid"
    )
    evidence = RecommendationEvidence(
        query=query,
        since=w.since,
        until=w.until,
        history_days=round(w.history_days, 3),
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
            f"# in the job script of {t.user}'s {t.job_name or 'jobs'}:\n"
            f"#SBATCH --gpus={needed}    # was {fam.gpus} (or --gres=gpu:{needed} per node)"
        )
    else:
        res = "nvidia.com~1gpu"
        apply = (
            f"kubectl -n {t.namespace} patch {(t.owner_kind or 'pod').lower()} {t.owner_name} "
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
    return _build(
        kind=kind, target=t, workload_class=fam.workload_class, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip


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
    target: RecommendationTarget, books: Sequence[NotebookIdle], w: Window, now: datetime
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
    evidence = RecommendationEvidence(
        query=query,
        since=w.since,
        until=w.until,
        history_days=round(w.history_days, 3),
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
            f"# for {t.namespace}/{t.owner_name} only: annotate it and let its owner decide"
        )
    else:
        apply = (
            f"# interactive Slurm sessions of {t.user}: end an salloc idle for {cull} min, e.g.\n"
            f"#SBATCH --time for salloc, or a job_submit/lua rule for partition {t.partition}"
        )
    rationale = (
        f"idle {idle / measured:.0%} of {measured / 60:.0f} measured hours in {len(episodes)} "
        f"idle episodes; a {cull}-minute idle timeout (above 90% of the pauses under an hour) "
        f"would have released the GPUs in {len(long)} of them."
    )
    change = RecommendationChange(
        parameter="idle_cull_minutes", from_value="none", to_value=str(cull)
    )
    return _build(
        kind=kind, target=t, workload_class=WorkloadClass.INTERACTIVE, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip


# --- (d) placement: multi-node batch with partial gangs -> Slurm ---------------------------


def placement(
    target: RecommendationTarget, gangs: Sequence[PartialGang], w: Window, now: datetime
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
    evidence = RecommendationEvidence(
        query=query,
        since=w.since,
        until=w.until,
        history_days=round(w.history_days, 3),
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
        f"# run {target.namespace}/{target.owner_name} as one Slurm job: all "
        f"{pods} workers start together or not at all\n"
        f"sbatch --nodes={pods} --ntasks-per-node=1 --gpus-per-node={max(per_pod, 1)} "
        f"--job-name={target.owner_name} train.sbatch   # srun torchrun ... inside\n"
        "# or keep it on Kubernetes with gang admission (Kueue, Volcano minAvailable)"
    )
    rationale = (
        f"{len(gangs)} partial-gang episodes ({pods} pods, up to {nodes} nodes): "
        f"{saved:.1f} GPU-hours held by running pods waiting at the barrier for pending ones. "
        "Slurm allocates a multi-node job whole, so nothing waits holding GPUs."
    )
    change = RecommendationChange(parameter="scheduler", from_value="kubernetes", to_value="slurm")
    return _build(
        kind=kind, target=target, workload_class=WorkloadClass.BATCH, change=change,
        evidence=evidence, saved_per_week=per_week, rationale=rationale, apply=apply,
        computed_at=now,
    )  # fmt: skip


def rank(recs: Iterable[Recommendation | None]) -> list[Recommendation]:
    """By absolute GPU-hours saved per week (never by percentage), then by id."""
    return sorted(
        (r for r in recs if r is not None), key=lambda r: (-r.saved_gpu_hours_per_week, r.id)
    )
