"""What a pod object says, read from its JSON as the API server sends it (camelCase dicts):
GPUs requested (Kubernetes' effective-request rule), and when and why it was bound, ran and
terminated. Plain functions on dicts, no client models: deserialising into the client's
classes costs more than everything else the producer does per pod."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.producers.kubernetes.bounds import Rejected
from gpugap.schemas.types import TerminationReason

Obj = Mapping[str, Any]
#: containers (and, separately, init containers) read from one pod spec. Kubernetes sets no
#: number, only the object's size (about 1.5 MB); real pods have a handful. A spec with more
#: is refused (one dead letter) rather than read in full on every update of the pod.
MAX_CONTAINERS = 512

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: 1,
    "m": 1e-3,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}

# Why a pod was made to end, from what the pod itself carries. Exact strings, never prefixes.
#: DisruptionTarget (status True) reasons. PreemptionByScheduler (k8s.io/api core/v1
#: PodReasonPreemptionByScheduler; "PreemptionByKubeScheduler" until Kubernetes 1.27, #114623)
#: is written by kube-scheduler, and by Volcano (>= v1.13, pkg/scheduler/cache/cache.go
#: defaultEvictor.Evict) and KAI (pkg/scheduler/cache/evictor/default_evictor.go, only with
#: --update-pod-eviction-condition, default false) when they preempt or reclaim.
PREEMPTED_BY = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler"})
#: the eviction API (kubectl drain), the kubelet (node pressure, graceful node shutdown), the
#: taint manager (NoExecute node taint) and the DRA device taint manager
#: (pkg/controller/devicetainteviction: a NoExecute taint on an allocated device, e.g. a GPU)
EVICTED_BY = frozenset(
    {
        "EvictionByEvictionAPI",
        "TerminationByKubelet",
        "DeletionByTaintManager",
        "DeletionByDeviceTaintManager",
    }
)
#: kube-controller-manager's pod GC (pkg/controller/podgc): the pod's node no longer exists
NODE_LOST_BY = frozenset({"DeletionByPodGC"})

#: Kueue's own condition type on the pods it stops (plain-pod integration, and the pod groups
#: its StatefulSet/LeaderWorkerSet integrations build on; kubernetes-sigs/kueue
#: pkg/controller/jobs/pod/pod_controller.go Pod.Stop). Its reason, since Kueue v0.7.0, is
#: "WorkloadEvictedDueTo" + the Workload's Evicted reason (jobframework/reconciler.go stopJob);
#: v0.5-v0.6 wrote "StoppedByKueue" for every stop, which says nothing of why.
KUEUE_STOP_CONDITION = "TerminationTarget"
#: Workload Evicted reason "Preempted" (pkg/scheduler/preemption: within the ClusterQueue,
#: cohort reclaim, fair sharing)
KUEUE_PREEMPTED_BY = frozenset({"WorkloadEvictedDueToPreempted"})
#: a stopped queue draining its admitted work (stopPolicy HoldAndDrain)
KUEUE_EVICTED_BY = frozenset(
    {"WorkloadEvictedDueToClusterQueueStopped", "WorkloadEvictedDueToLocalQueueStopped"}
)
#: Topology-Aware Scheduling evicted the workload because its nodes failed (Kueue >= v0.12)
KUEUE_NODE_LOST_BY = frozenset({"WorkloadEvictedDueToNodeFailures"})
#: Volcano before v1.13 marked the pods it preempted or reclaimed only with Ready False,
#: reason "Evict"; the kubelet rewrites Ready once it reports the pod stopped, so this is read
#: only where the pod's last state still shows it.
VOLCANO_EVICT_READY_REASON = "Evict"


def quantity(value: object) -> int:
    """A Kubernetes quantity as a whole count ("2", "1k", "2000m"); anything else is 0.

    Extended resources such as ``nvidia.com/gpu`` only admit whole numbers, and the API
    server sends quantities as strings.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    m = _QUANTITY.match(str(value).strip()) if isinstance(value, str | float) else None
    if m is None:
        return 0
    n = float(m.group(1)) * _SUFFIX[m.group(2)]
    return int(n) if n == int(n) else 0


class GpuRule:
    """Which extended resources are GPUs, and how many a pod holds of each."""

    def __init__(self, names: Iterable[str], prefixes: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.prefixes = tuple(prefixes)

    def is_gpu(self, resource: str) -> bool:
        return resource in self.names or resource.startswith(self.prefixes)

    def _container(self, container: Obj) -> dict[str, int]:
        res = container.get("resources") or {}
        # extended resources: requests must equal limits, and requests default to limits
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        out = {}
        for name, value in merged.items():
            if self.is_gpu(name) and (n := quantity(value)):
                out[name] = n
        return out

    def pod_gpus(self, spec: Obj) -> dict[str, int]:
        """Effective GPU requests of a pod spec, per resource name.

        Kubernetes' rule: the larger of (a) the sum over app containers plus restartable
        (sidecar) init containers and (b) for each ordinary init container, its request plus
        the sidecars started before it. Without sidecars: max(largest init, sum of apps).
        """
        apps: dict[str, int] = {}
        for c in _containers(spec, "containers"):
            for name, n in self._container(c).items():
                apps[name] = apps.get(name, 0) + n
        sidecars: dict[str, int] = {}
        peak: dict[str, int] = {}
        for c in _containers(spec, "initContainers"):
            req = self._container(c)
            if c.get("restartPolicy") == "Always":
                for name, n in req.items():
                    sidecars[name] = sidecars.get(name, 0) + n
                    peak[name] = max(peak.get(name, 0), sidecars[name])
            else:
                for name, n in req.items():
                    peak[name] = max(peak.get(name, 0), n + sidecars.get(name, 0))
        out = {}
        for name in apps.keys() | sidecars.keys() | peak.keys():
            n = max(apps.get(name, 0) + sidecars.get(name, 0), peak.get(name, 0))
            if n:
                out[name] = n
        return out

    def template_gpus(self, template: Obj | None) -> int:
        """GPUs one pod of a controller's pod template requests."""
        spec = (template or {}).get("spec") or {}
        return sum(self.pod_gpus(spec).values())


def _containers(spec: Obj, key: str) -> Sequence[Obj]:
    found: Sequence[Obj] = spec.get(key) or ()
    if len(found) > MAX_CONTAINERS:
        raise Rejected(f"spec.{key}: {len(found)} containers (more than {MAX_CONTAINERS})")
    return found


def gpu_summary(counts: Mapping[str, int]) -> tuple[int, str | None]:
    """(GPU devices, resource name) — several resource names are listed, comma-separated."""
    if not counts:
        return 0, None
    return sum(counts.values()), ",".join(sorted(counts))


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t
    try:
        t.astimezone(UTC)
    except OverflowError:  # e.g. year 9999 with an offset: no UTC instant to record
        return None
    return t


def _condition(pod: Obj, kind: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c
    return None


def _statuses(pod: Obj) -> Sequence[Obj]:
    status = pod.get("status") or {}
    return [*(status.get("containerStatuses") or ()), *(status.get("initContainerStatuses") or ())]


def bound_time(pod: Obj) -> datetime | None:
    """When the scheduler bound the pod: PodScheduled's lastTransitionTime, else startTime."""
    cond = _condition(pod, "PodScheduled")
    if cond is not None and cond.get("status") == "True":
        t = parse_time(cond.get("lastTransitionTime"))
        if t is not None:
            return t
    return parse_time((pod.get("status") or {}).get("startTime"))


def started_time(pod: Obj) -> datetime | None:
    """The earliest container start the object still shows (running, terminated, last)."""
    times = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            for key in ("running", "terminated"):
                t = parse_time((state.get(key) or {}).get("startedAt"))
                if t is not None:
                    times.append(t)
    return min(times) if times else None


def has_run(pod: Obj) -> bool:
    """Running now, or terminal after at least one app container started."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Running":
        return True
    return phase in ("Succeeded", "Failed") and started_time(pod) is not None


def finished_time(pod: Obj) -> datetime | None:
    """When the last container finished; without one, the last condition change."""
    ends = [
        t
        for cs in _statuses(pod)
        if (t := parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")))
    ]
    if ends:
        return max(ends)
    conds = [
        t
        for c in (pod.get("status") or {}).get("conditions") or ()
        if c.get("type") in ("Ready", "ContainersReady", "DisruptionTarget")
        and (t := parse_time(c.get("lastTransitionTime")))
    ]
    return max(conds) if conds else None


def deletion_requested(pod: Obj) -> datetime | None:
    """When deletion was asked for: deletionTimestamp minus the grace period it carries."""
    meta = pod.get("metadata") or {}
    t = parse_time(meta.get("deletionTimestamp"))
    if t is None:
        return None
    try:
        return t - timedelta(seconds=int(meta.get("deletionGracePeriodSeconds") or 0))
    except (TypeError, ValueError, OverflowError):  # an unreadable grace period: none
        return t


def _reason(pod: Obj, kind: str, status: str = "True") -> str | None:
    """The reason of the pod's condition ``kind`` when it has that status (a string, else None)."""
    cond = _condition(pod, kind)
    why = cond.get("reason") if cond is not None and cond.get("status") == status else None
    return why if isinstance(why, str) else None


def disruption_reason(pod: Obj) -> TerminationReason | None:
    """Preempted, evicted or its node lost, when the pod says so: DisruptionTarget,
    status.reason, Kueue's TerminationTarget, old Volcano's Ready "Evict". Preempted first.

    A pod whose owner was stopped carries nothing: a batch/v1 Job that Kueue suspends (for a
    preemption too) has its pods deleted by the Job controller without a condition, as does
    KAI by default. Those stay "deleted"; only the Workload's Evicted condition says why.
    """
    why = _reason(pod, "DisruptionTarget")
    kueue = _reason(pod, KUEUE_STOP_CONDITION)
    status_reason = (pod.get("status") or {}).get("reason")
    if (
        why in PREEMPTED_BY
        or status_reason == "Preempting"
        or kueue in KUEUE_PREEMPTED_BY
        or _reason(pod, "Ready", "False") == VOLCANO_EVICT_READY_REASON
    ):
        return TerminationReason.PREEMPTED
    if why in EVICTED_BY or status_reason == "Evicted" or kueue in KUEUE_EVICTED_BY:
        return TerminationReason.EVICTED
    if why in NODE_LOST_BY or kueue in KUEUE_NODE_LOST_BY:
        return TerminationReason.NODE_LOST
    return None


def termination(pod: Obj) -> tuple[TerminationReason, datetime | None]:
    """Why a terminal pod ended, and when it let go of its GPUs.

    preempted > evicted > node lost > deleted > OOM-killed > completed/failed. "deleted" means
    the pod ended because someone asked (a scale-down, a user, a controller): a deletion was
    requested and its containers stopped after that, or it could only have ended that way
    (restartPolicy Always, e.g. a crash-looping pod, which holds its GPUs until the deletion).
    Then the end is no earlier than the deletion request.
    """
    ended = finished_time(pod)
    disrupted = disruption_reason(pod)
    if disrupted is not None:
        return disrupted, ended
    asked = deletion_requested(pod)
    always = (pod.get("spec") or {}).get("restartPolicy", "Always") == "Always"
    if asked is not None and (always or ended is None or ended >= asked):
        return TerminationReason.DELETED, max(ended, asked) if ended else asked
    for cs in _statuses(pod):
        if ((cs.get("state") or {}).get("terminated") or {}).get("reason") == "OOMKilled":
            return TerminationReason.OOM_KILLED, ended
    if (pod.get("status") or {}).get("phase") == "Succeeded":
        return TerminationReason.COMPLETED, ended
    return TerminationReason.FAILED, ended
