"""Builders for core tests: one node, GPUs named GPU-...-00000000000<i>, times as 'HH:MM:SS'."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.schemas import Record, Topic, decode
from gpugap.schemas.models import AllocationEvent, Attribution, GpuSample, NodeSample
from gpugap.schemas.types import (
    ActivityMetric,
    LifecycleKind,
    SampleSource,
    Scheduler,
    WorkloadClass,
)

CLUSTER, NODE = "hpc", "n1"


def T(hms: str) -> datetime:
    h, m, s = (int(x) for x in hms.split(":"))
    return datetime(2026, 11, 2, h, m, s, tzinfo=UTC)


def gpu(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def sample(
    hms: str,
    acts: dict[int, float | None],
    *,
    interval: float = 10.0,
    attrib: dict[int, tuple[str, str]] | None = None,
    node: str = NODE,
) -> NodeSample:
    gpus = []
    for i, a in sorted(acts.items()):
        pod = (attrib or {}).get(i)
        gpus.append(
            GpuSample(
                uuid=gpu(i),
                index=i,
                activity=a,
                activity_metric=ActivityMetric.UTILIZATION if a is not None else None,
                memory_used_mib=1000.0,
                power_w=100.0,
                attribution=Attribution(namespace=pod[0], pod=pod[1]) if pod else None,
            )
        )
    return NodeSample(
        cluster=CLUSTER,
        node=node,
        time=T(hms),
        source=SampleSource.SIMULATOR,
        interval_s=interval,
        gpus=tuple(gpus),
    )


def samples(start: str, end: str, acts: dict[int, float | None], **kw: Any) -> list[NodeSample]:
    """Samples every 10 s from ``start`` to ``end`` inclusive."""
    t0, t1 = T(start), T(end)
    n = int((t1 - t0).total_seconds()) // 10
    out = []
    for k in range(n + 1):
        t = t0.timestamp() + 10 * k
        hms = datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")
        out.append(sample(hms, acts, **kw))
    return out


def slurm(
    job: str,
    kind: str,
    hms: str,
    indices: tuple[int, ...] = (0,),
    *,
    cls: WorkloadClass = WorkloadClass.BATCH,
    node: str = NODE,
) -> AllocationEvent:
    return AllocationEvent(
        event_id=f"slurm/{CLUSTER}/{job}/{kind}/{node}",
        kind=LifecycleKind(kind),
        time=T(hms),
        cluster=CLUSTER,
        node=node,
        scheduler=Scheduler.SLURM,
        allocation_id=f"slurm/{CLUSTER}/{job}",
        gpus=len(indices),
        gpu_indices=indices,
        workload_class=cls,
        owner="alice",
        team="vision",
        name=f"job{job}",
    )


def pod(uid: str, kind: str, hms: str, gpus: int = 1, name: str = "p") -> AllocationEvent:
    return AllocationEvent(
        event_id=f"k8s/{CLUSTER}/{uid}/{kind}",
        kind=LifecycleKind(kind),
        time=T(hms),
        cluster=CLUSTER,
        node=NODE,
        scheduler=Scheduler.KUBERNETES,
        allocation_id=f"k8s/{CLUSTER}/{uid}",
        gpus=gpus,
        workload_class=WorkloadClass.SERVICE,
        owner="carol",
        team="nlp",
        name=name,
        namespace="ns",
    )


class Null(Publisher):
    """A publisher that drops everything (the core's output is read from its return values)."""

    async def send(self, topic: Topic[Any], record: Record) -> None:
        pass

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        pass

    async def flush(self) -> None:
        pass


class Recording(Publisher):
    """A publisher that keeps what it was given (decoded), for the worker's tests."""

    def __init__(self) -> None:
        self.records: list[tuple[str, Record]] = []

    async def send(self, topic: Topic[Any], record: Record) -> None:
        self.records.append((topic.name, record))

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        self.records.append((topic.name, decode(topic, value)))

    async def flush(self) -> None:
        pass

    def of(self, kind: type[Record]) -> list[Any]:
        return [r for _, r in self.records if isinstance(r, kind)]
