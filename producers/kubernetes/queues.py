"""Queue quotas from the queue managers' objects (their JSON as the API server sends it), and
the queue a pod names. Pure functions on dicts, no I/O (``queues_producer.py`` reads the API).

Field names are the managers' own CRDs (tests/harness/crds/README.md names the tags):

* Kueue ClusterQueue: ``spec.resourceGroups[].flavors[].resources[]`` (``name``,
  ``nominalQuota``, ``borrowingLimit``), ``spec.cohortName`` (v1beta2; ``spec.cohort`` in
  v1beta1), ``status.flavorsUsage[].resources[]`` (``total``, ``borrowed``),
  ``status.pendingWorkloads``, ``status.admittedWorkloads``.
* Kueue LocalQueue: ``spec.clusterQueue``, ``status.flavorsUsage`` (v1beta2; ``flavorUsage``
  in v1beta1), ``status.pendingWorkloads``, ``status.admittedWorkloads``.
* KAI Queue (``scheduling.run.ai/v2``): ``spec.resources.gpu.quota``/``limit`` (GPUs, fractions
  allowed; -1: unlimited), ``spec.parentQueue``, ``status.allocated["nvidia.com/gpu"]``.
* Volcano Queue (``scheduling.volcano.sh/v1beta1``): ``spec.deserved``,
  ``spec.guarantee.resource``, ``spec.capability`` (resource maps), ``spec.parent``,
  ``status.allocated``, ``status.pending``/``inqueue``/``running`` (PodGroups).

GPU amounts are physical-GPU equivalents: a MIG resource's quota counts its share of a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gpugap.producers.kubernetes.capacity import GpuShares, amount
from gpugap.schemas.models import QueueQuota
from gpugap.schemas.types import Name, QueueKind

Obj = Mapping[str, Any]
KUEUE_GROUP = "kueue.x-k8s.io"
KAI_GROUP = "scheduling.run.ai"
VOLCANO_GROUP = "scheduling.volcano.sh"
#: KAI's queues state GPUs without a resource name; its pods request this one
#: (KAI-Scheduler pkg/common/constants: GpuResource)
KAI_GPU_RESOURCE = "nvidia.com/gpu"
#: where a pod names its queue, first found wins: Kueue's label (kueue.x-k8s.io/queue-name),
#: KAI's (constants.DefaultQueueLabel; runai/queue before KAI), Volcano's annotation (its
#: PodGroup controller reads it from plain pods) and the label/annotation Volcano Jobs put on
#: their pods (batch.volcano.sh QueueNameKey)
QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "kai.scheduler/queue", "runai/queue")
QUEUE_ANNOTATIONS = ("scheduling.volcano.sh/queue-name", "volcano.sh/queue-name")
_NAME_MAX = 253
_NAME: TypeAdapter[str] = TypeAdapter(Name)


def _name(value: object) -> str | None:
    """A queue name the schema's Name takes (one word, no '/'), else None: an annotation is
    free text, and a pod's event must not fail on it."""
    if not isinstance(value, str) or not 0 < len(value) <= _NAME_MAX:
        return None
    try:
        return _NAME.validate_python(value)
    except ValidationError:
        return None


def pod_queue(labels: Obj, annotations: Obj) -> str | None:
    """The queue a pod's labels or annotations name (Kueue, KAI, then Volcano)."""
    for key in QUEUE_LABELS:
        if found := _name(labels.get(key)):
            return found
    for key in QUEUE_ANNOTATIONS:
        if found := _name(annotations.get(key)) or _name(labels.get(key)):
            return found
    return None


@dataclass(frozen=True)
class Poll:
    """What every record of one poll shares."""

    cluster: str
    time: datetime
    interval_s: float
    shares: GpuShares


def _gpus(poll: Poll, resource: str, value: object) -> float:
    return amount(value) * poll.shares.per_unit(resource, {})


def _opt_gpus(poll: Poll, resource: str, value: object) -> float | None:
    """GPUs when the object states the amount, None when it says nothing."""
    return None if value is None else _gpus(poll, resource, value)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _record(poll: Poll, kind: QueueKind, obj: Obj, **fields: Any) -> QueueQuota:
    return QueueQuota(
        cluster=poll.cluster,
        time=poll.time,
        interval_s=poll.interval_s,
        kind=kind,
        queue=(obj.get("metadata") or {}).get("name"),
        **fields,
    )


def kueue_gpu_quotas(obj: Obj, shares: GpuShares) -> Iterable[tuple[str, str, Obj]]:
    """(flavor, resource, quota entry) for each GPU resource a ClusterQueue's groups cover."""
    for group in (obj.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for res in flavor.get("resources") or ():
                if shares.is_gpu(str(res.get("name"))):
                    yield str(flavor.get("name")), str(res.get("name")), res


def _kueue_usage(status: Obj, *keys: str) -> dict[tuple[str, str], Obj] | None:
    """(flavor, resource) -> usage entry; None when the status reports no usage at all."""
    found = next((status[k] for k in keys if k in status), None)
    if found is None:
        return None
    return {
        (str(f.get("name")), str(r.get("name"))): r
        for f in found or ()
        for r in f.get("resources") or ()
    }


def kueue_cluster_queue(obj: Obj, poll: Poll) -> list[QueueQuota]:
    """One record per flavor and GPU resource of a ClusterQueue."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    usage = _kueue_usage(status, "flavorsUsage")
    out = []
    for flavor, resource, quota in kueue_gpu_quotas(obj, poll.shares):
        nominal = _gpus(poll, resource, quota.get("nominalQuota"))
        borrowing = quota.get("borrowingLimit")
        used = (usage or {}).get((flavor, resource))
        out.append(
            _record(
                poll,
                QueueKind.KUEUE_CLUSTER_QUEUE,
                obj,
                parent=spec.get("cohortName") or spec.get("cohort"),
                flavor=flavor,
                resource=resource,
                entitled_gpus=nominal,
                # no borrowingLimit: it may borrow all its cohort lends, no fixed most
                limit_gpus=None
                if borrowing is None
                else nominal + _gpus(poll, resource, borrowing),
                held_gpus=_opt_gpus(poll, resource, (used or {}).get("total")),
                borrowed_gpus=_opt_gpus(poll, resource, (used or {}).get("borrowed")),
                pending_workloads=_count(status.get("pendingWorkloads")),
                admitted_workloads=_count(status.get("admittedWorkloads")),
            )
        )
    return out


def kueue_local_queue(
    obj: Obj, poll: Poll, covered: Mapping[str, Sequence[tuple[str, str]]]
) -> list[QueueQuota]:
    """One record per flavor and GPU resource of a LocalQueue: those its ClusterQueue covers
    (``covered``: ClusterQueue -> (flavor, resource)), and any other its usage shows."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    cluster_queue = spec.get("clusterQueue")
    usage = _kueue_usage(status, "flavorsUsage", "flavorUsage")
    pairs = dict.fromkeys(covered.get(str(cluster_queue), ()))
    pairs.update(dict.fromkeys(k for k in usage or {} if poll.shares.is_gpu(k[1])))
    out = []
    for flavor, resource in pairs:
        used = (usage or {}).get((flavor, resource))
        out.append(
            _record(
                poll,
                QueueKind.KUEUE_LOCAL_QUEUE,
                obj,
                namespace=meta.get("namespace"),
                parent=cluster_queue,
                flavor=flavor,
                resource=resource,
                held_gpus=_opt_gpus(poll, resource, (used or {}).get("total")),
                pending_workloads=_count(status.get("pendingWorkloads")),
                admitted_workloads=_count(status.get("admittedWorkloads")),
            )
        )
    return out


def _kai_amount(value: object) -> float | None:
    """KAI's quota and limit: numbers of GPUs; -1 (any negative) means unlimited: no number."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, str):
        value = amount(value) if not value.strip().startswith("-") else -1.0
    return float(value) if value >= 0 else None


def kai_queue(obj: Obj, poll: Poll) -> list[QueueQuota]:
    """A KAI Queue's GPU quota (one record), when it states GPUs or holds some."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    gpu = (spec.get("resources") or {}).get("gpu")
    allocated = (status.get("allocated") or {}).get(KAI_GPU_RESOURCE)
    if not gpu and allocated is None:
        return []
    gpu = gpu or {}
    return [
        _record(
            poll,
            QueueKind.KAI_QUEUE,
            obj,
            parent=spec.get("parentQueue") or None,
            resource=KAI_GPU_RESOURCE,
            entitled_gpus=_kai_amount(gpu.get("quota")),
            limit_gpus=_kai_amount(gpu.get("limit")),
            held_gpus=amount(allocated) if allocated is not None else None,
        )
    ]


def volcano_queue(obj: Obj, poll: Poll) -> list[QueueQuota]:
    """One record per GPU resource a Volcano Queue names (deserved, guarantee, capability,
    allocated). Entitled: deserved, else guarantee; admitted: its PodGroups Inqueue + Running."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    deserved, capability = spec.get("deserved") or {}, spec.get("capability") or {}
    guarantee = (spec.get("guarantee") or {}).get("resource") or {}
    allocated = status.get("allocated")
    names = {*deserved, *guarantee, *capability, *(allocated or {})}
    inqueue, running = _count(status.get("inqueue")), _count(status.get("running"))
    admitted = None if inqueue is None and running is None else (inqueue or 0) + (running or 0)
    out = []
    for resource in sorted(n for n in names if poll.shares.is_gpu(str(n))):
        entitled = deserved.get(resource, guarantee.get(resource))
        out.append(
            _record(
                poll,
                QueueKind.VOLCANO_QUEUE,
                obj,
                parent=spec.get("parent") or None,
                resource=resource,
                entitled_gpus=_opt_gpus(poll, resource, entitled),
                limit_gpus=_opt_gpus(poll, resource, capability.get(resource)),
                # allocated lists the resources a queue holds: one it does not list, it holds none
                held_gpus=None
                if allocated is None
                else _gpus(poll, resource, allocated.get(resource, 0)),
                pending_workloads=_count(status.get("pending")),
                admitted_workloads=admitted,
            )
        )
    return out
