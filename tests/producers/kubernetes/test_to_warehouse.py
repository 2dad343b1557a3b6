"""From the real kube-apiserver to the warehouse's figures: what the capacity, queue and pod
producers read off the API, stored by the ClickHouse sink, gives the hand-computed stranded
GPUs of a memory-heavy pod, and a Kueue ClusterQueue holding its 8 GPUs at 10 % use while its
cohort sibling waits with 3 workloads pending (docs/architecture.md#the-waste-beyond-idle).

The producers poll once; the API's objects do not change over the hour the figures cover, so
each poll is stored as the hour's sixty polls a minute apart, and the pod's events at the
hour's start (the API's own times are now)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings, Settings
from gpugap.producers import run_producer
from gpugap.producers.kubernetes.capacity_producer import CapacityProducer
from gpugap.producers.kubernetes.poll_settings import CapacitySettings, QueueSettings
from gpugap.producers.kubernetes.queues_producer import QueuesProducer
from gpugap.schemas import Record, decode
from gpugap.schemas.models import NodeCapacity, QueueQuota
from gpugap.schemas.topics import DEAD_LETTER, NODE_CAPACITY, QUEUE_QUOTAS
from gpugap.warehouse.client import connect
from tests.harness import queue_crds
from tests.harness.capture import Capture
from tests.harness.kube_apiserver import ApiError, KubeApiServer
from tests.producers.kubernetes.test_real import Producer
from tests.warehouse.test_lost_work import minutes
from tests.warehouse.test_views import store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
CLUSTER = "test"  # the pod producer's cluster in tests/harness/k8s_run.py


def _ensure(kube: KubeApiServer, doc: dict[str, Any]) -> None:
    try:
        kube.apply(doc)
    except ApiError as exc:
        if exc.code != 409:
            raise


def _node(kube: KubeApiServer, name: str, allocatable: dict[str, str]) -> None:
    _ensure(kube, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    status = {"capacity": allocatable, "allocatable": allocatable, "conditions": [ready]}
    kube.admin.call("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                    content_type="application/merge-patch+json")  # fmt: skip


def _pod(kube: KubeApiServer, ns: str, name: str, node: str, requests: dict[str, str], *,
         labels: dict[str, str] | None = None) -> str:  # fmt: skip
    doc = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
           "spec": {"nodeName": node, "containers": [
               {"name": "m", "image": "busybox", "resources": {"requests": requests,
                                                              "limits": requests}}]}}  # fmt: skip
    try:
        got = kube.admin.post(f"/api/v1/namespaces/{ns}/pods", doc)
    except ApiError as exc:
        if exc.code != 409:
            raise
        got = kube.admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return str(got["metadata"]["uid"])


def _poll(kube: KubeApiServer, out: Path, producer_of: Any) -> list[tuple[str, bytes]]:
    kubeconfig = kube.kubeconfig(out.with_suffix(".kubeconfig"))
    capture = Capture()
    asyncio.run(run_producer(producer_of(kubeconfig), capture, once=True))
    assert not [m for m in capture.messages if m[0] == DEAD_LETTER.name]
    return [(m[0], m[2]) for m in capture.messages]


def _hour(record: Record) -> list[Record]:
    """A poll as the hour's sixty, a minute apart."""
    return [record.model_copy(update={"time": T0 + timedelta(minutes=i), "interval_s": 60.0})
            for i in range(60)]  # fmt: skip


def _query(settings: ClickHouseSettings, sql: str) -> list[tuple[Any, ...]]:
    client = connect(settings)
    try:
        return [tuple(r) for r in client.query(sql).result_rows]
    finally:
        client.close()


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_memory_heavy_pod_strands_gpus_read_off_the_api(
    kube: KubeApiServer, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    """An 8-GPU node with 64 cores and 256 GiB; a pod with 2 GPUs, 8 cores and 192 GiB and a
    CPU-only pod with 4 cores and 2 GiB: 6 free GPUs, the free 62 GiB feed 62 x 8/256 =
    1.9375 of them: 4.0625 stranded by memory an hour, 4 the first pod's, 0.0625 the other's."""
    ns = "wh-capacity"
    _ensure(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    _node(kube, "wh-mem", {"cpu": "64", "memory": "256Gi", GPU: "8", "pods": "110"})
    heavy = _pod(kube, ns, "heavy", "wh-mem", {"cpu": "8", "memory": "192Gi", GPU: "2"})
    light = _pod(kube, ns, "cpu-only", "wh-mem", {"cpu": "4", "memory": "2Gi"})

    def producer(kubeconfig: Path) -> CapacityProducer:
        return CapacityProducer(Settings(cluster=CLUSTER), CapacitySettings(kubeconfig=kubeconfig))

    polled = [decode(NODE_CAPACITY, v) for t, v in _poll(kube, tmp_path / "c", producer)
              if t == NODE_CAPACITY.name]  # fmt: skip
    (node,) = [r for r in polled if r.node == "wh-mem"]
    assert isinstance(node, NodeCapacity)
    store(clickhouse, _hour(node))
    assert _query(clickhouse,
                  "SELECT round(sum(usable_free_gpu_h), 6), round(sum(stranded_cpu_gpu_h), 6), "
                  "round(sum(stranded_memory_gpu_h), 6) FROM v_stranded") == [
        (1.9375, 0.0, 4.0625)]  # fmt: skip
    assert _query(clickhouse,
                  "SELECT allocation_id, cause, round(sum(stranded_gpu_h), 6) "
                  "FROM v_stranded_by_allocation GROUP BY allocation_id, cause "
                  "ORDER BY 3 DESC") == [
        (f"k8s/{CLUSTER}/{heavy}", "memory", 4.0), (f"k8s/{CLUSTER}/{light}", "memory", 0.0625),
    ]  # fmt: skip


def _queues(kube: KubeApiServer) -> None:
    """Two ClusterQueues of one cohort entitled to 8 GPUs each: team-a holds all 8 (one
    workload admitted), team-b none with 3 pending; a LocalQueue in front of each."""
    queue_crds.install(kube)
    for ns in ("wh-a", "wh-b"):
        _ensure(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    queue_crds.create(kube, queue_crds.RESOURCE_FLAVOR, "wh-a100", {})
    for team, held, pending in (("a", "8", 0), ("b", "0", 3)):
        flavor = {"name": "wh-a100", "resources": [{"name": GPU, "nominalQuota": 8}]}
        spec = {"cohortName": "wh-research", "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": [GPU], "flavors": [flavor]}]}  # fmt: skip
        usage = [{"name": "wh-a100", "resources": [{"name": GPU, "total": held}]}]
        queue_crds.create(kube, queue_crds.CLUSTER_QUEUE, f"wh-team-{team}", spec,
                          status={"flavorsUsage": usage, "pendingWorkloads": pending,
                                  "admittedWorkloads": 1 - pending // 3})  # fmt: skip
        queue_crds.create(kube, queue_crds.LOCAL_QUEUE, f"wh-lq-{team}",
                          {"clusterQueue": f"wh-team-{team}"}, namespace=f"wh-{team}",
                          status={"flavorsUsage": usage, "pendingWorkloads": pending,
                                  "admittedWorkloads": 1 - pending // 3})  # fmt: skip


@pytest.mark.kube
@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_cluster_queue_at_ten_percent_while_its_sibling_waits(
    kube: KubeApiServer, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    _queues(kube)
    _node(kube, "wh-gpu", {"cpu": "64", "memory": "512Gi", GPU: "8", "pods": "110"})
    uid = _pod(kube, "wh-a", "train", "wh-gpu", {GPU: "8"},
               labels={"kueue.x-k8s.io/queue-name": "wh-lq-a"})  # fmt: skip

    async def pod_events() -> list[Record]:
        async with Producer(kube, tmp_path / "pods.jsonl", namespaces=["wh-a"]) as run:
            await run.synced()
        return [e for e in run.events() if e.uid == uid]

    events = asyncio.run(pod_events())
    assert events and {e.queue for e in events} == {"wh-lq-a"}
    pods = [e.model_copy(update={"time": T0, "created_time": T0 - timedelta(minutes=30)})
            for e in events]  # fmt: skip

    def producer(kubeconfig: Path) -> QueuesProducer:
        return QueuesProducer(Settings(cluster=CLUSTER), QueueSettings(kubeconfig=kubeconfig))

    polled = [decode(QUEUE_QUOTAS, v) for t, v in _poll(kube, tmp_path / "q", producer)
              if t == QUEUE_QUOTAS.name]  # fmt: skip
    # the session's apiserver holds other tests' queues too
    ours = [q for q in polled if isinstance(q, QueueQuota) and q.queue in
            ("wh-team-a", "wh-team-b", "wh-lq-a", "wh-lq-b")]  # fmt: skip
    assert len(ours) == 4
    alloc = f"k8s/{CLUSTER}/{uid}"
    busy = [m.model_copy(update={"cluster": CLUSTER, "node": "wh-gpu"})
            for m in minutes(alloc, tuple(range(8)), 0, 60, busy_s=6.0)]  # fmt: skip
    store(clickhouse, [*(r for q in ours for r in _hour(q)), *pods, *busy])
    got = _query(
        clickhouse,
        "SELECT kind, namespace, queue, any(parent), round(sum(entitled_gpu_h), 6), "
        "round(sum(reported_held_gpu_h), 6), round(sum(pending_workload_h), 6), "
        "round(sum(allocated_gpu_h), 6), round(sum(consumed_gpu_h), 6), "
        "round(sum(waited_gpu_h), 6), round(sum(unused_gpu_h), 6) FROM v_queue_quota_hourly "
        "GROUP BY kind, namespace, queue ORDER BY kind, namespace, queue",
    )
    assert got == [
        # all 8 held at 10 %: 0.8 of 8 GPU-hours consumed; its pod waited 30 min for 8 GPUs
        ("kueue_cluster_queue", "", "wh-team-a", "wh-research", 8.0, 8.0, 0.0, 8.0, 0.8, 4.0, 0.0),
        # entitled to 8, holding none while 3 workloads waited the hour
        ("kueue_cluster_queue", "", "wh-team-b", "wh-research", 8.0, 0.0, 3.0, 0.0, 0.0, 0.0, 8.0),
        ("kueue_local_queue", "wh-a", "wh-lq-a", "wh-team-a", 0.0, 8.0, 0.0, 8.0, 0.8, 4.0, 0.0),
        ("kueue_local_queue", "wh-b", "wh-lq-b", "wh-team-b", 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0),
    ]
