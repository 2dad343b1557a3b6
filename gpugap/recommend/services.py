"""Services sized for their peak: replicas by hour of day from the demand they served.

A service's demand in one clock hour is the GPU-hours it consumed in it (GPU-equivalents of
work). For each hour of the day the schedule keeps enough replicas to serve the highest
demand any day of the window saw in that hour at the target utilisation (Kubecost sizes to
0.7), never fewer than one. What it saves is every GPU-hour allocated above that schedule.
Kubernetes services get the schedule (KEDA cron triggers); Slurm services whose demand
varies get a placement on Kubernetes instead (placement.py): a Slurm job holds its GPUs
whole for its life.
"""

# ruff: noqa: S608  (evidence queries: literals quoted by sql_literal, for people to run)
from __future__ import annotations

import json
import math
import re
from collections import defaultdict
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
    RecommendationEvidence,
    RecommendationTarget,
)
from gpugap.schemas.types import Scheduler, WorkloadClass

#: the utilisation a replica is sized to (Kubecost's default target): 30 % headroom
TARGET_UTILISATION = 0.7
MIN_REPLICAS = 1
#: a Slurm service moves to Kubernetes when its busiest hour needs this many times the
#: replicas of its quietest (a flat one is a GPU-count question, not a placement one)
VARIABLE_DEMAND = 2.0


@dataclass(frozen=True)
class ServiceHour:
    """One clock hour of one service: GPU-hours allocated and consumed in it."""

    hour: datetime
    allocated_gpu_h: float
    consumed_gpu_h: float


@dataclass(frozen=True)
class ServiceDemand:
    """A service's hours in the window (its allocations summed per clock hour)."""

    target: RecommendationTarget
    workload_class: WorkloadClass
    gpus_per_replica: int  # GPUs per pod; 1 for a Slurm job (a replica per GPU elsewhere)
    allocations: int
    hours: tuple[ServiceHour, ...]


@dataclass(frozen=True)
class Schedule:
    replicas: tuple[int, ...]  # needed, per hour of the day (UTC)
    current: int  # replicas it held in its busiest hour of the day (mean over days)
    saved_gpu_h: float  # allocated above the schedule, over the window
    days: int  # days with data
    daily_peaks: tuple[float, ...]  # each day's highest hourly demand (GPU-equivalents)


def replicas_for(demand_gpu: float, per_replica: int) -> int:
    """Replicas serving ``demand_gpu`` GPU-equivalents at the target utilisation (rounded
    to 6 places first: 1.4 / 0.7 is 2.0000000000000004)."""
    return max(MIN_REPLICAS, math.ceil(round(demand_gpu / TARGET_UTILISATION / per_replica, 6)))


def schedule(d: ServiceDemand) -> Schedule:
    per = max(d.gpus_per_replica, 1)
    peak_at: dict[int, float] = defaultdict(float)
    held_at: dict[int, list[float]] = defaultdict(list)
    by_day: dict[object, float] = defaultdict(float)
    for u in d.hours:
        h = u.hour.hour
        peak_at[h] = max(peak_at[h], u.consumed_gpu_h)
        held_at[h].append(u.allocated_gpu_h)
        by_day[u.hour.date()] = max(by_day[u.hour.date()], u.consumed_gpu_h)
    need = tuple(replicas_for(peak_at.get(h, 0.0), per) for h in range(24))
    saved = sum(max(0.0, u.allocated_gpu_h - need[u.hour.hour] * per) for u in d.hours)
    current = max((round(sum(v) / len(v) / per) for v in held_at.values()), default=0)
    return Schedule(need, current, saved, len(by_day), tuple(by_day.values()))


def ranges(replicas: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(start hour, end hour, replicas) for each run of equal counts over the day."""
    out: list[tuple[int, int, int]] = []
    for h, n in enumerate(replicas):
        if out and out[-1][2] == n:
            out[-1] = (out[-1][0], h + 1, n)
        else:
            out.append((h, h + 1, n))
    return out


def schedule_text(replicas: tuple[int, ...]) -> str:
    """'00-08:1,08-16:3,16-24:1' (UTC hours)."""
    return ",".join(f"{a:02d}-{b:02d}:{n}" for a, b, n in ranges(replicas))


def k8s_name(text: str) -> str:
    """A DNS-1123 name (what Kubernetes accepts) made of ``text``."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name or "service"


def keda_cron(namespace: str, name: str, kind: str, replicas: tuple[int, ...]) -> str:
    """A KEDA ScaledObject with a cron trigger per range above the trough, for a person to
    review and apply (kubectl apply -f -)."""
    trough = min(replicas)
    q = json.dumps  # names as quoted YAML scalars: nothing in one can end the document
    lines = [
        "apiVersion: keda.sh/v1alpha1",
        "kind: ScaledObject",
        f"metadata: {{name: {q(k8s_name(name + '-by-hour'))}, namespace: {q(namespace)}}}",
        "spec:",
        f"  scaleTargetRef: {{kind: {q(kind)}, name: {q(name)}}}",
        f"  minReplicaCount: {trough}",
        "  triggers:",
    ]
    for a, b, n in ranges(replicas):
        if n > trough:
            lines += [
                "  - type: cron",
                f'    metadata: {{timezone: Etc/UTC, start: "0 {a} * * *", '
                f'end: "0 {b % 24} * * *", desiredReplicas: "{n}"}}',
            ]
    return "\n".join(lines)


def evidence_for(d: ServiceDemand, s: Schedule, w: HistoryWindow) -> RecommendationEvidence:
    query = (
        "SELECT hour, sum(allocated_gpu_h) AS allocated_gpu_h, "
        "sum(consumed_gpu_h) AS consumed_gpu_h FROM v_capacity_gap "
        f"WHERE hour >= {sql_literal(w.since)} AND hour < {sql_literal(w.until)} "
        f"AND allocation_id IN (SELECT allocation_id FROM v_allocations "
        f"WHERE {family_filter(d.target)}) GROUP BY hour ORDER BY hour"
    )
    allocated = sum(u.allocated_gpu_h for u in d.hours)
    return evidence_in(
        w,
        query,
        allocations=d.allocations,
        samples=s.days,
        hours=float(len(d.hours)),
        gpu_hours=round(allocated, 3),
        spread=round(cv(s.daily_peaks), 4),
        figures={
            "current_replicas": float(s.current),
            "peak_replicas": float(max(s.replicas)),
            "trough_replicas": float(min(s.replicas)),
            "gpus_per_replica": float(d.gpus_per_replica),
            "consumed_gpu_h": round(sum(u.consumed_gpu_h for u in d.hours), 3),
            "target_utilisation": TARGET_UTILISATION,
        },
    )


def worth_it(d: ServiceDemand, w: HistoryWindow) -> tuple[Schedule, float] | None:
    """The schedule and its savings per week, when there are enough days and savings."""
    s = schedule(d)
    per_week = s.saved_gpu_h / w.weeks
    if s.days < MIN_TO_RECOMMEND["service_schedule"] or per_week < MIN_SAVED_GPU_H_PER_WEEK:
        return None
    return s, per_week


def service_schedule(d: ServiceDemand, w: HistoryWindow, now: datetime) -> Recommendation | None:
    """A Kubernetes service's replicas by hour of day."""
    kind = "service_schedule"
    if d.target.scheduler is not Scheduler.KUBERNETES:
        return None
    found = worth_it(d, w)
    if found is None:
        return None
    s, per_week = found
    t = d.target
    ns, name, okind = t.namespace or "default", t.owner_name or "", t.owner_kind or "Deployment"
    apply = (
        f"# scale {said(ns)}/{said(name)} by the hour (UTC); review it, then run:\n"
        # the heredoc starts on a line of its own: the YAML's quoted names are never read by
        # a shell (a pasted block would otherwise run each YAML line, "$(...)" expanded)
        "kubectl apply -f - <<'EOF'\n"
        f"{keda_cron(ns, name, okind, s.replicas)}\nEOF\n"
        f"# without KEDA: kubectl -n {sh(ns)} scale {sh(okind.lower())} {sh(name)} "
        "--replicas=N from cron"
    )
    rationale = (
        f"held {s.current} replicas ({d.gpus_per_replica} GPU each) in its busiest hour; the "
        f"demand by hour of day over {s.days} days needs {min(s.replicas)} to "
        f"{max(s.replicas)} at {TARGET_UTILISATION:.0%} utilisation (each hour sized to the "
        "busiest day's demand in that hour)."
    )
    change = RecommendationChange(
        parameter="replicas_by_hour", from_value=str(s.current), to_value=schedule_text(s.replicas)
    )
    return build(
        kind=kind, target=t, workload_class=d.workload_class, change=change,
        evidence=evidence_for(d, s, w), saved_per_week=per_week, rationale=rationale,
        apply=apply, computed_at=now,
    )  # fmt: skip
