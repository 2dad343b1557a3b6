"""Scheduler events from the plan: what slurmctld and the Kubernetes API would have said.

Event ids are deterministic (``slurm/<cluster>/<job>/<start|end>``,
``k8s/<cluster>/<uid>/<bound|running|terminated|deleted>``), so a duplicate is byte for byte
the same record. Only events that happen before the window ends are emitted; events from
before the window (jobs and pods already running at its start) come first.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from gpugap.schemas import K8sPodEvent, NodeGpus, Record, SlurmJobEvent, Topic, encode
from gpugap.schemas.topics import K8S_PODS, SLURM_JOBS
from gpugap.simulator.plan import INF, Allocation, Plan, Pod


def scheduler_events(
    plan: Plan, origin: datetime, window: int
) -> list[tuple[int, Topic[Any], Record]]:
    """(time s, topic, record) of every event before ``window``, sorted by time."""
    out: list[tuple[int, Topic[Any], Record]] = []
    for alloc in plan.allocations:
        if alloc.job is not None:
            out += _slurm(alloc, origin, window)
        elif alloc.pod is not None:
            who = (alloc.owner, alloc.team)
            out += _pod(alloc.cluster, alloc.pod, alloc, origin=origin, window=window, who=who)
    for gang in plan.gangs:
        for pod in gang.pending:
            who = (gang.owner, gang.team)
            out += _pod(gang.cluster, pod, None, origin=origin, window=window, who=who)
    out.sort(key=lambda e: (e[0], e[1].name, e[1].key_of(e[2]), getattr(e[2], "event_id", "")))
    return out


def _at(origin: datetime, t: int) -> datetime:
    return origin + timedelta(seconds=t)


def _slurm(
    a: Allocation, origin: datetime, window: int
) -> Iterator[tuple[int, Topic[Any], Record]]:
    job = a.job
    assert job is not None
    nodes: dict[str, list[int]] = {}
    for d in a.devices:
        nodes.setdefault(d.node, []).append(d.index)
    common: dict[str, Any] = dict(
        source="simulator",
        cluster=a.cluster,
        job_id=job.job_id,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        user=a.owner,
        account=a.team,
        partition=job.partition,
        qos=job.qos,
        job_name=job.job_name,
        nodes=tuple(NodeGpus(node=n, gpu_indices=tuple(ix)) for n, ix in nodes.items()),
        gpus_total=len(a.holdings),
        time_limit_s=job.limit_s,
        submit_time=_at(origin, job.submit),
        start_time=_at(origin, a.start),
        interactive=job.interactive,
    )
    if a.start < window:
        yield (
            a.start,
            SLURM_JOBS,
            SlurmJobEvent(
                event_id=f"slurm/{a.cluster}/{job.job_id}/start",
                kind="start",
                time=_at(origin, a.start),
                state="RUNNING",
                **common,
            ),
        )
    if a.end < window:
        yield (
            a.end,
            SLURM_JOBS,
            SlurmJobEvent(
                event_id=f"slurm/{a.cluster}/{job.job_id}/end",
                kind="end",
                time=_at(origin, a.end),
                end_time=_at(origin, a.end),
                state=job.state,
                exit_code=job.exit_code,
                **common,
            ),
        )


def _pod(
    cluster: str,
    pod: Pod,
    a: Allocation | None,
    *,
    origin: datetime,
    window: int,
    who: tuple[str, str],
) -> Iterator[tuple[int, Topic[Any], Record]]:
    owner, team = who
    cls = {"Deployment": "service", "Notebook": "interactive"}.get(pod.owner_kind, "batch")
    node = a.devices[0].node if a is not None else None
    common: dict[str, Any] = dict(
        source="simulator",
        cluster=cluster,
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        gpus=pod.gpus,
        gpu_resource=pod.gpu_resource,
        owner_kind=pod.owner_kind,
        owner_name=pod.owner_name,
        workload_class=cls,
        owner=owner,
        team=team,
        gang_id=pod.gang_id,
        gang_size=pod.gang_size,
    )
    steps: list[tuple[int | None, str, str, str | None]] = []
    if a is not None:
        steps += [(a.start, "bound", "Pending", None), (pod.running_at, "running", "Running", None)]
    end_phase = pod.end_phase if a is not None else "Pending"
    steps += [
        (pod.terminated_at, "terminated", end_phase, pod.reason),
        (pod.deleted_at, "deleted", end_phase, pod.reason),
    ]
    for t, kind, phase, reason in steps:
        if t is None or t >= min(window, INF):
            continue
        gone = kind in ("terminated", "deleted")
        yield (
            t,
            K8S_PODS,
            K8sPodEvent(
                event_id=f"k8s/{cluster}/{pod.uid}/{kind}",
                kind=kind,
                time=_at(origin, t),
                node=node,
                phase=phase,
                reason=reason if gone else None,
                **common,
            ),
        )


def encoded(
    events: list[tuple[int, Topic[Any], Record]],
) -> list[tuple[int, Topic[Any], bytes, bytes]]:
    return [(t, topic, topic.key_for(r), encode(r)) for t, topic, r in events]
