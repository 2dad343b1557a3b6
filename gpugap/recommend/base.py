"""What every recommender shares: the window, the confidence rule, ids, targets, the
evidence filter, the record builder and the ranking. Pure: no I/O. Every rule and constant is
stated and documented in docs/recommendations.md.

Confidence, the same rule for every recommender::

    confidence = history * amount * steadiness
    history    = 1 / (1 + 1/days)        VPA's history multiplier (1 + 1/days), inverted:
                                         1 day of history -> 0.5, 7 days -> 0.875, 14 -> 0.93
    amount     = min(1, samples / MIN_SAMPLES[kind])   the minimum sample count
    steadiness = 1 / (1 + spread)        spread: coefficient of variation of what the change
                                         rests on (elapsed times, busy GPUs, idle episodes)
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpugap.queue.limits import MIN_JOBS as MIN_TIME_JOBS
from gpugap.schemas.models import (
    Recommendation,
    RecommendationChange,
    RecommendationEvidence,
    RecommendationTarget,
)
from gpugap.schemas.types import Scheduler, WorkloadClass

# --- the rules ----------------------------------------------------------------------------

#: samples at which `amount` reaches 1, per recommender (jobs, allocations, idle episodes,
#: partial-gang episodes, days of a service's demand, measured GPU-days; for a smaller model
#: measured GPU-days, for cores per GPU allocations, for packing spread runs)
MIN_SAMPLES = {"slurm_time_limit": 10, "gpu_count": 5, "idle_culling": 10, "placement": 5,
               "service_schedule": 7, "gpu_share": 7, "gpu_model": 7, "cpus_per_gpu": 5,
               "pack_nodes": 5}  # fmt: skip
#: below this many samples nothing is recommended at all
MIN_TO_RECOMMEND = {"slurm_time_limit": MIN_TIME_JOBS, "gpu_count": 2, "idle_culling": 3,
                    "placement": 2, "service_schedule": 2, "gpu_share": 1, "gpu_model": 1,
                    "cpus_per_gpu": 1, "pack_nodes": 2}  # fmt: skip
#: ids read 'time-1a2b3c4d5e6f': the kind's short name and a hash of kind, target and change
ID_PREFIX = {"slurm_time_limit": "time", "gpu_count": "gpus", "idle_culling": "cull",
             "placement": "place", "service_schedule": "svc", "gpu_share": "mig",
             "gpu_model": "model", "cpus_per_gpu": "cores", "pack_nodes": "pack"}  # fmt: skip
#: a recommendation saving less than this (GPU-hours per week) is noise
MIN_SAVED_GPU_H_PER_WEEK = 1.0


@dataclass(frozen=True)
class HistoryWindow:
    """The history read: [since, until), and how many days of it hold data."""

    since: datetime
    until: datetime
    history_days: float

    @property
    def weeks(self) -> float:
        """Weeks of history the savings are spread over (at least one day's worth)."""
        return max(self.history_days, 1.0) / 7.0


# --- helpers ------------------------------------------------------------------------------


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


def sh(value: object) -> str:
    """A record's value as one shell word on one line, in a command a person runs (a job
    name is whatever its user typed): each character that is not printable (control
    characters such as TAB, newline, ESC; Unicode format and separator characters) replaced
    with '?', as said() does, then POSIX quoting (shlex.quote), which every POSIX shell reads
    back as that one word. Never bash's $'...': dash (Debian's /bin/sh) does not know it and
    runs what follows a quote inside it. The word is the sanitized value: a name that held a
    control character is printed with '?' in its place (the command then names no such job;
    it never runs anything but the command)."""
    return shlex.quote(said(value))


def said(value: object) -> str:
    """A record's value inside a comment or a sentence: control characters shown as '?' (a
    newline would end the comment and start a command)."""
    return "".join(c if c.isprintable() else "?" for c in str(value))


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


_PARAM = re.compile(r"\{(f_[a-z]+):String\}")
#: a ReplicaSet's Deployment: its name less the pod-template hash (k8s_target's rule)
DEPLOYMENT_OF = "replaceRegexpOne(owner_name, '-[^-]+$', '')"


def family_where(t: RecommendationTarget) -> tuple[str, dict[str, str]]:
    """WHERE terms selecting a target's allocations in v_allocations, the values as
    server-side parameters (``f_*``), for the queries gpugap runs."""
    p: dict[str, str] = {"f_cluster": t.cluster}
    terms = ["cluster = {f_cluster:String}"]
    if t.kind == "k8s_workload":
        terms += ["scheduler = 'kubernetes'", "startsWith(name, {f_ns:String})"]
        p["f_ns"] = (t.namespace or "") + "/"
        p["f_owner"] = t.owner_name or ""
        if t.owner_kind == "Pod":
            terms.append("name = {f_pod:String}")
            p["f_pod"] = f"{t.namespace}/{t.owner_name}"
            del p["f_owner"]
        elif t.owner_kind == "Deployment":
            terms += ["owner_kind = 'ReplicaSet'", f"{DEPLOYMENT_OF} = {{f_owner:String}}"]
        else:
            terms += ["owner_kind = {f_kind:String}", "owner_name = {f_owner:String}"]
            p["f_kind"] = t.owner_kind or ""
        return " AND ".join(terms), p
    terms += ["scheduler = 'slurm'", "owner = {f_user:String}", "team = {f_account:String}",
              "name = {f_name:String}", "partition = {f_partition:String}"]  # fmt: skip
    p |= {"f_user": t.user or "", "f_account": t.account or "", "f_name": t.job_name or "",
          "f_partition": t.partition or ""}  # fmt: skip
    return " AND ".join(terms), p


def family_filter(t: RecommendationTarget) -> str:
    """family_where with the values inlined as quoted literals: the evidence queries a
    person copies and runs."""
    sql, params = family_where(t)
    # one pass: a value holding '{f_...:String}' is never substituted into again
    return _PARAM.sub(lambda m: sql_literal(params[m.group(1)]), sql)


def evidence_in(w: HistoryWindow, query: str, **sample: Any) -> RecommendationEvidence:
    """The evidence of a recommendation over window ``w``: its query and its sample."""
    return RecommendationEvidence(
        query=query, since=w.since, until=w.until, history_days=round(w.history_days, 3),
        **sample,
    )  # fmt: skip


def build(
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


def rank(recs: Iterable[Recommendation | None]) -> list[Recommendation]:
    """By absolute GPU-hours saved per week (never by percentage), then by id."""
    return sorted(
        (r for r in recs if r is not None), key=lambda r: (-r.saved_gpu_hours_per_week, r.id)
    )
