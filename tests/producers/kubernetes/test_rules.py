"""Table tests: GPU count (effective-request rule), workload class, owner/team, gang and
termination rules — on hand-written cases and on the recorded manifests in tests/fixtures/k8s."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from gpugap.groundfloor.classify import (
    ClassRule,
    Owner,
    classify_pod,
    classify_slurm,
    gang_of,
    owner_and_team,
)
from gpugap.producers import plugin
from gpugap.producers.kubernetes.owners import OwnerResolver, expected_gpu_pods
from gpugap.producers.kubernetes.producer import make_enricher
from gpugap.producers.kubernetes.resources import GpuRule, gpu_summary, quantity, termination
from gpugap.producers.kubernetes.settings import KubernetesSettings
from gpugap.schemas.types import TerminationReason, WorkloadClass
from tests.harness.k8s_api import PLURALS, Scenario, merge_patch, scenarios

RULE = GpuRule(["nvidia.com/gpu"], ["nvidia.com/mig-"])


def c(gpus: object = None, *, res: str = "nvidia.com/gpu", where: str = "limits", **kw: Any) -> Any:
    resources = {where: {res: gpus, "cpu": "2"}} if gpus is not None else {}
    return {"name": "c", "image": "x", "resources": resources, **kw}


# --- GPU count ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({"containers": [c("1")]}, {"nvidia.com/gpu": 1}),
        ({"containers": [c("8", where="requests")]}, {"nvidia.com/gpu": 8}),
        ({"containers": [c("2"), c("2"), c()]}, {"nvidia.com/gpu": 4}),  # apps add up
        ({"containers": [c("1")], "initContainers": [c("4")]}, {"nvidia.com/gpu": 4}),  # init max
        ({"containers": [c("3")], "initContainers": [c("2"), c("1")]}, {"nvidia.com/gpu": 3}),
        # a sidecar (restartable init container) runs beside the apps and later inits
        (
            {"containers": [c("2")], "initContainers": [c("1", restartPolicy="Always"), c("2")]},
            {"nvidia.com/gpu": 3},
        ),
        ({"containers": [c("1", res="nvidia.com/mig-1g.10gb")]}, {"nvidia.com/mig-1g.10gb": 1}),
        (
            {"containers": [c("1", res="nvidia.com/mig-3g.40gb"), c("2")]},
            {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/gpu": 2},
        ),
        ({"containers": [c("0")]}, {}),
        ({"containers": [c()]}, {}),
        ({"containers": [c("1", res="amd.com/gpu")]}, {}),  # not configured as a GPU
        ({}, {}),
    ],
)
def test_effective_gpu_request(spec: dict[str, Any], want: dict[str, int]) -> None:
    assert RULE.pod_gpus(spec) == want


@pytest.mark.parametrize(
    ("value", "want"),
    [("1", 1), ("8", 8), (4, 4), ("2000m", 2), ("1k", 1000), ("500m", 0), ("x", 0), (True, 0)],
)
def test_quantities(value: object, want: int) -> None:
    assert quantity(value) == want


def test_summary_names_every_resource() -> None:
    assert gpu_summary({"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1}) == (
        3,
        "nvidia.com/gpu,nvidia.com/mig-1g.10gb",
    )


RECORDED = [(s, key) for s in scenarios() for key in Scenario.load(s).pods]


@pytest.mark.parametrize(("scenario", "key"), RECORDED, ids=[f"{s}:{k}" for s, k in RECORDED])
def test_recorded_pods_gpu_count(scenario: str, key: str) -> None:
    sc = Scenario.load(scenario)
    want = sc.fields(key)
    got = gpu_summary(RULE.pod_gpus(sc.pods[key]["spec"]))
    assert got == (want["gpus"], want["gpu_resource"])


# --- workload class, owner/team and gang, on the recorded manifests -----------------------
def offline_resolver(sc: Scenario) -> OwnerResolver:
    """Owner GETs answered from the scenario's recorded owner objects (no HTTP here)."""
    objects = {
        (o["apiVersion"].rpartition("/")[0], PLURALS[o["kind"]], o["metadata"]["name"]): o
        for o in sc.owners
    }

    def fetch(group: str, version: str, ns: str, plural: str, name: str) -> Mapping[str, Any]:
        return objects[group, plural, name]

    return OwnerResolver(fetch, RULE)


@pytest.mark.parametrize(("scenario", "key"), RECORDED, ids=[f"{s}:{k}" for s, k in RECORDED])
def test_recorded_pods_class_owner_team_gang(scenario: str, key: str) -> None:
    sc = Scenario.load(scenario)
    enrich = make_enricher(KubernetesSettings(), offline_resolver(sc))
    got = enrich(sc.pods[key])
    want = sc.fields(key)
    fields = ("workload_class", "owner_kind", "owner_name", "owner", "team", "gang_id")
    values = {f: getattr(got, f) for f in fields}
    values = {f: v.value if isinstance(v, WorkloadClass) else v for f, v in values.items()}
    assert values == {f: want[f] for f in fields}
    assert got.gang_size == want.get("gang_size")


def chain(*kinds: str) -> list[Owner]:
    return [Owner(kind=k, name=k.lower()) for k in kinds]


@pytest.mark.parametrize(
    ("labels", "owners", "want"),
    [
        ({}, chain("ReplicaSet", "Deployment"), "service"),
        ({}, chain("StatefulSet"), "service"),
        ({}, chain("ReplicaSet", "Deployment", "InferenceService"), "service"),
        ({}, chain("Job", "CronJob"), "batch"),
        ({}, chain("PyTorchJob"), "batch"),
        ({}, chain("Launcher", "MPIJob"), "batch"),
        ({}, chain("Job", "JobSet", "TrainJob"), "batch"),
        ({}, chain("RayCluster", "RayJob"), "batch"),
        ({}, chain("Job"), "batch"),  # Volcano's Job is a "Job" too
        ({}, chain("StatefulSet", "Notebook"), "interactive"),
        ({"notebook-name": "x"}, chain("StatefulSet"), "interactive"),  # Notebook GET forbidden
        ({"component": "singleuser-server", "app": "jupyterhub"}, [], "interactive"),
        ({}, [], "interactive"),  # a bare pod: someone's hand-made pod
        ({}, chain("RayCluster"), "batch"),  # unknown controller
        ({"gpugap.io/workload-class": "Interactive"}, chain("Job"), "interactive"),
        ({"gpugap.io/workload-class": "bogus"}, chain("Job"), "batch"),  # invalid: ignored
    ],
)
def test_workload_class(labels: dict[str, str], owners: list[Owner], want: str) -> None:
    got = classify_pod("ns", "pod", labels=labels, annotations={}, chain=owners)
    assert got == WorkloadClass(want)


def test_class_override_on_an_owner_and_configured_rules() -> None:
    deployment = Owner(kind="Deployment", name="d", labels={"gpugap.io/workload-class": "batch"})
    assert classify_pod("ns", "p", labels={}, annotations={}, chain=[deployment]) == "batch"
    rules = [
        ClassRule(namespace="research-*", owner_kind="RayCluster", workload_class="interactive"),
        ClassRule(label="app=*-notebook", workload_class="interactive"),
        ClassRule(label="batch-serving", workload_class="batch"),
    ]

    def cls(ns: str, labels: dict[str, str], owners: list[Owner]) -> str:
        return classify_pod(ns, "p", labels=labels, annotations={}, chain=owners, rules=rules)

    assert cls("research-vision", {}, chain("RayCluster")) == "interactive"
    assert cls("prod", {}, chain("RayCluster")) == "batch"
    assert cls("prod", {"app": "vscode-notebook"}, chain("Deployment")) == "interactive"
    assert cls("prod", {"batch-serving": ""}, chain("Deployment")) == "batch"
    # the label beats rules
    labels = {"gpugap.io/workload-class": "service", "batch-serving": "1"}
    assert cls("prod", labels, chain("Deployment")) == "service"


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"interactive": False}, "batch"),  # sbatch
        ({"interactive": True}, "interactive"),  # salloc, srun --pty
        ({"interactive": False, "override": WorkloadClass.SERVICE}, "service"),
        ({"interactive": False, "partition": "inference"}, "service"),
        ({"interactive": True, "partition": "inference"}, "service"),
    ],
)
def test_slurm_class(kw: dict[str, Any], want: str) -> None:
    rules = [ClassRule(scheduler="slurm", partition="inference", workload_class="service")]
    assert classify_slurm(rules=rules, **kw) == WorkloadClass(want)


def test_owner_and_team_keys_in_order_pod_first() -> None:
    owners = [Owner(kind="Deployment", name="d", labels={"team": "owners-team", "owner": "x"})]
    keys: dict[str, Any] = {"owner_keys": ["gpugap.io/owner", "owner"], "team_keys": ["team"]}
    got = owner_and_team("ns", labels={"owner": "pod-owner"}, annotations={}, chain=owners, **keys)
    assert got == ("pod-owner", "owners-team")
    got = owner_and_team(
        "ns", labels={}, annotations={"gpugap.io/owner": "ann"}, chain=owners, **keys
    )
    assert got == ("ann", "owners-team")
    assert owner_and_team("ns", labels={}, annotations={}, chain=[], **keys) == (None, "ns")
    got = owner_and_team(
        "ns", labels={}, annotations={}, chain=[], team_from_namespace=False, **keys
    )
    assert got == (None, None)


# --- gangs --------------------------------------------------------------------------------
def job(name: str, gpu_pods: int, api: str = "batch/v1", **labels: str) -> Owner:
    return Owner(kind="Job", name=name, api_version=api, gpu_pods=gpu_pods, labels=labels)


@pytest.mark.parametrize(
    ("labels", "annotations", "owners", "want"),
    [
        (  # Kubeflow training operator v1.7+
            {
                "training.kubeflow.org/job-name": "ft",
                "training.kubeflow.org/replica-type": "worker",
            },
            {},
            [Owner(kind="PyTorchJob", name="ft", gpu_pods=16)],
            ("ns/pytorchjob/ft", 16),
        ),
        (  # older operator labels, owner not resolved
            {"group-name": "kubeflow.org", "job-name": "tf1", "replica-type": "worker"},
            {},
            [],
            ("ns/trainingjob/tf1", None),
        ),
        (
            {
                "training.kubeflow.org/job-name": "m",
                "training.kubeflow.org/operator-name": "mpijob-controller",
            },
            {},
            [],
            ("ns/mpijob/m", None),
        ),
        (  # JobSet: the JobSet's GPU pods
            {
                "jobset.sigs.k8s.io/jobset-name": "js",
                "batch.kubernetes.io/job-completion-index": "0",
            },
            {},
            [job("js-w-0", 2), Owner(kind="JobSet", name="js", gpu_pods=8)],
            ("ns/jobset/js", 8),
        ),
        (  # LeaderWorkerSet: one gang per group
            {
                "leaderworkerset.sigs.k8s.io/name": "lws",
                "leaderworkerset.sigs.k8s.io/group-index": "3",
            },
            {"leaderworkerset.sigs.k8s.io/size": "4"},
            [],
            ("ns/leaderworkerset/lws/3", 4),
        ),
        (  # Volcano Job
            {"volcano.sh/job-name": "vj"},
            {"scheduling.k8s.io/group-name": "vj-pg"},
            [job("vj", 6, api="batch.volcano.sh/v1alpha1")],
            ("ns/volcano/vj", 6),
        ),
        (  # a PodGroup without a known operator (size unknown here)
            {},
            {"scheduling.k8s.io/group-name": "pg"},
            [],
            ("ns/podgroup/pg", None),
        ),
        ({"scheduling.x-k8s.io/pod-group": "cs"}, {}, [], ("ns/podgroup/cs", None)),
        (  # Kueue plain pod group
            {"kueue.x-k8s.io/pod-group-name": "g", "kueue.x-k8s.io/queue-name": "q"},
            {"kueue.x-k8s.io/pod-group-total-count": "3"},
            [],
            ("ns/kueue/g", 3),
        ),
        (  # Kueue-admitted Job with parallelism 4 (the queue label is on the Job)
            {"batch.kubernetes.io/job-name": "kj"},
            {},
            [job("kj", 4, **{"kueue.x-k8s.io/queue-name": "team-q"})],
            ("ns/job/kj", 4),
        ),
        (  # indexed Job, parallelism 4
            {"batch.kubernetes.io/job-name": "ij"},
            {"batch.kubernetes.io/job-completion-index": "2"},
            [job("ij", 4)],
            ("ns/job/ij", 4),
        ),
        ({}, {"batch.kubernetes.io/job-completion-index": "0"}, [job("one", 1)], (None, None)),
        ({"batch.kubernetes.io/job-name": "plain"}, {}, [job("plain", 4)], (None, None)),
        ({"gpugap.io/gang": "mine", "gpugap.io/gang-size": "5"}, {}, [], ("ns/mine", 5)),
        ({}, {}, chain("ReplicaSet", "Deployment"), (None, None)),
    ],
)
def test_gang(
    labels: dict[str, str],
    annotations: dict[str, str],
    owners: list[Owner],
    want: tuple[str | None, int | None],
) -> None:
    assert gang_of("ns", labels, annotations, owners) == want


def template(gpus: str | None) -> dict[str, Any]:
    return {"spec": {"containers": [c(gpus)]}}


@pytest.mark.parametrize(
    ("kind", "spec", "want"),
    [
        (  # MPIJob: the launcher has no GPU and is not part of the GPU gang
            "MPIJob",
            {
                "mpiReplicaSpecs": {
                    "Launcher": {"replicas": 1, "template": template(None)},
                    "Worker": {"replicas": 4, "template": template("8")},
                }
            },
            4,
        ),
        ("PyTorchJob", {"pytorchReplicaSpecs": {"Master": {"template": template("1")}}}, 1),
        ("Job", {"parallelism": 4, "completions": 8, "template": template("1")}, 4),
        ("Job", {"parallelism": 4, "completions": 2, "template": template("1")}, 2),
        ("Job", {"parallelism": 4, "template": template(None)}, 0),
        (
            "JobSet",
            {
                "replicatedJobs": [
                    {
                        "replicas": 2,
                        "template": {"spec": {"parallelism": 4, "template": template("8")}},
                    },
                    {"replicas": 1, "template": {"spec": {"template": template(None)}}},
                ]
            },
            8,
        ),
        (
            "Job",
            {
                "tasks": [
                    {"replicas": 3, "template": template("1")},
                    {"replicas": 1, "template": template(None)},
                ]
            },
            3,
        ),
        ("Deployment", {"replicas": 3, "template": template("1")}, None),
    ],
)
def test_expected_gpu_pods_of_owners(kind: str, spec: dict[str, Any], want: int | None) -> None:
    assert expected_gpu_pods(kind, spec, RULE) == want


# --- termination reasons ------------------------------------------------------------------
BASE: dict[str, Any] = {
    "metadata": {"name": "p", "uid": "u"},
    "spec": {"restartPolicy": "Never"},
    "status": {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "c", "state": {"terminated": {"exitCode": 1, "reason": "Error",
             "startedAt": "2026-11-02T10:00:00Z", "finishedAt": "2026-11-02T11:00:00Z"}}}
        ],
    },
}  # fmt: skip


def pod(patch: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = merge_patch(copy.deepcopy(BASE), patch)
    return out


def disruption(reason: str) -> dict[str, Any]:
    cond = {"type": "DisruptionTarget", "status": "True", "reason": reason,
            "lastTransitionTime": "2026-11-02T10:59:00Z"}  # fmt: skip
    return {"status": {"conditions": [cond]}}


def deleting(at: str, grace: int = 30) -> dict[str, Any]:
    return {"metadata": {"deletionTimestamp": at, "deletionGracePeriodSeconds": grace}}


OOM = {"status": {"containerStatuses": [{"name": "c", "state": {"terminated": {
    "exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-02T11:00:00Z"}}}]}}  # fmt: skip


@pytest.mark.parametrize(
    ("patch", "want", "ended"),
    [
        ({}, "failed", "11:00:00"),
        ({"status": {"phase": "Succeeded"}}, "completed", "11:00:00"),
        (OOM, "oom_killed", "11:00:00"),
        (disruption("PreemptionByScheduler"), "preempted", "11:00:00"),
        (disruption("PreemptionByKubeScheduler"), "preempted", "11:00:00"),
        ({"status": {"reason": "Preempting"}}, "preempted", "11:00:00"),
        ({"status": {"reason": "Evicted"}}, "evicted", "11:00:00"),
        (disruption("EvictionByEvictionAPI"), "evicted", "11:00:00"),  # kubectl drain
        (disruption("DeletionByTaintManager"), "evicted", "11:00:00"),
        (disruption("TerminationByKubelet"), "evicted", "11:00:00"),
        (disruption("DeletionByPodGC"), "node_lost", "11:00:00"),  # its node is gone
        # containers stopped after the deletion request: the deletion ended it
        (deleting("2026-11-02T11:00:15Z"), "deleted", "11:00:00"),
        # finished before anyone asked: its own end (then deleted later)
        (merge_patch(OOM, deleting("2026-11-02T12:00:30Z")), "oom_killed", "11:00:00"),
        # restartPolicy Always: only a deletion ends it; GPUs held until the request
        (
            merge_patch({"spec": {"restartPolicy": "Always"}}, deleting("2026-11-02T12:00:30Z")),
            "deleted",
            "12:00:00",
        ),
    ],
)
def test_termination_reason_and_time(patch: dict[str, Any], want: str, ended: str) -> None:
    reason, when = termination(pod(patch))
    assert reason == TerminationReason(want)
    assert when is not None and when.strftime("%H:%M:%S") == ended


# --- the RBAC manifest --------------------------------------------------------------------
def test_rbac_is_read_only_and_covers_every_owner_the_producer_resolves() -> None:
    from pathlib import Path

    import yaml

    from gpugap.producers.kubernetes.owners import RESOLVABLE

    path = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes-producer-rbac.yaml"
    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ClusterRole")
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert set().union(*granted.values()) <= {"get", "list", "watch"}
    assert granted.pop(("", "pods")) == {"get", "list", "watch"}
    # the polled producers (kubernetes-capacity, kubernetes-queues) list these, read-only
    for listed in (("", "nodes"), ("kueue.x-k8s.io", "clusterqueues"),
                   ("kueue.x-k8s.io", "localqueues"), ("scheduling.run.ai", "queues"),
                   ("scheduling.volcano.sh", "queues")):  # fmt: skip
        assert granted.pop(listed) == {"get", "list", "watch"}, listed
    assert granted == {(group, plural): {"get"} for (group, _), plural in RESOLVABLE.items()}


# --- settings -----------------------------------------------------------------------------
def test_k8s_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpugap.schemas.errors import ConfigError

    monkeypatch.setenv("GPUGAP_K8S_NAMESPACES", "ml-train, serving")
    monkeypatch.setenv("GPUGAP_K8S_GPU_RESOURCE_PREFIXES", '["nvidia.com/mig-", "amd.com/"]')
    monkeypatch.setenv(
        "GPUGAP_K8S_CLASS_RULES", '[{"namespace": "dev-*", "workload_class": "interactive"}]'
    )
    monkeypatch.setenv("GPUGAP_K8S_REQUEST_TIMEOUT_S", "15")
    k8s = KubernetesSettings()
    assert k8s.namespaces == ["ml-train", "serving"]
    assert k8s.gpu_resource_prefixes == ["nvidia.com/mig-", "amd.com/"]
    assert k8s.class_rules == [ClassRule(namespace="dev-*", workload_class="interactive")]
    assert k8s.request_timeout_s == 15.0
    monkeypatch.setenv("GPUGAP_K8S_CLASS_RULES", '[{"namespace": "x", "workload_class": "idle"}]')
    with pytest.raises(ConfigError, match="GPUGAP_K8S_CLASS_RULES"):
        plugin("kubernetes").config()
