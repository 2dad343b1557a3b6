"""kube-state-metrics series at one instant -> the pod objects the live watcher would have
read (pure: no I/O), so the Kubernetes producer's own ``Tracker`` turns them into events.

What each series gives the object (kube-state-metrics v2 names; every series has ``uid``):

| series | object |
| --- | --- |
| ``kube_pod_info{namespace,pod,uid,node}`` | metadata, ``spec.nodeName`` |
| ``kube_pod_owner{owner_kind,owner_name,owner_is_controller}`` | ``ownerReferences`` |
| ``kube_pod_labels{label_*}`` | ``labels`` (only the keys gpugap reads, see below) |
| ``kube_pod_(init_)container_resource_requests{container,resource,unit}`` | requests |
| ``kube_pod_status_phase{phase} == 1`` | ``status.phase`` |
| ``kube_pod_status_scheduled_time`` | PodScheduled's ``lastTransitionTime`` (bound) |
| ``kube_pod_container_state_started{container}`` | a container's ``startedAt`` (running) |
| ``kube_pod_completion_time`` | a terminated container's ``finishedAt`` |
| ``kube_pod_container_status_terminated_reason{container,reason}`` | ``OOMKilled``... |
| ``kube_pod_status_reason{reason} == 1`` | ``status.reason`` (``Evicted``) |
| ``kube_pod_deletion_timestamp`` | ``deletionTimestamp`` (a deletion asked for) |

kube-state-metrics writes label keys and resource names as Prometheus label names (every
character outside ``[a-zA-Z0-9_]`` becomes ``_``): a label key is recognised only when it is
one gpugap reads (class, owner, team, gang keys, carried labels), and a resource only when
it is one of the configured GPU resources (``gpu_intel_com_i915`` -> ``gpu.intel.com/i915``,
``amd_com_cpx_nps4`` -> ``amd.com/cpx_nps4``) or a MIG profile (``nvidia_com_mig_1g_10gb`` ->
``nvidia.com/mig-1g.10gb``).
A pod owned by a Job is taken as ``restartPolicy: Never`` (kube-state-metrics does not
export it), any other as ``Always``, the Kubernetes default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpugap.groundfloor.classify import CLASS_LABEL, GANG_LABEL, GANG_SIZE_LABEL

#: our name -> the series; values at a step are per pod uid
SERIES = {
    "info": "kube_pod_info",
    "owner": "kube_pod_owner",
    "labels": "kube_pod_labels",
    "requests": "kube_pod_container_resource_requests",
    "init_requests": "kube_pod_init_container_resource_requests",
    "phase": "kube_pod_status_phase",
    "scheduled": "kube_pod_status_scheduled_time",
    "started": "kube_pod_container_state_started",
    "completed": "kube_pod_completion_time",
    "terminated": "kube_pod_container_status_terminated_reason",
    "reason": "kube_pod_status_reason",
    "deletion": "kube_pod_deletion_timestamp",
}
#: series that say something only where their value is 1 (one series per possible value)
FLAGS = ("phase", "terminated", "reason")
#: the API group of the owner kinds whose pods kube-state-metrics describes
GROUPS = {
    "ReplicaSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Deployment": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}
#: gang keys groundfloor.classify.gang_of reads
GANG_KEYS = (
    GANG_LABEL,
    GANG_SIZE_LABEL,
    "leaderworkerset.sigs.k8s.io/name",
    "leaderworkerset.sigs.k8s.io/group-index",
    "leaderworkerset.sigs.k8s.io/size",
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "training.kubeflow.org/operator-name",
    "group-name",
    "job-name",
    "volcano.sh/job-name",
    "kueue.x-k8s.io/pod-group-name",
    "kueue.x-k8s.io/pod-group-total-count",
    "scheduling.k8s.io/group-name",
    "scheduling.x-k8s.io/pod-group",
)
_MIG = re.compile(r"^nvidia_com_mig_(\d+c_)?(\d+g)_(\d+gb)$")


def prom_name(name: str) -> str:
    """A name as a Prometheus label name or value kube-state-metrics writes (invalid chars
    ``_``): ``gpu.intel.com/i915`` -> ``gpu_intel_com_i915``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def sanitize(key: str) -> str:
    """A label key as kube-state-metrics names it (``label_<key>``, invalid chars ``_``)."""
    return "label_" + prom_name(key)


def label_keys(keys: Iterable[str], carry: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(sanitized -> key for the exact keys, sanitized prefixes of the carried patterns)."""
    exact = {sanitize(k): k for k in (*keys, CLASS_LABEL, *GANG_KEYS)}
    exact.update({sanitize(p): p for p in carry if "*" not in p and "?" not in p})
    prefixes = [p[:-1] for p in carry if p.endswith("*") and "*" not in p[:-1]]
    return exact, prefixes


def resource_names(names: Iterable[str]) -> dict[str, str]:
    """kube-state-metrics' name of each GPU resource -> the resource (``amd_com_gpu`` ->
    ``amd.com/gpu``)."""
    return {prom_name(name): name for name in names}


def resource_name(value: str, known: Mapping[str, str]) -> str:
    """A ``resource`` label back to its resource: a known GPU resource, a MIG profile
    (``nvidia_com_mig_1g_10gb`` -> ``nvidia.com/mig-1g.10gb``), else the label as it is
    (``cpu``, ``memory``: never a GPU)."""
    if value in known:
        return known[value]
    m = _MIG.match(value)
    if m:
        return f"nvidia.com/mig-{(m.group(1) or '').replace('_', '.')}{m.group(2)}.{m.group(3)}"
    return value


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodView:
    """What the series say about one pod at one step."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.by: dict[str, list[tuple[dict[str, str], float]]] = {}

    def add(self, what: str, labels: dict[str, str], value: float) -> None:
        if what in FLAGS and value != 1:
            return
        self.by.setdefault(what, []).append((labels, value))

    def first(self, what: str) -> tuple[dict[str, str], float] | None:
        found = self.by.get(what)
        return found[0] if found else None

    def pod(
        self, exact: Mapping[str, str], prefixes: list[str], resources: Mapping[str, str]
    ) -> dict[str, Any] | None:
        """The pod object, or None when ``kube_pod_info`` does not show the pod (gone)."""
        info = self.first("info")
        if info is None:
            return None
        labels, _ = info
        meta: dict[str, Any] = {
            "uid": self.uid,
            "name": labels.get("pod", ""),
            "namespace": labels.get("namespace", ""),
            "labels": self._labels(exact, prefixes),
        }
        owners = [
            {
                "apiVersion": GROUPS.get(o["owner_kind"], ""),
                "kind": o["owner_kind"],
                "name": o["owner_name"],
                "controller": o.get("owner_is_controller") == "true",
            }
            for o, _ in self.by.get("owner", ())
            if o.get("owner_kind") not in (None, "", "<none>")
        ]
        if owners:
            meta["ownerReferences"] = owners
        if (deletion := self.first("deletion")) is not None:
            meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = _iso(deletion[1]), 0
        job = any(o["kind"] == "Job" for o in owners)
        spec = {
            "nodeName": labels.get("node") or None,
            "restartPolicy": "Never" if job else "Always",
            "containers": self._containers("requests", resources),
            "initContainers": self._containers("init_requests", resources),
        }
        return {"metadata": meta, "spec": spec, "status": self._status()}

    def _labels(self, exact: Mapping[str, str], prefixes: list[str]) -> dict[str, str]:
        found = self.first("labels")
        out: dict[str, str] = {}
        for k, v in (found[0] if found else {}).items():
            if k in exact:
                out[exact[k]] = v
                continue
            for prefix in prefixes:
                if k.startswith(sanitize(prefix)) and len(k) > len(sanitize(prefix)):
                    out[prefix + k[len(sanitize(prefix)) :]] = v
        return out

    def _containers(self, what: str, resources: Mapping[str, str]) -> list[dict[str, Any]]:
        by_name: dict[str, dict[str, int]] = {}
        for labels, value in self.by.get(what, ()):
            if labels.get("unit", "integer") == "integer" and value > 0:
                name = labels.get("container", "")
                by_name.setdefault(name, {})[
                    resource_name(labels.get("resource", ""), resources)
                ] = round(value)
        return [{"name": n, "resources": {"requests": r}} for n, r in by_name.items()]

    def _status(self) -> dict[str, Any]:
        phase = self.first("phase")
        status: dict[str, Any] = {"phase": phase[0].get("phase", "Unknown") if phase else "Pending"}
        if (scheduled := self.first("scheduled")) is not None:
            status["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _iso(scheduled[1])}
            ]
        if (reason := self.first("reason")) is not None:
            status["reason"] = reason[0].get("reason")
        completed = self.first("completed")
        terminal = status["phase"] in ("Succeeded", "Failed")
        reasons = {
            lab.get("container", ""): lab.get("reason") for lab, _ in self.by.get("terminated", ())
        }
        statuses = []
        for labels, started in self.by.get("started", ()):
            name = labels.get("container", "")
            if terminal or name in reasons:
                done: dict[str, Any] = {"startedAt": _iso(started), "reason": reasons.get(name)}
                if completed is not None:
                    done["finishedAt"] = _iso(completed[1])
                statuses.append({"name": name, "state": {"terminated": done}})
            else:
                statuses.append({"name": name, "state": {"running": {"startedAt": _iso(started)}}})
        if statuses:
            status["containerStatuses"] = statuses
        return status
