"""Node capacity (producers/kubernetes/capacity.py, capacity_producer.py): the effective-request
rule, GPU-equivalents, schedulability and bounds on hand-written objects, then the producer
against the real kube-apiserver, as its ServiceAccount under the shipped ClusterRole, with
expectations computed by hand from the objects the test created."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import Settings
from gpugap.producers import run_producer
from gpugap.producers.kubernetes.capacity import (
    GpuShares,
    PodUse,
    amount,
    effective_requests,
    node_capacity,
    pod_use,
    schedulable,
)
from gpugap.producers.kubernetes.capacity_producer import CapacityProducer
from gpugap.producers.kubernetes.gpu_resources import GPU_RESOURCES, MIG_PREFIX, MODEL_LABELS
from gpugap.producers.kubernetes.poll_settings import POOL_LABELS, CapacitySettings
from gpugap.schemas import decode
from gpugap.schemas.errors import FatalError
from gpugap.schemas.models import NodeAllocation, NodeCapacity
from gpugap.schemas.topics import DEAD_LETTER, NODE_CAPACITY
from gpugap.schemas.types import MAX_ALLOCATIONS_PER_NODE
from tests.harness.capture import Capture
from tests.harness.kube_apiserver import ApiError, KubeApiServer

SHARES = GpuShares.of(GPU_RESOURCES, [MIG_PREFIX], MODEL_LABELS)
T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MIB = 2**20
READY = [{"type": "Ready", "status": "True"}]


def c(name: str, restart: str | None = None, **requests: str) -> dict[str, Any]:
    # keyword names cannot hold '/': gpu= and mig_1g_10gb= stand for the NVIDIA resources
    named = {"gpu": "nvidia.com/gpu", "mig_1g_10gb": "nvidia.com/mig-1g.10gb"}
    res = {named.get(k, k): v for k, v in requests.items()}
    out: dict[str, Any] = {"name": name, "resources": {"requests": res}}
    if restart:
        out["restartPolicy"] = restart
    return out


def pod(
    uid: str, node: str | None, containers: list[dict[str, Any]], **spec: Any
) -> dict[str, Any]:
    phase = spec.pop("phase", "Running")
    body = {"containers": containers, **spec}
    if node:
        body["nodeName"] = node
    return {"metadata": {"uid": uid, "name": uid}, "spec": body, "status": {"phase": phase}}


def node(
    name: str, allocatable: dict[str, Any], *, labels: dict[str, str] | None = None,
    conditions: list[dict[str, str]] = READY, unschedulable: bool = False,
) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"allocatable": allocatable, "conditions": conditions},
    }


def capacity(n: dict[str, Any], pods: list[dict[str, Any]]) -> NodeCapacity | None:
    uses = [u for p in pods if (found := pod_use(p)) and (u := found[1])]
    report = node_capacity(n, uses, cluster="c1", time=T, interval_s=60.0, shares=SHARES,
                           pool_labels=POOL_LABELS)  # fmt: skip
    return report.record if report else None


# --- quantities and the effective-request rule ---------------------------------------------


def test_quantities_read_as_kubernetes_writes_them() -> None:
    assert amount("63500m") == 63.5
    assert amount("1Gi") == 2**30
    assert amount("1e3") == 1000.0
    assert amount("250M") == 250e6
    assert amount(8) == 8.0
    assert [amount(v) for v in ("", None, "x", True, "-1")] == [0.0, 0.0, 0.0, 0.0, 0.0]


def test_sidecar_before_an_init_container_adds_to_its_peak_and_overhead_adds_last() -> None:
    spec = {
        "initContainers": [c("mesh", "Always", cpu="250m", memory="128Mi"),
                           c("fetch", cpu="4", memory="2Gi")],
        "containers": [c("main", cpu="1", memory="1Gi", gpu="2"), c("log", cpu="500m")],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
    }  # fmt: skip
    # apps + sidecar: 1.75 CPU, 1152 Mi; init "fetch" beside the sidecar: 4.25 CPU, 2176 Mi;
    # the larger of each, plus the overhead
    assert effective_requests(spec) == {
        "cpu": 4.5,
        "memory": (2176 + 120) * MIB,
        "nvidia.com/gpu": 2.0,
    }


def test_init_container_before_the_sidecar_runs_alone() -> None:
    spec = {
        "initContainers": [c("fetch", cpu="4"), c("mesh", "Always", cpu="250m")],
        "containers": [c("main", cpu="1")],
    }
    assert effective_requests(spec) == {"cpu": 4.0}  # max(4, 1 + 0.25)


def test_limits_stand_for_missing_requests() -> None:
    spec = {
        "containers": [{"name": "m", "resources": {"limits": {"cpu": "2", "amd.com/gpu": "1"}}}]
    }
    assert effective_requests(spec) == {"cpu": 2.0, "amd.com/gpu": 1.0}


def test_only_bound_live_pods_hold_a_node() -> None:
    assert pod_use(pod("u1", None, [c("m", cpu="1")])) is None
    assert pod_use(pod("u2", "n", [c("m", cpu="1")], phase="Succeeded")) is None
    assert pod_use(pod("u3", "n", [c("m", cpu="1")], phase="Failed")) is None
    assert pod_use(pod("u4", "n", [c("m", cpu="1")], phase="Pending")) == (
        "n", PodUse("u4", {"cpu": 1.0}),
    )  # fmt: skip


# --- node records -----------------------------------------------------------------------------


def test_gpu_node_with_a_gpu_pod_and_a_cpu_only_pod() -> None:
    n = node("a100-1", {"cpu": "63500m", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"},
             labels={"eks.amazonaws.com/nodegroup": "train",
                     "node.kubernetes.io/instance-type": "p4d.24xlarge",
                     "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})  # fmt: skip
    pods = [
        pod("gpu", "a100-1", [c("m", cpu="8", memory="64Gi", gpu="2")]),
        pod("cpu", "a100-1", [c("m", cpu="500m", memory="256Mi")]),
        pod("done", "a100-1", [c("m", cpu="8", gpu="4")], phase="Succeeded"),
    ]
    assert capacity(n, pods) == NodeCapacity(
        cluster="c1", node="a100-1", time=T, interval_s=60.0, scheduler="kubernetes",
        source="kubernetes", pool="train", gpu_model="NVIDIA-A100-SXM4-80GB", gpus=8.0,
        cpus=63.5, memory_mib=512 * 1024.0, schedulable=True,
        allocations=(
            NodeAllocation(allocation_id="k8s/c1/cpu", gpus=0.0, cpus=0.5, memory_mib=256.0),
            NodeAllocation(allocation_id="k8s/c1/gpu", gpus=2.0, cpus=8.0, memory_mib=65536.0),
        ),
    )  # fmt: skip


def test_mig_mixed_strategy_counts_slices_as_shares_of_their_gpu() -> None:
    n = node("h100-mig", {"cpu": "96", "memory": "1Ti", "nvidia.com/mig-1g.10gb": "7",
                          "nvidia.com/mig-3g.40gb": "2"})  # fmt: skip
    got = capacity(n, [pod("s", "h100-mig", [c("m", mig_1g_10gb="1")])])
    assert got is not None
    assert got.gpus == pytest.approx(1 + 6 / 7)
    assert got.allocations[0].gpus == pytest.approx(1 / 7)
    a30 = capacity(node("a30", {"nvidia.com/mig-1g.6gb": "4"},
                        labels={"nvidia.com/gpu.product": "NVIDIA-A30"}), [])  # fmt: skip
    assert a30 is not None and a30.gpus == pytest.approx(1.0)  # the A30 has 4 slices


def test_mig_single_strategy_reads_the_profile_from_the_product_label() -> None:
    labels = {"nvidia.com/mig.strategy": "single",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}  # fmt: skip
    got = capacity(node("a100-single", {"nvidia.com/gpu": "28"}, labels=labels),
                   [pod("s", "a100-single", [c("m", gpu="1")])])  # fmt: skip
    assert got is not None
    assert got.gpus == pytest.approx(4.0)
    assert got.allocations[0].gpus == pytest.approx(1 / 7)


def test_cordoned_or_not_ready_nodes_are_not_schedulable() -> None:
    assert schedulable(node("n", {}))
    assert not schedulable(node("n", {}, unschedulable=True))
    assert not schedulable(node("n", {}, conditions=[{"type": "Ready", "status": "Unknown"}]))
    assert not schedulable(node("n", {}, conditions=[]))  # never reported Ready


def test_nodes_without_gpus_make_no_record() -> None:
    assert capacity(node("cpu", {"cpu": "64", "nvidia.com/gpu": "0"}), []) is None
    amd = capacity(node("mi300", {"amd.com/gpu": "8"}), [])
    assert amd is not None and amd.gpus == 8.0


def test_a_node_with_more_pods_than_a_record_lists_keeps_the_largest() -> None:
    n = node("big", {"cpu": "4096", "memory": "16Ti", "nvidia.com/gpu": "8"})
    uses = [PodUse(f"p{i:04d}", {"cpu": 1.0 + (i % 7)}) for i in range(MAX_ALLOCATIONS_PER_NODE)]
    uses += [PodUse(f"small{i}", {"cpu": 0.1}) for i in range(5)]
    uses.append(PodUse("gpu", {"nvidia.com/gpu": 1.0}))
    report = node_capacity(n, uses, cluster="c1", time=T, interval_s=60.0, shares=SHARES,
                           pool_labels=POOL_LABELS)  # fmt: skip
    assert report is not None
    kept = {a.allocation_id for a in report.record.allocations}
    assert len(kept) == MAX_ALLOCATIONS_PER_NODE and "k8s/c1/gpu" in kept
    assert sorted(report.left_out) == sorted(
        ["k8s/c1/small0", "k8s/c1/small1", "k8s/c1/small2", "k8s/c1/small3", "k8s/c1/small4",
         "k8s/c1/p1022"]  # the last of the 1-CPU pods by id: i % 7 == 0, largest id
    )  # fmt: skip


def test_the_producer_publishes_the_kept_and_dead_letters_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = CapacityProducer(Settings(cluster="c1"), CapacitySettings())
    n = node("big", {"cpu": "4096", "nvidia.com/gpu": "8"})
    uses = [PodUse(f"p{i:04d}", {"cpu": 1.0}) for i in range(MAX_ALLOCATIONS_PER_NODE + 2)]
    bad = node("x" * 300, {"nvidia.com/gpu": "1"})  # a name no record may carry
    monkeypatch.setattr(producer, "_read", lambda: ([n, bad], {"big": uses}, 0))
    out = Capture()
    asyncio.run(run_producer(producer, out, once=True))
    (record,) = [decode(NODE_CAPACITY, m[2]) for m in out.messages if m[0] == NODE_CAPACITY.name]
    assert len(record.allocations) == MAX_ALLOCATIONS_PER_NODE
    dead = sorted(
        (decode(DEAD_LETTER, m[2]) for m in out.messages if m[0] == DEAD_LETTER.name),
        key=lambda d: d.kind,
    )
    assert [(d.kind, d.source_topic) for d in dead] == [
        ("rejected", NODE_CAPACITY.name), ("schema", NODE_CAPACITY.name),
    ]  # fmt: skip
    assert "1026 pods" in dead[0].reason and "published the 1024 largest" in dead[0].reason


# --- against the real kube-apiserver -------------------------------------------------------

NS = "gpugap-capacity"


def _ensure(kube: KubeApiServer, doc: dict[str, Any], path: str | None = None) -> None:
    try:
        kube.admin.post(path, doc) if path else kube.apply(doc)
    except ApiError as exc:
        if exc.code != 409:
            raise


def _node(kube: KubeApiServer, name: str, labels: dict[str, str], allocatable: dict[str, str],
          *, ready: str = "True", unschedulable: bool = False) -> None:  # fmt: skip
    _ensure(kube, {"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": name, "labels": labels},
                   "spec": {"unschedulable": unschedulable}})  # fmt: skip
    ready_cond = {"type": "Ready", "status": ready, "reason": "KubeletReady"}
    status = {"capacity": allocatable, "allocatable": allocatable, "conditions": [ready_cond]}
    kube.admin.call("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                    content_type="application/merge-patch+json")  # fmt: skip


def _pod(kube: KubeApiServer, name: str, node: str | None, spec: dict[str, Any]) -> str:
    body = {**spec, **({"nodeName": node} if node else {})}
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": body}  # fmt: skip
    try:
        got = kube.admin.post(f"/api/v1/namespaces/{NS}/pods", doc)
    except ApiError as exc:
        if exc.code != 409:
            raise
        got = kube.admin.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    return str(got["metadata"]["uid"])


def _containers(*specs: tuple[str, dict[str, str]]) -> list[dict[str, Any]]:
    return [{"name": n, "image": "busybox", "resources": {"limits": r}} for n, r in specs]


def _run(kube: KubeApiServer, out: Path, **cfg: Any) -> Capture:
    kubeconfig = kube.kubeconfig(out.with_suffix(".kubeconfig"), cfg.pop("token", None))
    producer = CapacityProducer(
        Settings(cluster="real"), CapacitySettings(kubeconfig=kubeconfig, page_size=2, **cfg)
    )
    capture = Capture()
    asyncio.run(run_producer(producer, capture, once=True))
    return capture


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_capacity_from_a_real_apiserver(kube: KubeApiServer, tmp_path: Path) -> None:
    _ensure(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    _ensure(kube, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                   "metadata": {"name": "kata"}, "handler": "kata",
                   "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}}},
            "/apis/node.k8s.io/v1/runtimeclasses")  # fmt: skip
    _node(kube, "cap-a100", {"cloud.google.com/gke-nodepool": "a100-pool",
                             "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
          {"cpu": "63500m", "memory": "500Gi", "nvidia.com/gpu": "8", "pods": "110"})  # fmt: skip
    _node(kube, "cap-mig", {"karpenter.sh/nodepool": "mig"},
          {"cpu": "96", "memory": "1Ti", "nvidia.com/mig-1g.10gb": "7",
           "nvidia.com/mig-3g.40gb": "2"})  # fmt: skip
    _node(kube, "cap-cordoned", {}, {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
          unschedulable=True)  # fmt: skip
    _node(kube, "cap-notready", {}, {"cpu": "8", "memory": "64Gi", "amd.com/gpu": "2"},
          ready="False")  # fmt: skip
    _node(kube, "cap-cpu", {}, {"cpu": "64", "memory": "256Gi"})
    train = _pod(kube, "train", "cap-a100", {
        "runtimeClassName": "kata",
        "initContainers": [
            {"name": "mesh", "image": "busybox", "restartPolicy": "Always",
             "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
            {"name": "fetch", "image": "busybox",
             "resources": {"requests": {"cpu": "4", "memory": "2Gi"}}},
        ],
        "containers": _containers(("main", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}),
                                  ("log", {"cpu": "500m", "memory": "64Mi"})),
    })  # fmt: skip
    requests_only = {"name": "w", "image": "busybox",
                     "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}  # fmt: skip
    web = _pod(kube, "web", "cap-a100", {"containers": [requests_only]})
    slice_ = _pod(kube, "slice", "cap-mig",
                  {"containers": _containers(("m", {"nvidia.com/mig-1g.10gb": "1"}))})  # fmt: skip
    _pod(kube, "pending", None, {"containers": _containers(("m", {"nvidia.com/gpu": "1"}))})
    _pod(kube, "cpu-node", "cap-cpu", {"containers": _containers(("m", {"cpu": "1"}))})
    _pod(kube, "done", "cap-a100", {"containers": _containers(("m", {"nvidia.com/gpu": "4"}))})
    kube.admin.call("PATCH", f"/api/v1/namespaces/{NS}/pods/done/status",
                    {"status": {"phase": "Succeeded"}},
                    content_type="application/merge-patch+json")  # fmt: skip

    out = _run(kube, tmp_path / "cap")
    records = {r.node: r for m in out.messages if m[0] == NODE_CAPACITY.name
               if (r := decode(NODE_CAPACITY, m[2])).node.startswith("cap-")}  # fmt: skip
    assert not [m for m in out.messages if m[0] == DEAD_LETTER.name]
    assert sorted(records) == ["cap-a100", "cap-cordoned", "cap-mig", "cap-notready"]
    a100 = records["cap-a100"]
    assert (a100.pool, a100.gpu_model, a100.gpus, a100.cpus, a100.memory_mib, a100.schedulable) == (
        "a100-pool", "NVIDIA-A100-SXM4-80GB", 8.0, 63.5, 500 * 1024.0, True,
    )  # fmt: skip
    assert (a100.scheduler, a100.source, a100.interval_s) == ("kubernetes", "kubernetes", 60.0)
    # train: apps + sidecar 1.75 CPU / 1216 Mi, "fetch" beside the sidecar 4.25 / 2176 Mi,
    # plus the RuntimeClass overhead the apiserver put on the pod (250m, 120Mi)
    assert set(a100.allocations) == {
        NodeAllocation(allocation_id=f"k8s/real/{train}", gpus=2.0, cpus=4.5,
                       memory_mib=2176.0 + 120.0),
        NodeAllocation(allocation_id=f"k8s/real/{web}", gpus=0.0, cpus=0.5, memory_mib=256.0),
    }  # fmt: skip
    mig = records["cap-mig"]
    assert (mig.pool, mig.gpus) == ("mig", pytest.approx(1 + 6 / 7))
    (held,) = mig.allocations
    assert held.allocation_id == f"k8s/real/{slice_}"
    assert (held.gpus, held.cpus, held.memory_mib) == (pytest.approx(1 / 7), 0.0, 0.0)
    assert (records["cap-cordoned"].schedulable, records["cap-cordoned"].gpus) == (False, 4.0)
    assert (records["cap-notready"].schedulable, records["cap-notready"].gpus) == (False, 2.0)


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_role_without_nodes_stops_it_naming_the_rule(
    kube: KubeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _ensure(kube, {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "gpugap-nobody", "namespace": "gpugap"}})  # fmt: skip
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    token = kube.admin.post("/api/v1/namespaces/gpugap/serviceaccounts/gpugap-nobody/token", req)
    caplog.set_level(logging.ERROR)
    with pytest.raises(FatalError, match=r'apiGroups: \[""\], resources: \[nodes\]'):
        _run(kube, tmp_path / "nobody", token=token["status"]["token"])


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_amd_intel_and_gaudi_nodes_from_a_real_apiserver(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    """Other vendors' nodes, as their device plugins and labellers report them: an MI300X node
    in CPX-NPS4 under AMD's "single" naming (64 ``amd.com/gpu``, the partition mode in the
    labeller's label) and one mixing modes under "mixed" naming (5 SPX + 24 CPX partitions of
    3 GPUs), an Intel Max node (with the monitoring and GAS resources beside its GPUs, not
    devices), a Gaudi node. GPUs count in physical GPUs: a partition its share."""
    _ensure(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    mi300x = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
    _node(kube, "cap-v-cpx", {**mi300x, "amd.com/compute-memory-partition": "cpx_nps4"},
          {"cpu": "192", "memory": "2Ti", "amd.com/gpu": "64"})  # fmt: skip
    _node(kube, "cap-v-mixed", mi300x, {"cpu": "192", "memory": "2Ti",
          "amd.com/spx_nps1": "5", "amd.com/cpx_nps1": "24"})  # fmt: skip
    _node(kube, "cap-v-max", {}, {"cpu": "112", "memory": "1Ti", "gpu.intel.com/i915": "4",
          "gpu.intel.com/i915_monitoring": "1", "gpu.intel.com/millicores": "4000"})  # fmt: skip
    _node(kube, "cap-v-gaudi", {}, {"cpu": "160", "memory": "1Ti", "habana.ai/gaudi": "8"})
    cpx = _pod(kube, "v-cpx", "cap-v-cpx", {"containers": _containers(("m", {"amd.com/gpu": "2"}))})
    mixed = _pod(kube, "v-mixed", "cap-v-mixed",
                 {"containers": _containers(("m", {"amd.com/cpx_nps1": "1"}))})  # fmt: skip
    xpu = _pod(kube, "v-max", "cap-v-max", {"containers": _containers(
        ("m", {"gpu.intel.com/i915": "1", "gpu.intel.com/millicores": "1000"}),
        ("monitor", {"gpu.intel.com/i915_monitoring": "1"}))})  # fmt: skip

    out = _run(kube, tmp_path / "cap")
    records = {r.node: r for m in out.messages if m[0] == NODE_CAPACITY.name
               if (r := decode(NODE_CAPACITY, m[2])).node.startswith("cap-v-")}  # fmt: skip
    assert {n: (r.gpus, r.gpu_model) for n, r in records.items()} == {
        "cap-v-cpx": (pytest.approx(8.0), "AMD_Instinct_MI300X_OAM"),
        "cap-v-mixed": (pytest.approx(5 + 24 / 8), "AMD_Instinct_MI300X_OAM"),
        "cap-v-max": (4.0, None),
        "cap-v-gaudi": (8.0, None),
    }
    held = {a.allocation_id: a.gpus for r in records.values() for a in r.allocations}
    assert held == {
        f"k8s/real/{cpx}": pytest.approx(2 / 8),
        f"k8s/real/{mixed}": pytest.approx(1 / 8),
        f"k8s/real/{xpu}": 1.0,
    }
