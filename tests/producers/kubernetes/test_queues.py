"""Queue quotas (producers/kubernetes/queues.py, queues_producer.py): Kueue, KAI and Volcano
queue objects shaped as their CRDs define them (tests/harness/crds/README.md names the tags),
first as dicts, then as real objects in the real kube-apiserver with the managers' real CRDs,
their status written through the status subresource, read by the producer as its
ServiceAccount under the shipped ClusterRole. Expectations are computed by hand."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import Settings
from gpugap.producers import run_producer
from gpugap.producers.kubernetes import queues_producer
from gpugap.producers.kubernetes.capacity import GpuShares
from gpugap.producers.kubernetes.gpu_resources import GPU_RESOURCES, MIG_PREFIX
from gpugap.producers.kubernetes.poll_settings import QueueSettings
from gpugap.producers.kubernetes.queues import (
    Poll,
    kai_queue,
    kueue_cluster_queue,
    kueue_local_queue,
    pod_queue,
    volcano_queue,
)
from gpugap.producers.kubernetes.queues_producer import QueuesProducer
from gpugap.schemas import decode
from gpugap.schemas.models import QueueQuota
from gpugap.schemas.topics import DEAD_LETTER, QUEUE_QUOTAS
from tests.harness import queue_crds
from tests.harness.capture import Capture
from tests.harness.kube_apiserver import ApiError, KubeApiServer

GPU = "nvidia.com/gpu"
POLL = Poll("c1", datetime(2026, 3, 1, 12, 0, tzinfo=UTC), 60.0,
            GpuShares.of(GPU_RESOURCES, [MIG_PREFIX], ()))  # fmt: skip
Row = tuple[str, str | None, str, str | None, str]


def rows(records: list[QueueQuota]) -> dict[Row, dict[str, Any]]:
    """(kind, namespace, queue, flavor, resource) -> what else the record says."""
    same = {"kind", "namespace", "queue", "flavor", "resource", "cluster", "time", "interval_s"}
    return {
        (r.kind.value, r.namespace, r.queue, r.flavor, r.resource): r.model_dump(exclude=same)
        for r in records
    }


def q(
    entitled: float | None = None, limit: float | None = None, held: float | None = None,
    borrowed: float | None = None, *, pending: int | None = None, admitted: int | None = None,
    parent: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {"parent": parent, "entitled_gpus": entitled, "limit_gpus": limit, "held_gpus": held,
            "borrowed_gpus": borrowed, "pending_workloads": pending,
            "admitted_workloads": admitted}  # fmt: skip


# --- the pod's queue --------------------------------------------------------------------------


def test_pod_queue_kueue_then_kai_then_volcano() -> None:
    both = {"kueue.x-k8s.io/queue-name": "lq", "kai.scheduler/queue": "kq"}
    assert pod_queue(both, {}) == "lq"
    assert pod_queue({"kai.scheduler/queue": "kq", "runai/queue": "old"}, {}) == "kq"
    assert pod_queue({"runai/queue": "old"}, {}) == "old"
    assert pod_queue({}, {"scheduling.volcano.sh/queue-name": "vq"}) == "vq"
    assert pod_queue({"volcano.sh/queue-name": "vjob"}, {}) == "vjob"  # Volcano Job's pods
    assert pod_queue({}, {"scheduling.volcano.sh/queue-name": "two words"}) is None
    assert pod_queue({}, {"scheduling.volcano.sh/queue-name": "a/b"}) is None
    assert pod_queue({}, {}) is None


# --- Kueue ------------------------------------------------------------------------------------

CQ_SPEC = {
    "cohortName": "research",
    "resourceGroups": [
        {"coveredResources": ["cpu", GPU],
         "flavors": [{"name": "a100", "resources": [{"name": "cpu", "nominalQuota": "64"},
                                                    {"name": GPU, "nominalQuota": 8,
                                                     "borrowingLimit": "4"}]},
                     {"name": "h100", "resources": [{"name": "cpu", "nominalQuota": "32"},
                                                    {"name": GPU, "nominalQuota": "2"}]}]},
        {"coveredResources": ["nvidia.com/mig-1g.10gb"],
         "flavors": [{"name": "mig", "resources": [{"name": "nvidia.com/mig-1g.10gb",
                                                    "nominalQuota": "14"}]}]},
    ],
}  # fmt: skip
CQ_STATUS = {
    "flavorsUsage": [
        {"name": "a100", "resources": [{"name": "cpu", "total": "10", "borrowed": "0"},
                                       {"name": GPU, "total": "10", "borrowed": "2"}]},
        {"name": "h100", "resources": [{"name": "cpu", "total": "0", "borrowed": "0"},
                                       {"name": GPU, "total": "0", "borrowed": "0"}]},
        {"name": "mig", "resources": [{"name": "nvidia.com/mig-1g.10gb", "total": "7",
                                       "borrowed": "0"}]},
    ],
    "pendingWorkloads": 3,
    "admittedWorkloads": 2,
}  # fmt: skip
CQ_ROWS: dict[Row, dict[str, Any]] = {
    # nominal 8, borrowingLimit 4: at most 12; 10 held of which 2 borrowed
    ("kueue_cluster_queue", None, "team-a", "a100", GPU):
        q(8.0, 12.0, 10.0, 2.0, pending=3, admitted=2, parent="research"),
    # no borrowingLimit: no fixed most
    ("kueue_cluster_queue", None, "team-a", "h100", GPU):
        q(2.0, None, 0.0, 0.0, pending=3, admitted=2, parent="research"),
    # 14 slices of 1/7 GPU: 2 GPUs entitled, 7 slices held: 1 GPU
    ("kueue_cluster_queue", None, "team-a", "mig", "nvidia.com/mig-1g.10gb"):
        q(2.0, None, 1.0, 0.0, pending=3, admitted=2, parent="research"),
}  # fmt: skip
LQ_STATUS = {
    "flavorsUsage": [{"name": "a100", "resources": [{"name": "cpu", "total": "4"},
                                                    {"name": GPU, "total": "6"}]}],
    "pendingWorkloads": 1,
    "admittedWorkloads": 1,
}  # fmt: skip
LQ_ROWS: dict[Row, dict[str, Any]] = {
    ("kueue_local_queue", "ml", "lq-a", "a100", GPU): q(held=6.0, pending=1, admitted=1,
                                                         parent="team-a"),
    # its ClusterQueue covers these; its usage does not list them: not stated
    ("kueue_local_queue", "ml", "lq-a", "h100", GPU): q(pending=1, admitted=1, parent="team-a"),
    ("kueue_local_queue", "ml", "lq-a", "mig", "nvidia.com/mig-1g.10gb"):
        q(pending=1, admitted=1, parent="team-a"),
}  # fmt: skip
COVERED = {"team-a": [("a100", GPU), ("h100", GPU), ("mig", "nvidia.com/mig-1g.10gb")]}


def test_kueue_cluster_queue_per_flavor_and_gpu_resource() -> None:
    cq = {"metadata": {"name": "team-a"}, "spec": CQ_SPEC, "status": CQ_STATUS}
    assert rows(kueue_cluster_queue(cq, POLL)) == CQ_ROWS


def test_kueue_v1beta1_spellings_and_no_status() -> None:
    spec = {**{k: v for k, v in CQ_SPEC.items() if k != "cohortName"}, "cohort": "old"}
    got = rows(kueue_cluster_queue({"metadata": {"name": "team-a"}, "spec": spec}, POLL))
    assert got[("kueue_cluster_queue", None, "team-a", "a100", GPU)] == q(8.0, 12.0, parent="old")
    v1beta1_status = {
        ("flavorUsage" if k == "flavorsUsage" else k): v for k, v in LQ_STATUS.items()
    }
    lq = {"metadata": {"name": "lq-a", "namespace": "ml"}, "spec": {"clusterQueue": "team-a"},
          "status": v1beta1_status}  # fmt: skip
    assert rows(kueue_local_queue(lq, POLL, COVERED)) == LQ_ROWS


def test_kueue_local_queue_takes_its_cluster_queues_flavors() -> None:
    lq = {"metadata": {"name": "lq-a", "namespace": "ml"}, "spec": {"clusterQueue": "team-a"},
          "status": LQ_STATUS}  # fmt: skip
    assert rows(kueue_local_queue(lq, POLL, COVERED)) == LQ_ROWS
    # its ClusterQueue unknown: what its usage shows
    assert list(rows(kueue_local_queue(lq, POLL, {}))) == [
        ("kueue_local_queue", "ml", "lq-a", "a100", GPU)
    ]


# --- KAI and Volcano --------------------------------------------------------------------------

KAI_SPEC = {"parentQueue": "root", "resources": {
    "gpu": {"quota": 16, "limit": -1, "overQuotaWeight": 1},
    "cpu": {"quota": 64000, "limit": -1, "overQuotaWeight": 1},
    "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}  # fmt: skip
KAI_ROOT_SPEC = {"resources": {"gpu": {"quota": -1, "limit": 64, "overQuotaWeight": 1}}}


def test_kai_queue_quota_limit_and_allocated() -> None:
    research = {"metadata": {"name": "research"}, "spec": KAI_SPEC,
                "status": {"allocated": {GPU: "3500m", "cpu": "12"}}}  # fmt: skip
    assert rows(kai_queue(research, POLL)) == {
        ("kai_queue", None, "research", None, GPU): q(16.0, None, 3.5, parent="root")
    }
    root = {"metadata": {"name": "root"}, "spec": KAI_ROOT_SPEC}
    assert rows(kai_queue(root, POLL)) == {("kai_queue", None, "root", None, GPU): q(None, 64.0)}
    assert kai_queue({"metadata": {"name": "cpu-only"}, "spec": {"resources": {}}}, POLL) == []


VOLCANO_SPEC = {"parent": "root", "weight": 1, "reclaimable": True,
                "deserved": {GPU: "4", "cpu": "32"}, "capability": {GPU: 8, "cpu": "64"},
                "guarantee": {"resource": {GPU: "2", "amd.com/gpu": "1"}}}  # fmt: skip
VOLCANO_STATUS = {"allocated": {GPU: "3", "cpu": "10"}, "pending": 2, "inqueue": 1,
                  "running": 3, "state": "Open"}  # fmt: skip
VOLCANO_ROWS: dict[Row, dict[str, Any]] = {
    ("volcano_queue", None, "vq", None, GPU): q(4.0, 8.0, 3.0, pending=2, admitted=4,
                                                parent="root"),
    # no deserved: the guarantee; not in allocated: holds none
    ("volcano_queue", None, "vq", None, "amd.com/gpu"): q(1.0, None, 0.0, pending=2,
                                                          admitted=4, parent="root"),
}  # fmt: skip


def test_volcano_queue_deserved_guarantee_capability_allocated() -> None:
    vq = {"metadata": {"name": "vq"}, "spec": VOLCANO_SPEC, "status": VOLCANO_STATUS}
    assert rows(volcano_queue(vq, POLL)) == VOLCANO_ROWS
    bare = rows(volcano_queue({"metadata": {"name": "vq"}, "spec": VOLCANO_SPEC}, POLL))
    assert bare[("volcano_queue", None, "vq", None, GPU)] == q(4.0, 8.0, parent="root")


# --- against the real kube-apiserver -------------------------------------------------------


def _run(kube: KubeApiServer, out: Path, token: str | None = None) -> list[QueueQuota]:
    kubeconfig = kube.kubeconfig(out.with_suffix(".kubeconfig"), token)
    cfg = QueueSettings(kubeconfig=kubeconfig, page_size=1)  # paged: one object a page
    producer = QueuesProducer(Settings(cluster="c1"), cfg)
    capture = Capture()
    asyncio.run(run_producer(producer, capture, once=True))
    assert not [m for m in capture.messages if m[0] == DEAD_LETTER.name]
    return [decode(QUEUE_QUOTAS, m[2]) for m in capture.messages if m[0] == QUEUE_QUOTAS.name]


def _nobody(kube: KubeApiServer) -> str:
    """A token of a ServiceAccount bound to nothing."""
    try:
        kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "gpugap-nobody", "namespace": "gpugap"}})  # fmt: skip
    except ApiError as exc:
        if exc.code != 409:
            raise
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    got = kube.admin.post("/api/v1/namespaces/gpugap/serviceaccounts/gpugap-nobody/token", req)
    return str(got["status"]["token"])


@pytest.fixture(scope="module")
def queues(kube: KubeApiServer) -> KubeApiServer:
    """The managers' CRDs and one queue of each kind, with status, as their controllers write."""
    queue_crds.install(kube)
    try:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    except ApiError as exc:
        if exc.code != 409:
            raise
    create = queue_crds.create
    for flavor in ("a100", "h100", "mig"):
        create(kube, queue_crds.RESOURCE_FLAVOR, flavor, {})
    create(kube, queue_crds.CLUSTER_QUEUE, "team-a", {**CQ_SPEC, "namespaceSelector": {}},
           status=CQ_STATUS)  # fmt: skip
    create(kube, queue_crds.LOCAL_QUEUE, "lq-a", {"clusterQueue": "team-a"}, namespace="ml",
           status=LQ_STATUS)  # fmt: skip
    create(kube, queue_crds.KAI_QUEUE, "research", KAI_SPEC,
           status={"allocated": {GPU: "3500m", "cpu": "12"}})  # fmt: skip
    create(kube, queue_crds.KAI_QUEUE, "root", KAI_ROOT_SPEC)
    create(kube, queue_crds.VOLCANO_QUEUE, "vq", VOLCANO_SPEC, status=VOLCANO_STATUS)
    return kube


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_queue_quotas_from_real_crds(queues: KubeApiServer, tmp_path: Path) -> None:
    got = rows(_run(queues, tmp_path / "q"))
    want: dict[Row, dict[str, Any]] = {**CQ_ROWS, **LQ_ROWS, **VOLCANO_ROWS,
            ("kai_queue", None, "research", None, GPU): q(16.0, None, 3.5, parent="root"),
            ("kai_queue", None, "root", None, GPU): q(None, 64.0)}  # fmt: skip
    assert got == want


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_role_without_queues_logs_the_rules_it_needs(
    queues: KubeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=queues_producer.__name__)
    assert _run(queues, tmp_path / "nobody", _nobody(queues)) == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for rule in ('apiGroups: ["kueue.x-k8s.io"], resources: [clusterqueues]',
                 'apiGroups: ["kueue.x-k8s.io"], resources: [localqueues]',
                 'apiGroups: ["scheduling.run.ai"], resources: [queues]',
                 'apiGroups: ["scheduling.volcano.sh"], resources: [queues]'):  # fmt: skip
        assert any(rule in e for e in errors), (rule, errors)


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_manager_not_installed_is_skipped_quietly(
    kube: KubeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(queues_producer, "KINDS", (("queues.not-installed.example", "queues"),))
    caplog.set_level(logging.DEBUG, logger=queues_producer.__name__)
    assert _run(kube, tmp_path / "none") == []
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
    assert "queues.not-installed.example not served" in caplog.records[0].getMessage()
