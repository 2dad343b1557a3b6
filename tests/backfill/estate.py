"""A simulated estate's history as a site keeps it: what the simulator publishes live (node
samples, Slurm and pod events) written the way dcgm-exporter, kube-state-metrics and sacct
would have recorded it, so that the backfill can be compared with the live stream.

- **dcgm-exporter series** (scraped into Prometheus at each sample's own time): per GPU
  ``DCGM_FI_DEV_GPU_UTIL`` (and ``DCGM_FI_PROF_SM_ACTIVE`` where the cluster measures it),
  ``FB_USED``/``FB_FREE``, ``POWER_USAGE``, with ``Hostname``/``UUID``/``gpu``/``modelName``;
  pod labels where a pod holds the GPU, ``hpc_job`` where a Slurm job does (the HPC job
  mapping the prolog writes).
- **kube-state-metrics series** every 30 s while a pod exists: info, owner (a Deployment's
  pods are owned by a ReplicaSet, ``kube_replicaset_owner`` names the Deployment), labels,
  GPU requests, phase, scheduled / started / completion times, terminated reason, deletion
  timestamp; a deleted pod lingers 45 s (its grace period) and then its series stop.
- **sacct**: ``sacct -a -P -n -o SACCT_FIELDS`` as slurmdbd would print it
  (``SLURM_TIME_FORMAT=%s``), a ``.batch`` step line for batch jobs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime
from typing import Any

from gpugap.schemas import K8sPodEvent, NodeSample, Record, SlurmJobEvent
from tests.backfill.history import Series

KSM_STEP_S = 30
GRACE_S = 45
REASONS = {"completed": "Completed", "failed": "Error", "oom_killed": "OOMKilled"}


def _s(t: datetime | None) -> float:
    return t.timestamp() if t is not None else math.nan


def slurm_holders(events: list[Record]) -> dict[tuple[str, int], list[tuple[float, float, str]]]:
    """(node, GPU index) -> [(start, end, job id)] from the jobs' start/end events."""
    jobs: dict[str, dict[str, SlurmJobEvent]] = defaultdict(dict)
    for e in events:
        if isinstance(e, SlurmJobEvent):
            jobs[e.job_id][e.kind.value] = e
    out: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for job, kinds in jobs.items():
        start = kinds.get("start")
        if start is None:
            continue
        end = kinds.get("end")
        t1 = _s(end.end_time) if end is not None else math.inf
        for n in start.nodes:
            for ix in n.gpu_indices:
                out[(n.node, ix)].append((_s(start.start_time), t1, job))
    return out


def dcgm_series(samples: list[NodeSample], events: list[Record], series: Series) -> None:
    holders = slurm_holders(events)
    for ns in samples:
        t_ms = round(ns.time.timestamp() * 1000)
        t = t_ms / 1000
        for g in ns.gpus:
            labels = {
                "gpu": str(g.index),
                "UUID": g.uuid,
                "modelName": g.model or "",
                "Hostname": ns.node,
                "instance": f"{ns.node}:9400",
                "job": "dcgm",
                "cluster": ns.cluster,
            }
            a = g.attribution
            if a is not None and a.pod:
                labels.update(pod=a.pod, namespace=a.namespace or "", container=a.container or "")
            for start, end, job in holders.get((ns.node, g.index), ()):
                if start < t <= end:
                    labels["hpc_job"] = job
            if g.utilization is not None:
                series.add("DCGM_FI_DEV_GPU_UTIL", labels, t_ms, round(g.utilization * 100, 9))
            if (
                g.activity is not None
                and g.activity_metric
                and g.activity_metric.value == "sm_active"
            ):
                series.add("DCGM_FI_PROF_SM_ACTIVE", labels, t_ms, g.activity)
            if g.memory_used_mib is not None and g.memory_total_mib is not None:
                series.add("DCGM_FI_DEV_FB_USED", labels, t_ms, g.memory_used_mib)
                series.add(
                    "DCGM_FI_DEV_FB_FREE", labels, t_ms, g.memory_total_mib - g.memory_used_mib
                )
            if g.power_w is not None:
                series.add("DCGM_FI_DEV_POWER_USAGE", labels, t_ms, g.power_w)


def ksm_series(events: list[Record], since: datetime, until: datetime, series: Series) -> None:
    pods: dict[str, dict[str, K8sPodEvent]] = defaultdict(dict)
    for e in events:
        if isinstance(e, K8sPodEvent):
            pods[e.uid][e.kind.value] = e
    lo_s, hi_s = since.timestamp() - 600, until.timestamp() + KSM_STEP_S
    for uid, kinds in pods.items():
        bound = kinds.get("bound")
        if bound is None or bound.node is None:
            continue  # never held GPUs (a pending gang pod): nothing of ours
        first = next(iter(kinds.values()))
        running, term, deleted = kinds.get("running"), kinds.get("terminated"), kinds.get("deleted")
        terminal = term is not None and term.phase.value in ("Succeeded", "Failed")
        asked = deleted.time if deleted is not None else None
        if term is not None and not terminal:  # ended by a deletion while running
            asked = term.time
        gone = _s(deleted.time) + GRACE_S if deleted is not None else math.inf
        if asked is not None and deleted is None:
            gone = _s(asked) + GRACE_S
        ns, pod = first.namespace, first.name
        base = {"namespace": ns, "pod": pod, "uid": uid, "job": "kube-state-metrics"}
        if first.owner_kind == "Deployment":
            owner = ("ReplicaSet", f"{first.owner_name}-7d9f8c")
            series_labels = {"namespace": ns, "replicaset": owner[1], "job": "kube-state-metrics"}
        else:
            owner = (first.owner_kind or "<none>", first.owner_name or "<none>")
            series_labels = {}
        pod_labels = {
            "label_gpugap_io_workload_class": first.workload_class.value
            if first.workload_class
            else "",
            "label_gpugap_io_owner": first.owner or "",
            "label_gpugap_io_team": first.team or "",
        }
        step0 = math.ceil(max(_s(bound.time), lo_s) / KSM_STEP_S) * KSM_STEP_S
        t = step0
        while t < min(gone, hi_s):
            ms = int(t * 1000)

            def add(name: str, extra: dict[str, str], value: float, ms: int = ms) -> None:
                series.add(name, {**base, **extra}, ms, value)  # noqa: B023 (used at once)

            add(
                "kube_pod_info",
                {"node": bound.node, "created_by_kind": owner[0], "created_by_name": owner[1]},
                1,
            )
            add(
                "kube_pod_owner",
                {"owner_kind": owner[0], "owner_name": owner[1], "owner_is_controller": "true"},
                1,
            )
            add("kube_pod_labels", pod_labels, 1)
            add(
                "kube_pod_container_resource_requests",
                {
                    "container": "main",
                    "node": bound.node,
                    "resource": "nvidia_com_gpu",
                    "unit": "integer",
                },
                float(first.gpus),
            )
            add("kube_pod_status_scheduled_time", {}, _s(bound.time))
            is_running = running is not None and _s(running.time) <= t
            ended = terminal and term is not None and _s(term.time) <= t
            phase = term.phase.value if ended and term else "Running" if is_running else "Pending"
            for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
                add("kube_pod_status_phase", {"phase": p}, 1.0 if p == phase else 0.0)
            if is_running and running is not None:
                add("kube_pod_container_state_started", {"container": "main"}, _s(running.time))
            if ended and term is not None:
                add("kube_pod_completion_time", {}, _s(term.time))
                why = REASONS.get(term.reason.value if term.reason else "", "Error")
                add(
                    "kube_pod_container_status_terminated_reason",
                    {"container": "main", "reason": why},
                    1,
                )
            if asked is not None and _s(asked) <= t:
                add("kube_pod_deletion_timestamp", {}, _s(asked))
            if series_labels:
                series.add(
                    "kube_replicaset_owner",
                    {
                        **series_labels,
                        "owner_kind": "Deployment",
                        "owner_name": first.owner_name or "",
                    },
                    ms,
                    1,
                )
            t += KSM_STEP_S


def sacct_dump(events: list[Record]) -> str:
    """``sacct -a -P -n -o SACCT_FIELDS`` (epoch times) of the jobs the events describe."""
    jobs: dict[str, dict[str, SlurmJobEvent]] = defaultdict(dict)
    for e in events:
        if isinstance(e, SlurmJobEvent):
            jobs[e.job_id][e.kind.value] = e
    lines = []
    for job, kinds in sorted(jobs.items()):
        e = kinds.get("start") or kinds["end"]
        end = kinds.get("end")
        state = end.state.value if end is not None else "RUNNING"
        code = end.exit_code if end is not None and end.exit_code is not None else 0
        limit = e.time_limit_s
        tl = "UNLIMITED"
        if limit is not None:
            days, rest = divmod(limit, 86400)
            tl = f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
        start = int(_s(e.start_time)) if e.start_time else 0
        stop = int(_s(end.end_time)) if end is not None and end.end_time else "Unknown"
        nodes = ",".join(n.node for n in e.nodes) or "None assigned"
        tres = f"billing=1,cpu=1,gres/gpu={e.gpus_total},node={max(1, len(e.nodes))}"
        row = [
            job, job, e.user or "", e.account or "", e.partition or "", e.qos or "normal", state,
            f"{code}:0", tl, str(int(_s(e.submit_time))) if e.submit_time else "Unknown",
            str(start) if start else "Unknown", str(stop), nodes, tres, e.cluster, e.job_name or "",
        ]  # fmt: skip
        lines.append("|".join(row))
        if not e.interactive:
            lines.append("|".join([f"{job}.batch", f"{job}.batch", *row[2:]]))
    return "\n".join(lines) + "\n"


def as_dict(r: Any) -> dict[str, Any]:
    return dict(r.model_dump(mode="json"))
