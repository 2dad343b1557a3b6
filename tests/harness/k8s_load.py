"""A realistic cluster's load for the Kubernetes producer, and the producer measured through
it (``python -m benchmarks kubernetes`` and kubernetes-real print it; tests/producers check it
on a small cluster): an initial list of pods, then a burst of watch events, through the test
API server (tests/harness/k8s_api.py, in a child process, as a real API server is elsewhere: it must
not share the producer's GIL) and the real kubernetes client.

Pods are realistic objects (~3 kB of JSON: labels, owner reference, resources, probes,
volumes, conditions, container statuses); 80% request GPUs. Owners: Deployments (with their
ReplicaSets), Jobs and PyTorchJobs, ~50 pods each, all fetched over HTTP once. Output goes
through the JSONL publisher to a file. The burst: a quarter new pods bound and running (2
events each), a quarter Job pods completing, a quarter deletions, a quarter status updates
that matter to nobody.

    python -m tests.harness.k8s_load PODS BURST    # the API server process (``serve``)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

GROUP = 50  # pods per owner
T0 = "2026-11-02T08:00:00Z"


def _uid(*parts: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(map(str, parts))))


def owner_of(i: int) -> tuple[str, str, str]:
    """(kind, api version, name) of the controller of pod ``i``."""
    g = i // GROUP
    kind = ("Deployment", "Job", "Job", "PyTorchJob")[g % 4]
    api = {"Deployment": "apps/v1", "Job": "batch/v1", "PyTorchJob": "kubeflow.org/v1"}[kind]
    return kind, api, f"{kind.lower()}-{g}"


def namespace_of(i: int) -> str:
    return f"team-{(i // GROUP) % 40:02d}"


IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
MOUNTS = [
    {"mountPath": "/models", "name": "models"},
    {"mountPath": "/dev/shm", "name": "dshm"},
    {
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "name": "kube-api-access-x7k2p",
        "readOnly": True,
    },
]
VOLUMES = [
    {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
    {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    {
        "name": "kube-api-access-x7k2p",
        "projected": {
            "defaultMode": 420,
            "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
        },
    },
]
PROBE = {
    "httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}


def controller_ref(i: int) -> dict[str, Any]:
    kind, api, owner = owner_of(i)
    if kind == "Deployment":
        kind, api, owner = "ReplicaSet", "apps/v1", f"{owner}-7d9c6b5f4d"
    return {
        "apiVersion": api,
        "kind": kind,
        "name": owner,
        "uid": _uid(kind, owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def container_status(i: int, variant: str) -> dict[str, Any]:
    started = "2026-11-02T08:01:10Z"
    state: dict[str, Any] = {"running": {"startedAt": started}}
    if variant == "succeeded":
        done = {"exitCode": 0, "reason": "Completed", "startedAt": started}
        state = {"terminated": {**done, "finishedAt": "2026-11-02T09:30:00Z"}}
    return {
        "name": "main",
        "image": IMAGE,
        "imageID": "nvcr.io/nvidia/pytorch@sha256:4f5a0c3c8d1e1b6f0a9e2d7c6b5a4f3e2d1c0b9a",
        "containerID": f"containerd://{_uid('c', i).replace('-', '')}",
        "ready": variant != "succeeded",
        "restartCount": 0,
        "started": True,
        "state": state,
        "lastState": {},
    }


def pod(i: int, variant: str = "running") -> tuple[str, str, bytes]:
    """Pod ``i`` as the API server sends it; ``"RV"`` stands for its resourceVersion."""
    ns, name = namespace_of(i), f"w-{i}"
    kind, _, owner = owner_of(i)
    limits = {"cpu": "8", "memory": "32Gi"}
    if i % 5 != 4:  # 80% of pods request GPUs
        limits["nvidia.com/gpu"] = str(1 + i % 8)
    conditions = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": T0}
        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{controller_ref(i)['name']}-",
            "namespace": ns,
            "uid": _uid("pod", i),
            "resourceVersion": "RV",
            "creationTimestamp": T0,
            "labels": {"app": owner, "team": ns, "pod-template-hash": "7d9c6b5f4d"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": T0, "bench/variant": variant},
            "ownerReferences": [controller_ref(i)],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "args": ["python", "-m", "serve", "--port", "8000", "--model", "/models/m"],
                    "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                    "env": [
                        {"name": "NCCL_DEBUG", "value": "WARN"},
                        {"name": "OMP_NUM_THREADS", "value": "8"},
                    ],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "readinessProbe": PROBE,
                    "volumeMounts": MOUNTS,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "nodeName": f"gpu-node-{i % 2000:04d}",
            "restartPolicy": "Never" if kind != "Deployment" else "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
            ],
            "volumes": VOLUMES,
        },
        "status": {
            "phase": "Succeeded" if variant == "succeeded" else "Running",
            "conditions": conditions,
            "hostIP": f"10.20.{i % 250}.{i % 200 + 1}",
            "podIP": f"10.244.{i % 250}.{i % 199 + 2}",
            "startTime": T0,
            "qosClass": "Guaranteed",
            "containerStatuses": [container_status(i, variant)],
        },
    }
    return ns, name, json.dumps(obj, separators=(",", ":")).encode()


def owners(pods: int) -> list[dict[str, Any]]:
    """The controllers of pods ``0..pods-1`` (and the ReplicaSets of the Deployments)."""
    out: list[dict[str, Any]] = []
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    template = {"spec": {"containers": [{"name": "main", "resources": gpu}]}}
    for g in range((pods + GROUP - 1) // GROUP):
        kind, api, name = owner_of(g * GROUP)
        ns = namespace_of(g * GROUP)
        meta = {
            "name": name,
            "namespace": ns,
            "uid": _uid(kind, name),
            "labels": {"owner": f"u{g}"},
        }
        if kind == "Deployment":
            spec: dict[str, Any] = {"template": template}
            ref = controller_ref(g * GROUP)
            rs_meta = {"name": ref["name"], "namespace": ns, "uid": ref["uid"]}
            up = {"apiVersion": api, "kind": kind, "name": name, "uid": meta["uid"]}
            rs_meta["ownerReferences"] = [{**up, "controller": True}]
            out.append({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs_meta})
        elif kind == "Job":
            spec = {"parallelism": 1, "template": template}
        else:
            spec = {"pytorchReplicaSpecs": {"Worker": {"replicas": GROUP, "template": template}}}
        out.append({"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec})
    return out


def burst_events(pods: int, burst: int) -> list[tuple[str, str, str, bytes]]:
    """A quarter new pods, a quarter Job pods completing, a quarter deleted, a quarter noise."""
    q = burst // 4
    events: list[tuple[str, str, str, bytes]] = []
    for k in range(q):
        events.append(("ADDED", *pod(pods + k)))
    jobs = [i for i in range(pods) if owner_of(i)[0] == "Job" and i % 5 != 4]
    for i in jobs[:q]:
        events.append(("MODIFIED", *pod(i, "succeeded")))
    deps = [i for i in range(pods) if owner_of(i)[0] == "Deployment"]
    for i in deps[:q]:
        events.append(("DELETED", *pod(i)))
    for i in deps[q : 2 * q]:
        events.append(("MODIFIED", *pod(i, "noise")))
    return events


def serve(pods: int, burst: int) -> None:
    """The API server process: builds the cluster, prints its URL and resourceVersion, then
    answers "burst" (apply the burst, print the new resourceVersion) until "stop"."""
    from tests.harness.k8s_api import ApiServer, FakeCluster

    cluster = FakeCluster(bookmark_every_s=0.2)
    for obj in owners(pods + burst):
        cluster.add_object(obj)
    cluster.load_raw([pod(i) for i in range(pods)])
    events = burst_events(pods, burst)
    with ApiServer(cluster) as server:
        print(json.dumps([server.url, cluster.rv]), flush=True)
        for line in sys.stdin:
            if line.strip() == "burst":
                print(json.dumps(cluster.apply_raw(events)), flush=True)
            elif line.strip() == "stop":
                break


async def wait_synced(producer: Any, rv: int, task: asyncio.Task[int]) -> None:
    """Until the producer has published everything up to resourceVersion ``rv``."""
    while int(producer.synced_rv.get("", "0")) < rv:
        if task.done():
            task.result()
            raise RuntimeError("the producer stopped")
        await asyncio.sleep(0.005)


def measure(pods: int, burst: int) -> dict[str, float]:
    """The producer over ``pods`` listed, then a burst of ``burst`` watch events, from the
    test API server in a child process (``serve``): seconds and events of each part, and the
    owner GETs."""
    # the client's API modules load lazily and take seconds: imported before the clock starts
    from kubernetes.client import CoreV1Api, CustomObjectsApi  # noqa: F401

    from gpugap.groundfloor.kafka.publish import JsonlPublisher
    from gpugap.producers import run_producer
    from gpugap.producers.kubernetes.producer import KubernetesProducer
    from tests.harness.k8s_api import write_kubeconfig
    from tests.harness.k8s_run import settings_for

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.k8s_load", str(pods), str(burst)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def ask(cmd: str) -> Any:
        stdin.write(cmd + "\n")
        stdin.flush()
        return json.loads(stdout.readline())

    try:
        url, list_rv = json.loads(stdout.readline())
        with tempfile.TemporaryDirectory(prefix="gpugap-k8s-bench-") as tmp:
            kubeconfig = write_kubeconfig(url, Path(tmp) / "kubeconfig")
            settings = settings_for(kubeconfig, request_timeout_s=60.0, watch_timeout_s=300)
            producer = KubernetesProducer(*settings)
            publisher = JsonlPublisher(Path(tmp) / "out.jsonl")

            async def go() -> dict[str, float]:
                stop = asyncio.Event()
                t0 = time.perf_counter()
                task = asyncio.create_task(run_producer(producer, publisher, stop=stop))
                await wait_synced(producer, list_rv, task)
                t1 = time.perf_counter()
                listed = publisher.sent
                burst_rv = await asyncio.to_thread(ask, "burst")
                await wait_synced(producer, burst_rv, task)
                t2 = time.perf_counter()
                stop.set()
                await task
                assert producer.resolver is not None
                return {
                    "list_s": t1 - t0,
                    "list_events": listed,
                    "owner_gets": producer.resolver.gets,
                    "burst_s": t2 - t1,
                    "burst_events": publisher.sent - listed,
                }

            return asyncio.run(go())
    finally:
        with contextlib.suppress(OSError):
            stdin.write("stop\n")
            stdin.close()
        proc.wait(30)
        stdout.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
