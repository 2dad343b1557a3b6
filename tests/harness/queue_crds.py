"""The queue managers' real CRDs (tests/harness/crds/, see its README) on the test
kube-apiserver, and the writes a queue manager's controller would make: objects created as
their users do, status written through the status subresource."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kube_apiserver import ApiError, KubeApiServer

CRDS = Path(__file__).resolve().parent / "crds"
CRD_FILES = (
    "kueue/kueue.x-k8s.io_resourceflavors.yaml",
    "kueue/kueue.x-k8s.io_clusterqueues.yaml",
    "kueue/kueue.x-k8s.io_localqueues.yaml",
    "kai-scheduler/scheduling.run.ai_queues.yaml",
    "volcano/scheduling.volcano.sh_queues.yaml",
)


def install(kube: KubeApiServer) -> None:
    """Create the CRDs (409: already there) and wait until each is established and served."""
    docs = [yaml.safe_load((CRDS / f).read_text()) for f in CRD_FILES]
    for doc in docs:
        try:
            kube.apply(doc)
        except ApiError as exc:
            if exc.code != 409:
                raise
    for doc in docs:
        spec = doc["spec"]
        name = f"{spec['names']['plural']}.{spec['group']}"
        deadline = time.monotonic() + 60
        while True:
            got = kube.admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            status = got.get("status") or {}
            conds = {c["type"]: c["status"] for c in status.get("conditions", ())}
            if conds.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {name} not established"
            time.sleep(0.1)
        served = [v["name"] for v in spec["versions"] if v.get("served")]
        for version in served:
            deadline = time.monotonic() + 60
            while True:  # served through discovery as well
                try:
                    kube.admin.get(f"/apis/{spec['group']}/{version}/{spec['names']['plural']}")
                    break
                except ApiError:
                    assert time.monotonic() < deadline, f"{name}/{version} not served"
                    time.sleep(0.2)


def path(api_version: str, plural: str, name: str = "", namespace: str = "") -> str:
    base = f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


#: (apiVersion, kind, plural) of what the tests create
RESOURCE_FLAVOR = ("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors")
CLUSTER_QUEUE = ("kueue.x-k8s.io/v1beta2", "ClusterQueue", "clusterqueues")
LOCAL_QUEUE = ("kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues")
KAI_QUEUE = ("scheduling.run.ai/v2", "Queue", "queues")
VOLCANO_QUEUE = ("scheduling.volcano.sh/v1beta1", "Queue", "queues")


def create(
    kube: KubeApiServer, what: tuple[str, str, str], name: str, spec: dict[str, Any],
    *, namespace: str = "", status: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Create (or replace the spec of) an object; with ``status``, write it as the manager's
    controller does: a merge patch of the status subresource."""
    api_version, kind, plural = what
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    doc = {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}
    try:
        obj: dict[str, Any] = kube.admin.post(path(api_version, plural, namespace=namespace), doc)
    except ApiError as exc:
        if exc.code != 409:
            raise
        obj = kube.admin.patch(path(api_version, plural, name, namespace), {"spec": spec})
    if status is not None:
        obj = kube.admin.patch(path(api_version, plural, name, namespace) + "/status",
                               {"status": status})  # fmt: skip
    return obj
