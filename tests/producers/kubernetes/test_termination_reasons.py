"""Why a GPU pod ended when a queue manager (Kueue, KAI, Volcano) or Kubernetes took it away:
pod objects shaped as each project's source writes them, read by ``termination()`` and
``disruption_reason()``. Each case names the file (and tag or commit) the shape comes from.

Sources read (snapshots of 2026):
- kubernetes-sigs/kueue ff69552e79 (v0.20.0-devel; same code in v0.7.0 .. v0.19.2)
- NVIDIA/KAI-Scheduler 72de64fc8e (v0.13.0-rc1+; the flag since v0.8.1)
- volcano-sh/volcano ed72c7c815 (v1.16.0-alpha.1+; the DisruptionTarget since v1.13.0)
- kubernetes/kubernetes master (pkg/controller/job, pkg/controller/devicetainteviction)
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpugap.producers.kubernetes.resources import disruption_reason, termination
from gpugap.schemas.types import TerminationReason

STARTED, STOPPED = "2026-11-02T10:00:00Z", "2026-11-02T11:00:20Z"
ASKED = "2026-11-02T11:00:00Z"  # the stopper's condition and its DELETE


def gpu_pod(*conditions: dict[str, Any], phase: str = "Failed", exit_code: int = 143) -> Any:
    """A bound GPU pod its controller deleted (deletionTimestamp = ask + 30 s grace) and whose
    container then stopped on SIGTERM; the kubelet's own conditions as it writes them."""
    kubelet = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": STARTED},
        {
            "type": "Ready",
            "status": "False",
            "reason": "PodCompleted",
            "lastTransitionTime": STOPPED,
        },
    ]
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "ml",
            "uid": "u-1",
            "deletionTimestamp": "2026-11-02T11:00:30Z",
            "deletionGracePeriodSeconds": 30,
        },
        "spec": {
            "restartPolicy": "Never",
            "nodeName": "gpu-1",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {
            "phase": phase,
            "conditions": [*kubelet, *copy.deepcopy(conditions)],
            "containerStatuses": [
                {
                    "name": "c",
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": "Error",
                            "startedAt": STARTED,
                            "finishedAt": STOPPED,
                        }
                    },
                }
            ],
        },
    }


def cond(kind: str, reason: str, message: str, status: str = "True") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "lastTransitionTime": ASKED,
        "reason": reason,
        "message": message,
    }


def kueue_stop(reason: str, message: str = "Preempted to accommodate a workload") -> Any:
    # kubernetes-sigs/kueue pkg/controller/jobs/pod/pod_controller.go (ff69552e79) Pod.Stop:
    # Type ConditionTypeTerminationTarget = "TerminationTarget", Status True, Reason
    # string(stopReason), then c.Delete(pod). stopReason comes from
    # pkg/controller/jobframework/reconciler.go stopJob: for a ComposableJob (the Pod),
    # StopReasonWorkloadEvicted + "DueTo" + the Workload's Evicted reason
    # (apis/kueue/v1beta2/workload_types.go: "Preempted", "PodsReadyTimeout",
    # "AdmissionCheck", "ClusterQueueStopped", "LocalQueueStopped", "NodeFailures",
    # "Deactivated" (+ "DueTo<cause>"), ...)
    return cond("TerminationTarget", reason, message)


def disruption_target(reason: str, message: str) -> dict[str, Any]:
    return cond("DisruptionTarget", reason, message)


# KAI: pkg/scheduler/api/unschedule_info.go GetPreemptMessage / GetReclaimMessage
KAI_RECLAIM = "Pod ml/train-0 was preempted by workload team-b/llm-1."
# Volcano: pkg/scheduler/cache/cache.go defaultEvictor.Evict
VOLCANO_MSG = "volcano: preempting to accommodate a higher priority pod"


@pytest.mark.parametrize(
    ("conditions", "want"),
    [
        # --- Kueue, plain-pod integration (and the pod groups of StatefulSet / LWS) ---------
        # pkg/scheduler/preemption/preemption.go: Evict(..., kueue.WorkloadEvictedByPreemption)
        # -> Workload Evicted "Preempted" -> pods: TerminationTarget "WorkloadEvictedDueToPreempted"
        # (pkg/controller/jobs/pod/pod_controller_test.go expects exactly this condition)
        ([kueue_stop("WorkloadEvictedDueToPreempted")], "preempted"),
        # pkg/controller/core/workload_controller.go: the ClusterQueue / LocalQueue stopped
        # with HoldAndDrain evicts admitted work: a drain
        ([kueue_stop("WorkloadEvictedDueToClusterQueueStopped", "The ClusterQueue is stopped")],
         "evicted"),
        ([kueue_stop("WorkloadEvictedDueToLocalQueueStopped", "The LocalQueue is stopped")],
         "evicted"),
        # pkg/controller/tas/node_controller.go, pkg/scheduler/scheduler.go (TAS, >= v0.12):
        # kueue.WorkloadEvictedDueToNodeFailures = "NodeFailures"
        ([kueue_stop("WorkloadEvictedDueToNodeFailures", "Workload was evicted as there was "
                     "no replacement for unhealthy node(s): gpu-1")], "node_lost"),
        # --- KAI: pkg/scheduler/cache/evictor/default_evictor.go (72de64fc8e) ------------------
        # with --update-pod-eviction-condition (default false, since v0.8.1): DisruptionTarget
        # True, Reason v1.PodReasonPreemptionByScheduler, then Pods().Delete (no eviction API)
        ([disruption_target("PreemptionByScheduler", KAI_RECLAIM)], "preempted"),
        # --- Volcano: pkg/scheduler/cache/cache.go defaultEvictor.Evict (ed72c7c815, v1.13.0+):
        # Ready False "Evict" (the kubelet rewrites Ready later) + DisruptionTarget True
        # PreemptionByScheduler, UpdateStatus, then Pods().Delete
        ([disruption_target("PreemptionByScheduler", VOLCANO_MSG)], "preempted"),
        # --- Kubernetes (k8s.io/api core/v1, pkg/controller/...) ---------------------------
        # "PreemptionByKubeScheduler" was the name in 1.26, renamed in 1.27 (#114623)
        ([disruption_target("PreemptionByKubeScheduler", "Kube-scheduler: preempting")],
         "preempted"),
        # pkg/controller/devicetainteviction/device_taint_eviction.go addConditionAndDeletePod:
        # a NoExecute DRA device taint (e.g. a broken GPU)
        ([disruption_target("DeletionByDeviceTaintManager",
                            "Device Taint manager: deleting due to NoExecute taint")], "evicted"),
        # preempted wins over an eviction marker on the same pod
        ([disruption_target("DeletionByTaintManager", "Taint manager: deleting due to NoExecute "
                            "taint"), kueue_stop("WorkloadEvictedDueToPreempted")], "preempted"),
    ],
)  # fmt: skip
def test_a_queue_managers_marker_names_the_cause(
    conditions: list[dict[str, Any]], want: str
) -> None:
    pod = gpu_pod(*conditions)
    reason, ended = termination(pod)
    assert reason == TerminationReason(want)
    assert ended is not None and ended.strftime("%H:%M:%S") == "11:00:20"
    assert disruption_reason(pod) == TerminationReason(want)  # the same when seen deleted


@pytest.mark.parametrize(
    "conditions",
    [
        # kubernetes/kubernetes pkg/controller/job/job_controller.go manageJob: a suspended
        # Job's active pods go through deleteJobPods -> removeTrackingFinalizerPatch +
        # podControl.DeletePod, no condition. Kueue suspends the batch/v1 Job on every
        # Workload eviction (jobframework/reconciler.go stopJob -> job.Suspend()), preemption
        # included: the pods say nothing; only the Workload's Evicted condition does.
        pytest.param([], id="job-suspended-by-kueue"),
        # KAI without --update-pod-eviction-condition (the default): a plain Pods().Delete
        pytest.param([], id="kai-default"),
        # Kueue v0.5-v0.6 (pod_controller.go at v0.6.0): "StoppedByKueue" for every stop
        [kueue_stop("StoppedByKueue", "Preempted to accommodate a higher priority Workload")],
        # Kueue evictions that are not a preemption, drain or node failure: the workload's own
        # doing (PodsReadyTimeout), an admission check, a user's deactivation or a limit
        [kueue_stop("WorkloadEvictedDueToPodsReadyTimeout", "Exceeded the PodsReady timeout")],
        [kueue_stop("WorkloadEvictedDueToAdmissionCheck", "At least one admission check is false")],
        [kueue_stop("WorkloadEvictedDueToDeactivated", "The workload is deactivated")],
        [kueue_stop("WorkloadEvictedDueToInactiveWorkload", "The workload is deactivated")],
        [kueue_stop("WorkloadEvictedDueToDeactivatedDueToRequeuingLimitExceeded", "exceeding "
                    "the maximum number of re-queuing retries")],
        [kueue_stop("WorkloadDeleted", "Workload is deleted")],
        # identity: exact strings only, on the right condition, status True
        [kueue_stop("WorkloadEvictedDueToPreemptedSomehow")],
        [cond("TerminationTarget", "WorkloadEvictedDueToPreempted", "m", status="False")],
        [disruption_target("WorkloadEvictedDueToPreempted", "m")],
        [kueue_stop("PreemptionByScheduler")],
        [cond("DisruptionTarget", "PreemptionByScheduler", VOLCANO_MSG, status="False")],
    ],
)  # fmt: skip
def test_a_pod_that_carries_no_readable_marker_stays_deleted(
    conditions: list[dict[str, Any]],
) -> None:
    pod = gpu_pod(*conditions)
    reason, ended = termination(pod)
    assert reason == TerminationReason.DELETED
    assert ended is not None and ended.strftime("%H:%M:%S") == "11:00:20"
    assert disruption_reason(pod) is None


def test_old_volcanos_ready_evict_when_the_pod_still_shows_it() -> None:
    # volcano-sh/volcano pkg/scheduler/cache/cache.go defaultEvictor.Evict, v1.8.0 .. v1.12.x:
    # only {Type: PodReady, Status: False, Reason: "Evict", Message: "Pod is evicted, because
    # of <reason>"}, then Pods().Delete. The kubelet regenerates Ready when it reports the pod
    # stopped (Ready False, reason PodCompleted), so this is read where the last object
    # still carries it: deleted before the kubelet reported (e.g. its node unreachable).
    pod = gpu_pod(phase="Running")
    pod["status"]["conditions"][1] = cond(
        "Ready", "Evict", "Pod is evicted, because of preempt", status="False"
    )
    del pod["status"]["containerStatuses"][0]["state"]["terminated"]
    pod["status"]["containerStatuses"][0]["state"]["running"] = {"startedAt": STARTED}
    assert disruption_reason(pod) == TerminationReason.PREEMPTED
    # a Ready True "Evict" or a kubelet Ready reason says nothing
    pod["status"]["conditions"][1]["status"] = "True"
    assert disruption_reason(pod) is None


def test_a_malformed_reason_is_no_marker() -> None:
    pod = gpu_pod({"type": "DisruptionTarget", "status": "True", "reason": ["Preempted"]})
    pod["status"]["conditions"].append({"type": "TerminationTarget", "status": "True",
                                        "reason": {"x": 1}})  # fmt: skip
    assert disruption_reason(pod) is None
    assert termination(pod)[0] == TerminationReason.DELETED
