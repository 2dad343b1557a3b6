"""The Kubernetes producer against a real kube-apiserver and etcd (tests/harness/kube_apiserver.py),
authenticated as its own ServiceAccount bound to the shipped ClusterRole
(deploy/kubernetes-producer-rbac.yaml) — so the shipped RBAC is shown to be enough, and the
write verbs are refused to it.

The test writes through the API as a kubelet and scheduler would (there are none): pods
created with owner references to real Deployments/ReplicaSets/Jobs/StatefulSets and custom
resources (Notebook, PyTorchJob), bound through ``pods/binding``, their status patched
Pending -> Running -> Succeeded/Failed, deleted with and without grace. Every object version
the API answered with is kept (``World``); the events the producer publishes are checked
against them: exactly the transitions the API showed (nothing invented, nothing lost, nothing
twice), each with the resourceVersion, node and time of the object version that showed it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.producers import run_producer
from gpugap.producers.kubernetes.bounds import LIMITS
from gpugap.producers.kubernetes.producer import KubernetesProducer
from gpugap.schemas import K8sPodEvent
from tests.harness.k8s_run import read_dead_letters, read_events, settings_for
from tests.harness.kube_apiserver import Api, ApiError, KubeApiServer, crd, touch_sentinel

pytestmark = [
    pytest.mark.kube,
    pytest.mark.timeout(1800),  # the first test may build the binaries (minutes)
    # the apiserver's self-signed serving certificate (kubeconfig insecure-skip-tls-verify)
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
SYNC_NS = "gpugap-sync"


def now_s() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse(t: str | None) -> datetime | None:
    return datetime.fromisoformat(t.replace("Z", "+00:00")) if t else None


# --- the test's side: writes through the API, every version it answered with ---------------


class World:
    def __init__(self, kube: KubeApiServer, ns: str, api: Api | None = None) -> None:
        self.kube, self.ns = kube, ns
        self.api = api or kube.admin
        self.versions: dict[str, list[dict[str, Any]]] = {}  # uid -> versions, in order
        self.uids: dict[str, str] = {}  # name -> uid
        self.expect: dict[str, dict[str, Any]] = {}  # name -> fields every event must carry
        self.reasons: dict[str, dict[str, str]] = {}  # name -> {kind: reason}
        self.deleted: dict[str, tuple[datetime, datetime, dict[str, Any]]] = {}
        #: pods that existed when the producer started: it saw the version its list showed
        self.listed: set[str] = set()
        #: pods that ended and went while the producer could not watch (after a 410 nothing
        #: shows their last versions: the relist finds them gone, and says deleted, now)
        self.unseen_end: set[str] = set()
        ensure(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def use(self, api: Api) -> None:
        """Write through another apiserver from now on (a peer on the same etcd)."""
        self.api = api

    def _pods(self, name: str = "", sub: str = "") -> str:
        path = f"/api/v1/namespaces/{self.ns}/pods"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def _record(self, obj: dict[str, Any]) -> dict[str, Any]:
        uid = obj["metadata"]["uid"]
        self.uids[obj["metadata"]["name"]] = uid
        self.versions.setdefault(uid, []).append(obj)
        return obj

    def owner(
        self, kind: str, api_version: str, name: str, spec: dict[str, Any], *,
        owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        meta: dict[str, Any] = {"name": name, "namespace": self.ns, "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [ref(owner)]
        doc = {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}
        created: dict[str, Any] = self.kube.apply(doc, self.api)
        return created

    def pod(
        self, name: str, *, gpus: int = 1, resource: str = GPU, of: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        restart: str = "Never", node: str | None = None, **expect: Any,
    ) -> dict[str, Any]:  # fmt: skip
        """Create a pod (owned by ``of``); ``expect``: what each of its events must carry."""
        limits: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
        if gpus:
            limits[resource] = str(gpus)
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "image": IMAGE, "resources": {"limits": limits}}],
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 30,
        }
        if node:
            spec["nodeName"] = node
        meta: dict[str, Any] = {"name": name, "namespace": self.ns}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        if of:
            meta["ownerReferences"] = [ref(of)]
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        self.expect[name] = {"gpus": gpus, **expect} if gpus else {}
        return self._record(self.api.post(self._pods(), doc))

    def bind(self, name: str, node: str) -> dict[str, Any]:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        self.api.post(self._pods(name, "binding"), binding)  # answers a Status
        return self._record(self.api.get(self._pods(name)))

    def status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        obj = self.api.call(
            "PATCH", self._pods(name, "status"), {"status": status},
            content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
        return self._record(obj)

    def running(self, name: str) -> dict[str, Any]:
        t = now_s()
        return self.status(name, {
            "phase": "Running", "startTime": t,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": t}],
            "containerStatuses": [container("main", {"running": {"startedAt": t}}, ready=True)],
        })  # fmt: skip

    def finished(self, name: str, phase: str, exit_code: int = 0, why: str = "Completed",
                 ran: bool = True) -> dict[str, Any]:  # fmt: skip
        t = now_s()
        last = self.versions[self.uids[name]][-1]
        started = None
        for cs in last.get("status", {}).get("containerStatuses") or ():
            started = (cs.get("state", {}).get("running") or {}).get("startedAt")
        term: dict[str, Any] = {"exitCode": exit_code, "reason": why, "finishedAt": t}
        if ran:
            term["startedAt"] = started or t
        state = {"terminated": term}
        return self.status(name, {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": t}],
            "containerStatuses": [container("main", state, ready=False)],
        })  # fmt: skip

    def noise(self, name: str) -> dict[str, Any]:
        """A status change that matters to nobody (a probe flapping)."""
        return self.status(
            name,
            {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": now_s(),
                        "message": "ok",
                    }
                ]
            },
        )

    def delete(self, name: str, grace: int | None = None) -> dict[str, Any]:
        before = datetime.now(UTC).replace(microsecond=0)
        obj = self.api.delete(self._pods(name), grace)
        after = datetime.now(UTC) + timedelta(seconds=1)
        if obj.get("kind") == "Pod" and obj["metadata"].get("deletionTimestamp") and grace != 0:
            still = self._exists(name)
            if still:  # graceful: the API set deletionTimestamp; the kubelet finishes it
                return self._record(obj)
        self.deleted[self.uids[name]] = (before, after, obj)
        return obj

    def _exists(self, name: str) -> bool:
        try:
            self.api.get(self._pods(name))
            return True
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise

    def reason(self, name: str, **kinds: str) -> None:
        self.reasons[name] = kinds


def container(name: str, state: dict[str, Any], ready: bool) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "imageID": "", "ready": ready, "restartCount": 0,
            "started": ready, "state": state}  # fmt: skip


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True,
            "blockOwnerDeletion": True}  # fmt: skip


def ensure(kube: KubeApiServer, doc: dict[str, Any]) -> None:
    try:
        kube.apply(doc)
    except ApiError as exc:
        if exc.code != 409:
            raise


def template(gpus: int, restart: str = "Never", labels: dict[str, str] | None = None) -> Any:
    labels = labels or {"app": "x"}
    return {
        "metadata": {"labels": labels},
        "spec": {
            "restartPolicy": restart,
            "containers": [
                {"name": "main", "image": IMAGE, "resources": {"limits": {GPU: str(gpus)}}}
            ],
        },
    }


def install_crds(kube: KubeApiServer) -> None:
    for group, kind, plural in (("kubeflow.org", "Notebook", "notebooks"),
                                ("kubeflow.org", "PyTorchJob", "pytorchjobs")):  # fmt: skip
        ensure(kube, crd(group, kind, plural))
        deadline = time.monotonic() + 30
        while True:
            got = kube.admin.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}"
            )
            status = got.get("status") or {}
            conds = {c["type"]: c["status"] for c in status.get("conditions") or ()}
            if conds.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {plural}.{group} not established"
            time.sleep(0.1)
        deadline = time.monotonic() + 30
        while True:  # served (discovery) as well
            try:
                kube.admin.get(f"/apis/{group}/v1/{plural}?limit=1")
                break
            except ApiError:
                assert time.monotonic() < deadline
                time.sleep(0.2)


def nodes(kube: KubeApiServer) -> None:
    """GPU nodes, as the device plugin reports them (status.capacity/allocatable)."""
    for name, res in (("gpu-a100-01", {GPU: "8"}), ("gpu-a100-02", {GPU: "8"}),
                      ("gpu-h100-mig", {MIG: "7", "nvidia.com/mig-3g.40gb": "2"}),
                      ("cpu-01", {})):  # fmt: skip
        ensure(kube, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                      "labels": {"nvidia.com/gpu.present": str(bool(res)).lower()}}})  # fmt: skip
        cap = {"cpu": "96", "memory": "1Ti", "pods": "110", **res}
        kube.admin.call(
            "PATCH", f"/api/v1/nodes/{name}/status",
            {"status": {"capacity": cap, "allocatable": cap}},
            content_type="application/merge-patch+json",
        )  # fmt: skip


# --- the producer's side --------------------------------------------------------------------


class Producer:
    """``async with Producer(kube, out) as run:`` the producer, as its ServiceAccount;
    ``await run.synced(world)`` waits until it has read every pod change made so far (a
    sentinel pod is touched; once the producer's flushed resourceVersion reaches it, every
    earlier pod event has been read: a watch delivers in order)."""

    def __init__(self, kube: KubeApiServer, out: Path, **k8s: Any) -> None:
        self.kube, self.out = kube, out
        kubeconfig = kube.kubeconfig(out.with_suffix(".kubeconfig"))
        self.producer = KubernetesProducer(*settings_for(kubeconfig, **k8s))
        self.namespaces = k8s.get("namespaces") or [""]
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] | None = None

    async def __aenter__(self) -> Producer:
        self.task = asyncio.create_task(
            run_producer(self.producer, JsonlPublisher(self.out), stop=self.stop)
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 60)

    async def synced(self, api: Api | None = None, timeout: float = 60.0) -> None:
        api = api or self.kube.admin
        for ns in self.namespaces:
            target = await asyncio.to_thread(touch_sentinel, api, ns or SYNC_NS)
            deadline = time.monotonic() + timeout
            while int(self.producer.synced_rv.get(ns, "0") or 0) < target:
                assert self.task is not None
                if self.task.done():
                    self.task.result()
                    raise AssertionError("the producer stopped")
                assert time.monotonic() < deadline, (
                    f"not synced in {ns or 'all'}: producer at {self.producer.synced_rv}, "
                    f"sentinel at {target}"
                )
                await asyncio.sleep(0.05)

    def events(self) -> list[K8sPodEvent]:
        return read_events(self.out)


# --- the check: the events against what the API did ----------------------------------------


def expected(world: World) -> dict[tuple[str, str], dict[str, Any]]:
    """(uid, kind) -> what the event must say, from the versions the API answered with."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for uid, versions in world.versions.items():
        name = versions[0]["metadata"]["name"]
        if not world.expect.get(name):
            continue  # no GPUs: no event, ever
        bound = False
        for v in versions:
            spec, status = v.get("spec", {}), v.get("status", {})
            rv = int(v["metadata"]["resourceVersion"])
            node = spec.get("nodeName")
            phase = status.get("phase")
            if node and not bound:
                bound = True
                sched = [c for c in status.get("conditions") or () if c["type"] == "PodScheduled"]
                when = (
                    parse(sched[0]["lastTransitionTime"])
                    if sched
                    else parse(status.get("startTime"))
                )
                out[uid, "bound"] = {"rv": rv, "node": node, "time": when}
            started = [
                parse(st["startedAt"])
                for cs in status.get("containerStatuses") or ()
                for st in (cs.get("state") or {}).values() if st.get("startedAt")
            ]  # fmt: skip
            ran = phase == "Running" or (phase in ("Succeeded", "Failed") and started)
            if bound and ran and (uid, "running") not in out:
                out[uid, "running"] = {
                    "rv": rv,
                    "node": node,
                    "time": min(started) if started else None,
                }
            if name in world.unseen_end and uid in world.deleted:
                continue  # its end: not observable (checked below, the deletion only)
            if bound and phase in ("Succeeded", "Failed") and (uid, "terminated") not in out:
                ends = [parse(st.get("finishedAt")) for cs in status.get("containerStatuses") or ()
                        for st in (cs.get("state") or {}).values()
                        if st.get("finishedAt")]  # fmt: skip
                end = max(e for e in ends if e) if ends else None
                meta = v["metadata"]
                if meta.get("deletionTimestamp") and end is not None:
                    asked = parse(meta["deletionTimestamp"]) - timedelta(
                        seconds=int(meta.get("deletionGracePeriodSeconds") or 0)
                    )
                    end = max(end, asked)
                out[uid, "terminated"] = {"rv": rv, "node": node, "time": end}
        if uid in world.deleted and bound:
            before, after, obj = world.deleted[uid]
            meta = obj["metadata"]
            asked = None
            if meta.get("deletionTimestamp"):
                asked = parse(meta["deletionTimestamp"]) - timedelta(
                    seconds=int(meta.get("deletionGracePeriodSeconds") or 0)
                )
            ended = out.get((uid, "terminated"), {}).get("time")
            times = [t for t in (asked, ended) if t]
            if name in world.unseen_end:  # the relist's "now"
                times, after = [], datetime.now(UTC)
            out[uid, "deleted"] = {"rv": None, "window": (before, after),
                                   "time": max(times) if times else None}  # fmt: skip
    return out


def check(world: World, events: list[K8sPodEvent], *, exact_rv: bool = True,
          cluster: str = "test") -> dict[str, list[str]]:  # fmt: skip
    """The producer's events in ``world.ns`` are exactly the transitions the API showed."""
    mine = [e for e in events if e.namespace == world.ns]
    ids = [e.event_id for e in mine]
    by_id: dict[str, K8sPodEvent] = {}
    for e in mine:  # the same id twice must be the same event (downstream dedupes by id)
        if e.event_id in by_id:
            first = by_id[e.event_id]
            assert (first.time, first.kind, first.node, first.reason) == (
                e.time,
                e.kind,
                e.node,
                e.reason,
            ), f"{e.event_id} twice, differently"
        by_id.setdefault(e.event_id, e)
    want = expected(world)
    got = {(e.uid, e.kind.value): e for e in by_id.values()}
    names = {uid: v[0]["metadata"]["name"] for uid, v in world.versions.items()}
    have_kinds = sorted((names.get(u, u), k) for u, k in got)
    want_kinds = sorted((names[u], k) for u, k in want)
    assert have_kinds == want_kinds, (
        f"extra: {sorted(set(have_kinds) - set(want_kinds))}, "
        f"missing: {sorted(set(want_kinds) - set(have_kinds))}"
    )
    order = ["bound", "running", "terminated", "deleted"]
    per_pod: dict[str, list[str]] = {}
    for e in mine:
        if e.event_id not in ids[: ids.index(e.event_id)]:
            per_pod.setdefault(names[e.uid], []).append(e.kind.value)
    for name, kinds in per_pod.items():
        assert kinds == sorted(kinds, key=order.index), (name, kinds)
    for (uid, kind), x in want.items():
        e, name = got[uid, kind], names[uid]
        assert e.event_id == f"k8s/{cluster}/{uid}/{kind}"
        assert e.name == name and e.cluster == cluster
        for field, value in world.expect[name].items():
            have = getattr(e, field)
            assert (have.value if hasattr(have, "value") else have) == value, (name, kind, field)
        if kind != "deleted":
            assert e.node == x["node"], (name, kind)
            rv = int(e.resource_version or 0)
            versions = [int(v["metadata"]["resourceVersion"]) for v in world.versions[uid]]
            assert rv in versions, (name, kind, "a resourceVersion the API never showed")
            if exact_rv and name not in world.listed:
                assert rv == x["rv"], (name, kind, "not the version that showed it")
            else:
                assert rv >= x["rv"], (name, kind)
        if x["time"] is not None:
            assert e.time == x["time"], (name, kind, e.time, x["time"])
        else:
            lo, hi = x.get("window", (None, None))
            if lo is not None:
                assert lo <= e.time <= hi, (name, kind, e.time, lo, hi)
        reason = world.reasons.get(name, {}).get(kind)
        if kind in ("terminated", "deleted"):
            assert (e.reason.value if e.reason else None) == reason, (name, kind, e.reason)
        else:
            assert e.reason is None
    return per_pod


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(kube: KubeApiServer) -> KubeApiServer:
    nodes(kube)
    install_crds(kube)
    return kube


_seq = iter(range(10_000))


@pytest.fixture
def world(cluster: KubeApiServer) -> World:
    return World(cluster, f"t{next(_seq)}-{int(time.time()) % 100000}")


# --- scenarios ------------------------------------------------------------------------------


def build_workloads(w: World) -> dict[str, dict[str, Any]]:
    """Controllers as the API stores them (no controller-manager runs: the pods are the test's)."""
    dep = w.owner("Deployment", "apps/v1", "llm", {
        "replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
        "template": template(1, "Always", {"app": "llm"})},
        labels={"team": "inference"})  # fmt: skip
    rs = w.owner("ReplicaSet", "apps/v1", "llm-5d8f9", {
        "replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
        "template": template(1, "Always", {"app": "llm"})}, owner=dep)  # fmt: skip
    job = w.owner("Job", "batch/v1", "train", {"template": template(2)}, labels={"owner": "bob"})
    oom = w.owner("Job", "batch/v1", "oomer", {"template": template(1)})
    sts = w.owner("StatefulSet", "apps/v1", "triton", {
        "serviceName": "triton", "selector": {"matchLabels": {"app": "triton"}},
        "template": template(1, "Always", {"app": "triton"})})  # fmt: skip
    nb = w.owner(
        "Notebook",
        "kubeflow.org/v1",
        "alice-nb",
        {"template": template(1, "Always")},
        labels={"notebooks.kubeflow.org/creator": "alice"},
    )
    nb_sts = w.owner("StatefulSet", "apps/v1", "alice-nb", {
        "serviceName": "alice-nb", "selector": {"matchLabels": {"notebook-name": "alice-nb"}},
        "template": template(1, "Always", {"notebook-name": "alice-nb"})}, owner=nb)  # fmt: skip
    pt = w.owner("PyTorchJob", "kubeflow.org/v1", "llama", {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": template(8)},
        "Worker": {"replicas": 3, "template": template(8)}}})  # fmt: skip
    return {"dep": dep, "rs": rs, "job": job, "oom": oom, "sts": sts, "nb": nb, "nb_sts": nb_sts,
            "pt": pt}  # fmt: skip


def test_lifecycles_owners_gangs_mig_and_hostile_metadata(world: World, tmp_path: Path) -> None:
    """Every workload kind through its life, beside pods that must yield nothing; the shipped
    RBAC is enough for all of it (owners resolved), and the producer only ever read."""
    w, kube = world, world.kube
    o = build_workloads(w)
    ns = w.ns
    mark = kube.audit_mark()
    hostile_owner = "évé\u202e\n\t" + "x" * 100_000  # RTL override, newline, 100 kB
    hostile_name = ("h" * 60 + ".") * 4 + "h" * 8  # 252 characters, a valid pod name
    svc = {"owner_kind": "Deployment", "owner_name": "llm", "workload_class": "service",
           "team": "inference"}  # fmt: skip

    async def go() -> list[K8sPodEvent]:
        # before the producer starts: the list shows these
        w.pod("llm-5d8f9-a", of=o["rs"], restart="Always", **svc)
        w.bind("llm-5d8f9-a", "gpu-a100-01")
        w.running("llm-5d8f9-a")
        w.pod("cpu-only", gpus=0)
        w.bind("cpu-only", "cpu-01")
        w.running("cpu-only")
        w.listed = set(w.uids)
        async with Producer(kube, tmp_path / "out.jsonl") as run:
            await run.synced()
            # a Job pod: bound, running, completed, then deleted (terminal: deleted at once)
            w.pod(
                "train-x",
                gpus=2,
                of=o["job"],
                owner_kind="Job",
                owner_name="train",
                workload_class="batch",
                owner="bob",
            )
            w.bind("train-x", "gpu-a100-02")
            w.running("train-x")
            w.noise("train-x")
            w.finished("train-x", "Succeeded")
            w.reason("train-x", terminated="completed", deleted="completed")
            # OOM-killed; a pod that fails before any container starts
            w.pod("oomer-y", of=o["oom"], owner_kind="Job", workload_class="batch")
            w.bind("oomer-y", "gpu-a100-02")
            w.running("oomer-y")
            w.finished("oomer-y", "Failed", 137, "OOMKilled")
            w.reason("oomer-y", terminated="oom_killed")
            w.pod("oomer-z", of=o["oom"], owner_kind="Job", workload_class="batch")
            w.bind("oomer-z", "gpu-a100-02")
            w.finished("oomer-z", "Failed", 128, "StartError", ran=False)
            w.reason("oomer-z", terminated="failed")
            # StatefulSet pod deleted without grace (force): gone at once, no terminal phase
            w.pod(
                "triton-0",
                of=o["sts"],
                restart="Always",
                owner_kind="StatefulSet",
                owner_name="triton",
                workload_class="service",
            )
            w.bind("triton-0", "gpu-a100-01")
            w.running("triton-0")
            # notebook: Notebook -> StatefulSet -> pod
            w.pod("alice-nb-0", of=o["nb_sts"], restart="Always", labels={
                "notebook-name": "alice-nb", "gpugap.io/project": "vision"},
                owner_kind="Notebook", owner_name="alice-nb", workload_class="interactive",
                owner="alice")  # fmt: skip
            w.expect["alice-nb-0"]["labels"] = {"gpugap.io/project": "vision"}  # carried
            w.bind("alice-nb-0", "gpu-a100-01")
            w.running("alice-nb-0")
            # MIG slices
            w.pod("mig-a", gpus=2, resource=MIG, gpu_resource=MIG, workload_class="interactive")
            w.bind("mig-a", "gpu-h100-mig")
            w.running("mig-a")
            # a gang of 4 (PyTorchJob 1 master + 3 workers, 8 GPUs each); worker-2 never binds
            gang = {
                "owner_kind": "PyTorchJob",
                "owner_name": "llama",
                "gang_size": 4,
                "gang_id": f"{ns}/pytorchjob/llama",
                "workload_class": "batch",
            }
            for i, pod in enumerate(["llama-master-0", "llama-worker-0", "llama-worker-1",
                                     "llama-worker-2"]):  # fmt: skip
                labels = {
                    "training.kubeflow.org/job-name": "llama",
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                }
                w.pod(pod, gpus=8, of=o["pt"], labels=labels, restart="OnFailure", **gang)
                if i < 3:
                    w.bind(pod, f"gpu-a100-0{1 + i % 2}")
                    w.running(pod)
            # a GPU pod deleted while still Pending: nothing to say, ever
            w.pod("never-bound")
            w.delete("never-bound", grace=30)
            # hostile metadata, beside the normal pods
            w.pod(hostile_name, annotations={"gpugap.io/owner": hostile_owner,
                  "odd.example/json": '{"kind":"Pod","metadata":{}}\n' * 50,
                  "odd.example/nul": "a\u0000b"}, labels={"gpugap.io/team": "t" * 63})  # fmt: skip
            w.bind(hostile_name, "gpu-a100-02")
            w.running(hostile_name)
            # a pod created already on its node (no binding: a static or DaemonSet-like pod)
            w.pod("direct", node="gpu-a100-02", workload_class="interactive")
            w.running("direct")
            await run.synced()
            # ends: graceful deletion (the kubelet stops it, then removes it) and forced
            w.delete("llm-5d8f9-a", grace=30)
            w.finished("llm-5d8f9-a", "Failed", 143, "Error")
            w.delete("llm-5d8f9-a", grace=0)
            w.reason("llm-5d8f9-a", terminated="deleted", deleted="deleted")
            w.delete("triton-0", grace=0)
            w.reason("triton-0", deleted="deleted")
            w.delete("train-x")
            for pod in ("llama-master-0", "llama-worker-0", "llama-worker-1", "llama-worker-2"):
                w.delete(pod, grace=0)
                w.reason(pod, deleted="deleted")
            await run.synced()
            return run.events()

    events = asyncio.run(go())
    hostile = [e for e in events if e.name.startswith("hhh")]
    w.expect[hostile_name] = {}  # checked below: fields bounded, not equal to the input
    kinds = check(w, [e for e in events if e not in hostile])
    assert kinds["llama-master-0"] == ["bound", "running", "deleted"]
    assert "llama-worker-2" not in kinds and "never-bound" not in kinds and "cpu-only" not in kinds
    # the hostile pod: published, its fields within the schema's bounds, the others untouched
    assert [e.kind.value for e in hostile] == ["bound", "running"]
    for e in hostile:
        assert e.name == hostile_name and e.owner is not None
        assert len(e.owner) <= LIMITS["owner"] and e.owner.startswith("évé")
        assert e.team == "t" * 63
    assert not read_dead_letters(tmp_path / "out.jsonl")
    # read-only: everything the producer's identity asked was get, list or watch, all allowed
    calls = [a for a in kube.audit(mark) if a.get("stage") == "ResponseComplete"]
    assert calls, "the audit log shows the producer's requests"
    assert {a["user"]["username"] for a in calls} == {
        "system:serviceaccount:gpugap:gpugap-kubernetes-producer"
    }
    assert {a["verb"] for a in calls} <= {"get", "list", "watch"}
    assert all(a["responseStatus"]["code"] < 400 for a in calls), [
        (a["verb"], a["requestURI"], a["responseStatus"]) for a in calls
        if a["responseStatus"]["code"] >= 400]  # fmt: skip
    gets = sorted(a["requestURI"] for a in calls if a["verb"] == "get")
    assert len(gets) == len(set(gets)), "each owner fetched once (the cache)"
    assert {u.rsplit("/", 2)[-2] for u in gets} == {
        "replicasets",
        "deployments",
        "jobs",
        "statefulsets",
        "notebooks",
        "pytorchjobs",
    }


def test_amd_intel_and_gaudi_devices_are_held_as_nvidia_gpus_are(
    world: World, tmp_path: Path
) -> None:
    """With the default resource list, pods asking for AMD (whole GPUs, and partitions under
    the device plugin's "mixed" naming), Intel (i915 and xe drivers) and Gaudi devices are
    GPU pods like an ``nvidia.com/gpu`` one: as many devices as requested, the resource named.
    Intel's monitoring resource is not a device (it opens every GPU of the node for a
    monitoring agent): a pod asking only for it yields nothing."""
    w, kube = world, world.kube
    asks = {
        "mi300x": ("amd.com/gpu", 8),
        "mi300x-cpx": ("amd.com/cpx_nps4", 2),
        "max-i915": ("gpu.intel.com/i915", 2),
        "max-xe": ("gpu.intel.com/xe", 1),
        "gaudi": ("habana.ai/gaudi", 8),
        "nvidia": (GPU, 1),
    }

    async def go() -> list[K8sPodEvent]:
        async with Producer(kube, tmp_path / "out.jsonl", namespaces=[w.ns]) as run:
            for name, (resource, n) in asks.items():
                w.pod(name, gpus=n, resource=resource, gpu_resource=resource)
                w.bind(name, "gpu-a100-01")
                w.running(name)
            w.pod("xpu-monitor", gpus=1, resource="gpu.intel.com/i915_monitoring")
            w.expect["xpu-monitor"] = {}  # not a device: no event, ever
            w.bind("xpu-monitor", "gpu-a100-01")
            w.running("xpu-monitor")
            await run.synced()
            return run.events()

    kinds = check(w, asyncio.run(go()), exact_rv=False)
    assert {name: kinds[name] for name in asks} == {n: ["bound", "running"] for n in asks}
    assert "xpu-monitor" not in kinds
    assert not read_dead_letters(tmp_path / "out.jsonl")


def test_the_producers_identity_may_not_write(world: World) -> None:
    """The shipped ClusterRole: reads pods and owners; every write, and anything else, is 403."""
    kube = world.kube
    w = world
    w.pod("target")
    job = w.owner("Job", "batch/v1", "j", {"template": template(1)})
    assert kube.producer_token
    me = Api(kube.url, kube.producer_token)
    pods = f"/api/v1/namespaces/{w.ns}/pods"
    try:
        assert me.get(f"{pods}/target")["metadata"]["name"] == "target"
        assert (
            me.get(f"/apis/batch/v1/namespaces/{w.ns}/jobs/j")["metadata"]["uid"]
            == job["metadata"]["uid"]
        )
        refused = [
            ("POST", pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                            "spec": {"containers": [{"name": "c", "image": "x"}]}}),
            ("PATCH", f"{pods}/target", {"metadata": {"labels": {"a": "b"}}}),
            ("PATCH", f"{pods}/target/status", {"status": {"phase": "Running"}}),
            ("POST", f"{pods}/target/binding", {"apiVersion": "v1", "kind": "Binding",
             "metadata": {"name": "target"}, "target": {"kind": "Node", "name": "gpu-a100-01"}}),
            ("POST", f"{pods}/target/eviction", {"apiVersion": "policy/v1", "kind": "Eviction",
             "metadata": {"name": "target"}}),
            ("DELETE", f"{pods}/target", None),
            ("DELETE", pods, None),
            ("GET", f"{pods}/target/log", None),
            ("POST", f"{pods}/target/exec?command=sh&stdout=true", None),
            ("PATCH", "/api/v1/nodes/gpu-a100-01", {"metadata": {"labels": {"a": "b"}}}),
            ("GET", f"/api/v1/namespaces/{w.ns}/secrets", None),
            ("GET", f"/apis/batch/v1/namespaces/{w.ns}/jobs", None),  # owners: get only
            ("DELETE", f"/apis/batch/v1/namespaces/{w.ns}/jobs/j", None),
            ("PATCH", "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpugap-kubernetes-producer",
             {"rules": []}),
        ]  # fmt: skip
        for method, path, body in refused:
            with pytest.raises(ApiError) as err:
                me.call(method, path, body, content_type="application/merge-patch+json"
                        if method == "PATCH" else "application/json")  # fmt: skip
            assert err.value.code == 403, (method, path, err.value)
    finally:
        me.close()
    assert w.api.get(f"{pods}/target")["metadata"].get("labels") is None  # nothing changed


def test_a_list_larger_than_one_page(world: World, tmp_path: Path) -> None:
    """limit + continue against the real apiserver: 23 GPU pods and 7 without, pages of 5,
    in one namespace (the namespaced list); then the watch goes on from the list."""
    w, kube = world, world.kube
    for i in range(30):
        name = f"p-{i:02d}"
        w.pod(name, gpus=0 if i % 4 == 3 else 1 + i % 3)
        w.bind(name, "gpu-a100-01")
        if i % 2:
            w.running(name)
    mark = kube.audit_mark()

    async def go() -> list[K8sPodEvent]:
        async with Producer(kube, tmp_path / "out.jsonl", namespaces=[w.ns], page_size=5) as run:
            await run.synced()
            w.running("p-00")
            w.delete("p-01", grace=0)
            w.reason("p-01", deleted="deleted")
            await run.synced()
            return run.events()

    check(w, asyncio.run(go()), exact_rv=False)
    lists = [a["requestURI"] for a in kube.audit(mark)
             if a.get("stage") == "ResponseComplete" and a["verb"] == "list"]  # fmt: skip
    assert len(lists) == 7, lists  # 31 pods (with the sentinel): 7 pages
    assert all("limit=5" in u for u in lists) and sum("continue=" in u for u in lists) == 6


def _during_gap(w: World) -> None:
    """What the cluster does while the producer cannot watch (through a peer apiserver)."""
    w.running("b")  # b starts running while nobody watches
    w.finished("c", "Succeeded")  # c completes (and goes later)
    w.reason("c", terminated="completed", deleted="completed")
    w.finished("e", "Succeeded")  # e completes and goes: after the 410 nothing shows its end
    w.delete("e")
    w.unseen_end.add("e")
    w.reason("e", deleted="deleted")
    w.delete("a", grace=0)  # a is force-deleted: only the relist can tell (and not when)
    w.unseen_end.add("a")
    w.reason("a", deleted="deleted")
    w.pod("d", gpus=4)  # d appears and binds
    w.bind("d", "gpu-a100-02")


def _before_gap(w: World) -> None:
    for name in ("a", "b", "c", "e"):
        w.pod(name)
        w.bind(name, "gpu-a100-01")
    for name in ("a", "c", "e"):
        w.running(name)


GAP_KINDS = {
    "a": ["bound", "running", "deleted"],
    "b": ["bound", "running", "terminated"],
    "c": ["bound", "running", "terminated", "deleted"],
    "d": ["bound", "running"],
    "e": ["bound", "running", "deleted"],
}


async def _outage(kube: KubeApiServer, w: World, peer: Api, gap_s: float) -> None:
    """The producer's apiserver goes away; meanwhile the cluster goes on through a peer
    apiserver (same etcd); then it comes back, with an empty watch cache."""
    t0 = time.monotonic()
    await asyncio.to_thread(kube.stop_apiserver)
    w.use(peer)
    _during_gap(w)
    await asyncio.sleep(max(0.0, gap_s - (time.monotonic() - t0)))
    await asyncio.to_thread(kube.start_apiserver)
    w.use(kube.admin)


@pytest.mark.parametrize("gap_s", [0, 30], ids=["restart", "down-30s"])
def test_apiserver_restart_or_outage_mid_watch(world: World, tmp_path: Path, gap_s: int) -> None:
    """The apiserver restarted against the same etcd while the producer watches (its watch
    cache starts over: the resumed watch gets 410), or stopped for 30 s: the producer recovers
    on its own; no transition lost or invented, nothing twice."""
    w, kube = world, world.kube
    peer = kube.add_peer()
    try:
        _before_gap(w)

        async def go() -> Producer:
            async with Producer(kube, tmp_path / "out.jsonl") as run:
                await run.synced()
                await _outage(kube, w, peer, gap_s)
                await run.synced(timeout=90)
                w.running("d")  # and on it goes, through the restarted apiserver
                w.delete("c")
                w.finished("b", "Failed", 1, "Error")
                w.reason("b", terminated="failed")
                await run.synced()
                return run

        run = asyncio.run(go())
    finally:
        peer.close()
        kube.stop_peer()
    kinds = check(w, run.events(), exact_rv=False)
    assert kinds == GAP_KINDS
    stats = run.producer.watchers[0].stats
    assert stats.expired >= 1, "the resumed watch was refused with 410 and the producer relisted"
    assert stats.lists >= 2


@pytest.fixture
def uncached(
    tmp_path_factory: pytest.TempPathFactory, kube: KubeApiServer
) -> Iterator[KubeApiServer]:
    """Another etcd + apiserver with the watch cache off and compaction every 2 s: a watch
    is served by etcd itself, and one from a compacted revision is refused (410)."""
    server = KubeApiServer(tmp_path_factory.mktemp("kube-uncached"), watch_cache=False,
                           compaction_s=2)  # fmt: skip
    try:
        server.start()
        server.install_producer_identity()
        nodes(server)
        yield server
    finally:
        server.stop()


def test_a_watch_across_compaction_with_the_watch_cache_off(
    uncached: KubeApiServer, tmp_path: Path
) -> None:
    """Watches served by etcd itself: the producer's apiserver is away while the cluster
    changes and etcd compacts past the producer's resourceVersion; the resumed watch is
    refused (410, from etcd), the relist shows what happened."""
    kube = uncached
    w = World(kube, "compact")
    peer = kube.add_peer()
    try:
        _before_gap(w)

        async def go() -> Producer:
            async with Producer(kube, tmp_path / "out.jsonl") as run:
                await run.synced()
                old = kube.rv()
                await asyncio.to_thread(kube.stop_apiserver)
                w.use(peer)
                _during_gap(w)
                await asyncio.to_thread(wait_compacted, peer, old)
                await asyncio.to_thread(kube.start_apiserver)
                w.use(kube.admin)
                await run.synced(timeout=90)
                w.running("d")
                w.finished("b", "Failed", 1, "Error")
                w.reason("b", terminated="failed")
                w.delete("c")
                await run.synced()
                return run

        run = asyncio.run(go())
    finally:
        peer.close()
        kube.stop_peer()
    assert check(w, run.events(), exact_rv=False) == GAP_KINDS
    assert run.producer.watchers[0].stats.expired >= 1


def wait_compacted(api: Api, rv: int, timeout: float = 60.0) -> None:
    """Until etcd has compacted revision ``rv`` away (a list at exactly it is 410)."""
    deadline = time.monotonic() + timeout
    while True:
        # churn other objects, so the compactor has revisions to compact past
        api.post(
            "/api/v1/namespaces/default/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "churn-"}},
        )
        try:
            api.get(f"/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact&limit=1")
        except ApiError as exc:
            if exc.code == 410:
                return
            raise
        assert time.monotonic() < deadline, f"revision {rv} not compacted in {timeout} s"
        time.sleep(0.5)


def test_wrong_credentials_are_a_clear_error(kube: KubeApiServer, tmp_path: Path) -> None:
    """A token the apiserver does not know (401): the producer stops with a clear error."""
    from gpugap.schemas.errors import FatalError

    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig", token="not-a-token")

    async def go() -> None:
        producer = KubernetesProducer(*settings_for(kubeconfig))
        await run_producer(producer, JsonlPublisher(tmp_path / "out.jsonl"), stop=asyncio.Event())

    with pytest.raises(FatalError, match="refused"):
        asyncio.run(asyncio.wait_for(go(), 60))
