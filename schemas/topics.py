"""The topic registry: versioned names, their record model, key and partitioning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpugap.schemas.errors import UnknownTopic
from gpugap.schemas.models import (
    Alert,
    AlertDelivery,
    AllocationEvent,
    DeadLetter,
    GpuMinute,
    K8sPodEvent,
    NodeCapacity,
    NodeSample,
    QueueQuota,
    Recommendation,
    Record,
    SchedulerGpuCount,
    SlurmJobEvent,
    Transfer,
)

M = TypeVar("M", bound=Record)


@dataclass(frozen=True)
class Topic(Generic[M]):
    name: str  # versioned: '<base>.v<N>'
    model: type[M]
    key: str  # what the key holds, for docs and schema export
    partitioned_by: str
    key_of: Callable[[M], str]
    description: str

    def key_for(self, record: Any) -> bytes:
        return self.key_of(record).encode()

    def qualified(self, prefix: str = "") -> str:
        """The topic's name on the broker (a prefix namespaces tests or tenants)."""
        return prefix + self.name


SAMPLES: Topic[NodeSample] = Topic(
    "gpu.samples.v1",
    NodeSample,
    "cluster/node",
    "node",
    lambda r: f"{r.cluster}/{r.node}",
    "Device telemetry: one message per node per tick, all of its GPUs.",
)
SLURM_JOBS: Topic[SlurmJobEvent] = Topic(
    "slurm.jobs.v1",
    SlurmJobEvent,
    "cluster/job_id",
    "job",
    lambda r: f"{r.cluster}/{r.job_id}",
    "Slurm job start/end events from hooks, the poller or the simulator.",
)
K8S_PODS: Topic[K8sPodEvent] = Topic(
    "k8s.pods.v1",
    K8sPodEvent,
    "cluster/uid",
    "pod",
    lambda r: f"{r.cluster}/{r.uid}",
    "Kubernetes pod lifecycle events for pods that request GPUs.",
)
ALLOCATIONS: Topic[AllocationEvent] = Topic(
    "gpu.allocations.v1",
    AllocationEvent,
    "cluster/node",
    "node",
    lambda r: f"{r.cluster}/{r.node}",
    "Per-node allocation start/end, classified, re-keyed by node for the join.",
)
MINUTES: Topic[GpuMinute] = Topic(
    "gpu.minutes.v1",
    GpuMinute,
    "cluster/node",
    "node",
    lambda r: f"{r.cluster}/{r.node}",
    "One record per GPU per minute (per allocation where a minute is split).",
)
ALERTS: Topic[Alert] = Topic(
    "alerts.v1",
    Alert,
    "alert_id",
    "alert",
    lambda r: r.alert_id,
    "Idle-GPU and partial-gang alerts: open, update, resolved.",
)
DELIVERIES: Topic[AlertDelivery] = Topic(
    "alerts.deliveries.v1",
    AlertDelivery,
    "target/alert_id",
    "alert",
    lambda r: f"{r.target}/{r.alert_id}",
    "Alert notifications sent to Alertmanager, Slack, webhooks or email, with the outcome.",
)
DEAD_LETTER: Topic[DeadLetter] = Topic(
    "dead-letter.v1",
    DeadLetter,
    "source topic",
    "source topic",
    lambda r: r.source_topic,
    "Records that failed to decode, validate or process, with the reason.",
)

RECOMMENDATIONS: Topic[Recommendation] = Topic(
    "recommendations.v1",
    Recommendation,
    "id",
    "recommendation",
    lambda r: r.id,
    "Changes for a person to review (time limits, GPU counts, MIG slices, idle culling, "
    "replicas by hour, placement).",
)

TOPICS: dict[str, Topic[Any]] = {
    t.name: t
    for t in (SAMPLES, SLURM_JOBS, K8S_PODS, ALLOCATIONS, MINUTES, ALERTS, DELIVERIES, DEAD_LETTER)
}
TOPICS[RECOMMENDATIONS.name] = RECOMMENDATIONS


TRANSFERS: Topic[Transfer] = Topic(
    "transfers.v1",
    Transfer,
    "cluster/event_id",
    "transfer",
    lambda r: f"{r.cluster}/{r.event_id}",
    "Bytes moved across the boundary between environments (billing lines, node counters).",
)
TOPICS[TRANSFERS.name] = TRANSFERS

NODE_CAPACITY: Topic[NodeCapacity] = Topic(
    "node-capacity.v1",
    NodeCapacity,
    "cluster/node",
    "cluster/node",
    lambda r: f"{r.cluster}/{r.node}",
    "A node's GPUs, CPUs and memory and what each allocation holds of them, polled: "
    "stranded GPUs (docs/architecture.md#stranded-gpus).",
)
TOPICS[NODE_CAPACITY.name] = NODE_CAPACITY

QUEUE_QUOTAS: Topic[QueueQuota] = Topic(
    "queue-quotas.v1",
    QueueQuota,
    "cluster/kind/namespace/queue/flavor",
    "cluster/kind/namespace/queue/flavor",
    lambda r: f"{r.cluster}/{r.kind}/{r.namespace or ''}/{r.queue}/{r.flavor or ''}",
    "A queue's GPU entitlement and what it holds (Kueue, KAI, Volcano, Slurm QOS and "
    "associations), polled (docs/architecture.md#quota-held-but-unused).",
)
TOPICS[QUEUE_QUOTAS.name] = QUEUE_QUOTAS

SCHEDULER_GPU_COUNTS: Topic[SchedulerGpuCount] = Topic(
    "scheduler-gpu-counts.v1",
    SchedulerGpuCount,
    "cluster/scope/name",
    "cluster/scope/name",
    lambda r: f"{r.cluster}/{r.scope}/{r.name or ''}",
    "The scheduler's own count of allocated GPUs per partition, account, user and node "
    "(slurmctld's OpenMetrics), polled: gpugap checks itself against it (v_scheduler_drift).",
)
TOPICS[SCHEDULER_GPU_COUNTS.name] = SCHEDULER_GPU_COUNTS


def by_name(name: str, prefix: str = "") -> Topic[Any]:
    """Look a topic up by its (optionally prefixed) broker name; unknown names are an error."""
    base = name[len(prefix) :] if prefix and name.startswith(prefix) else name
    try:
        return TOPICS[base]
    except KeyError:
        stem = base.rsplit(".v", 1)[0]
        known = [n for n in TOPICS if n.rsplit(".v", 1)[0] == stem]
        hint = f"this build knows {', '.join(known)}" if known else f"known: {', '.join(TOPICS)}"
        raise UnknownTopic(f"topic: unknown topic or version {base!r} ({hint})") from None
