"""Scheduler events -> per-node allocation events, and partial-gang alerts."""

from __future__ import annotations

from gpugap.schemas.models import K8sPodEvent, NodeGpus, SlurmJobEvent
from gpugap.schemas.types import (
    AlertState,
    EventSource,
    LifecycleKind,
    PodEventKind,
    PodPhase,
    SlurmJobState,
    WorkloadClass,
)
from gpugap.streams.allocate import GangTracker, from_pod, from_slurm
from tests.streams.helpers import T


def job(kind: str, *, interactive: bool = False) -> SlurmJobEvent:
    start = kind == "start"
    return SlurmJobEvent(
        event_id=f"slurm/hpc/42/{kind}",
        kind=LifecycleKind(kind),
        time=T("10:00:00") if start else T("11:00:00"),
        source=EventSource.HOOK,
        cluster="hpc",
        job_id="42",
        user="alice",
        account="vision",
        partition="gpu",
        job_name="train",
        nodes=(
            NodeGpus(node="n1", gpu_indices=(0, 1)),
            NodeGpus(node="n2", gpu_indices=(3,)),
            NodeGpus(node="n3"),  # CPU-only part of the job: holds no GPU
        ),
        gpus_total=3,
        time_limit_s=7200,
        start_time=T("10:00:00"),
        end_time=None if start else T("11:00:00"),
        state=SlurmJobState.RUNNING if start else SlurmJobState.COMPLETED,
        interactive=interactive,
    )


def test_slurm_job_becomes_one_event_per_gpu_node() -> None:
    evs = from_slurm(job("start"))
    assert [(e.node, e.gpu_indices, e.gpus) for e in evs] == [("n1", (0, 1), 2), ("n2", (3,), 1)]
    e = evs[0]
    assert e.allocation_id == "slurm/hpc/42"
    assert e.event_id == "slurm/hpc/42/start/n1"
    assert (e.kind, e.time, e.scheduler) == (LifecycleKind.START, T("10:00:00"), "slurm")
    assert (e.workload_class, e.owner, e.team, e.name, e.time_limit_s) == (
        WorkloadClass.BATCH,
        "alice",
        "vision",
        "train",
        7200,
    )
    # what the idle policy's rules match besides (GPUGAP_IDLE_RULES partition, labels)
    assert (e.partition, e.labels) == ("gpu", {"slurm.account": "vision"})
    end = from_slurm(job("end"))
    assert [(x.kind, x.time) for x in end] == [(LifecycleKind.END, T("11:00:00"))] * 2


def test_slurm_class_from_salloc() -> None:
    assert from_slurm(job("start", interactive=True))[0].workload_class == "interactive"


def pod_ev(
    uid: str,
    kind: PodEventKind,
    hms: str,
    *,
    node: str | None = "k1",
    gang: str | None = "ml/ddp",
    cls: WorkloadClass | None = WorkloadClass.BATCH,
) -> K8sPodEvent:
    return K8sPodEvent(
        event_id=f"k8s/kube/{uid}/{kind.value}",
        kind=kind,
        time=T(hms),
        source=EventSource.WATCH,
        cluster="kube",
        uid=uid,
        namespace="ml",
        name=f"w-{uid}",
        node=node,
        phase=PodPhase.RUNNING if node else PodPhase.PENDING,
        gpus=2,
        owner_kind="PyTorchJob",
        owner_name="ddp",
        workload_class=cls,
        owner="carol",
        team="nlp",
        gang_id=gang,
        gang_size=3 if gang else None,
    )


def test_pod_events_become_start_and_end() -> None:
    [start] = from_pod(pod_ev("u1", PodEventKind.BOUND, "10:00:00"))
    assert (start.kind, start.node, start.gpus, start.allocation_id) == (
        LifecycleKind.START,
        "k1",
        2,
        "k8s/kube/u1",
    )
    assert (start.name, start.namespace, start.gang_id, start.gang_size) == (
        "w-u1",
        "ml",
        "ml/ddp",
        3,
    )
    [end] = from_pod(pod_ev("u1", PodEventKind.DELETED, "10:05:00"))
    assert end.kind is LifecycleKind.END
    # a pending pod deleted before it was bound held nothing
    assert from_pod(pod_ev("u2", PodEventKind.DELETED, "10:05:00", node=None)) == []
    # no class on the event: the owner kind decides (PyTorchJob -> batch)
    [c] = from_pod(pod_ev("u3", PodEventKind.BOUND, "10:00:00", cls=None))
    assert c.workload_class == "batch"


def states(alerts: list) -> list[tuple]:
    return [
        (
            a.state,
            a.time.strftime("%H:%M:%S"),
            a.opened_at.strftime("%H:%M:%S"),
            a.running_pods,
            a.pending_pods,
            round(a.idle_gpu_hours * 3600),
        )
        for a in alerts
    ]


def test_partial_gang_opens_after_the_grace_and_resolves_when_complete() -> None:
    g = GangTracker()
    out = []
    for ev in (
        pod_ev("a", PodEventKind.BOUND, "10:00:00"),
        pod_ev("b", PodEventKind.BOUND, "10:00:00"),
        pod_ev("b", PodEventKind.BOUND, "10:00:00"),  # duplicate
        pod_ev("x", PodEventKind.RUNNING, "10:03:00", gang=None),  # moves the clock
        pod_ev("c", PodEventKind.BOUND, "10:10:00"),
    ):
        out += g.pod(ev)
    # opened at 10:00:30 (grace 30 s), once the watermark passed it (10:03:00 - 120 s)
    assert states(out) == [
        (AlertState.OPEN, "10:00:30", "10:00:30", 2, 1, 4 * 30),
        (AlertState.RESOLVED, "10:10:00", "10:00:30", 3, 0, 4 * 600),
    ]
    assert out[0].alert_id == out[1].alert_id == "partial_gang/kube/ml/ddp/2026-11-02T10:00:30.000Z"
    assert out[1].resolved_at == T("10:10:00")


def test_partial_gang_deleted_resolves_and_siblings_binding_together_raise_nothing() -> None:
    g = GangTracker()
    out = []
    for ev in (
        pod_ev("a", PodEventKind.BOUND, "10:00:00"),
        pod_ev("b", PodEventKind.BOUND, "10:00:00"),
        pod_ev("x", PodEventKind.RUNNING, "10:05:00", gang=None),
        pod_ev("a", PodEventKind.DELETED, "10:06:00"),
        pod_ev("b", PodEventKind.DELETED, "10:06:00"),
        pod_ev("c", PodEventKind.DELETED, "10:06:00", node=None),
        # a complete gang: its pods bind 5 s apart
        pod_ev("d", PodEventKind.BOUND, "10:07:00", gang="ok"),
        pod_ev("e", PodEventKind.BOUND, "10:07:05", gang="ok"),
        pod_ev("f", PodEventKind.BOUND, "10:07:05", gang="ok"),
        pod_ev("y", PodEventKind.RUNNING, "10:20:00", gang=None),
        pod_ev("b", PodEventKind.BOUND, "10:00:00"),  # a duplicate after the gang ended
    ):
        out += g.pod(ev)
    assert states(out) == [
        (AlertState.OPEN, "10:00:30", "10:00:30", 2, 1, 120),
        (AlertState.RESOLVED, "10:06:00", "10:00:30", 1, 2, 4 * 360),
    ]
    assert g.state["gangs"] == {}
