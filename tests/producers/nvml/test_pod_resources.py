"""Pod attribution from the kubelet PodResources API: a grpc.aio server on a unix socket
answering List with recorded responses (tests/fixtures/pod_resources/), the way the kubelet
does, and the NVML agent attaching what it says to each GPU."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from gpugap.groundfloor.settings import Settings
from gpugap.producers.nvml.kubelet import api_pb2, api_pb2_grpc
from gpugap.producers.nvml.pod_resources import PodResourcesClient, attributions, device_uuid
from gpugap.producers.nvml.producer import NvmlProducer
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.schemas import Attribution, SharingPod, encode
from gpugap.schemas.types import MAX_SHARING_PODS
from tests.harness.nvml_fake import FakeNvml

FIXTURES = Path(__file__).parents[2] / "fixtures" / "pod_resources"


def recorded(name: str) -> api_pb2.ListPodResourcesResponse:
    response = api_pb2.ListPodResourcesResponse()
    json_format.Parse((FIXTURES / f"{name}.json").read_text(), response, ignore_unknown_fields=True)
    return response


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, response: api_pb2.ListPodResourcesResponse) -> None:
        self.response = response
        self.calls = 0

    async def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        return self.response


@asynccontextmanager
async def kubelet(
    socket: Path, response: api_pb2.ListPodResourcesResponse
) -> AsyncIterator[Kubelet]:
    servicer = Kubelet(response)
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(None)


def test_field_numbers_are_upstreams() -> None:
    """The wire format: message and field numbers as in k8s.io/kubelet podresources/v1."""
    expected = {
        "ListPodResourcesResponse": {"pod_resources": 1},
        "PodResources": {"name": 1, "namespace": 2, "containers": 3},
        "ContainerResources": {
            "name": 1,
            "devices": 2,
            "cpu_ids": 3,
            "memory": 4,
            "dynamic_resources": 5,
        },
        "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
        "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
        "TopologyInfo": {"nodes": 1},
        "NUMANode": {"ID": 1},
        "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
        "ClaimResource": {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4},
    }
    for message, fields in expected.items():
        desc = api_pb2.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in desc.fields} == fields, message
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
    # bytes as the kubelet sends them: PodResources{name: "a", namespace: "b"}
    assert api_pb2.PodResources(name="a", namespace="b").SerializeToString() == b"\n\x01a\x12\x01b"


def test_device_ids() -> None:
    assert device_uuid("GPU-3fb06e55-5746-4ede-8c32-916369ad49d8::3") == (
        "GPU-3fb06e55-5746-4ede-8c32-916369ad49d8"
    )
    assert device_uuid("MIG-68914221-dd79-45a4-b412-961c75951ef0").startswith("MIG-")  # type: ignore[union-attr]
    assert device_uuid("0000:3b:00.0") is None  # an SR-IOV NIC, say


def test_list_over_the_unix_socket(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"

    async def run() -> dict[str, Attribution] | None:
        async with kubelet(socket, recorded("a100x8")) as server:
            client = PodResourcesClient(socket, timeout_s=2.0)
            try:
                got = await client.list()
            finally:
                await client.close()
            assert server.calls == 1
            return got

    got = asyncio.run(run())
    worker = Attribution(pod="bert-large-worker-0", namespace="ml-research", container="pytorch")
    triton = {"pod": "triton-llama-7b-5c9d7f6b8-9wq4t", "namespace": "serving"}
    assert got == {
        "GPU-0f4aa467-64e2-4b77-b67a-73f91da3a124": worker,
        "GPU-4651d4cc-381c-4efb-a6b8-8aa30ce8b406": worker,
        "GPU-f6e5148b-7248-4191-a45e-a262201222d6": worker,
        "GPU-9fc7c87b-e8e5-43e9-a2e4-e4a1174a4488": worker,
        "GPU-6352fef7-7de3-4695-86bf-97c05a8330d1": Attribution(**triton, container="triton"),
        "GPU-2fbb1ed0-ed3c-41e9-81bf-3a517ef8389c": Attribution(
            **triton, container="tokenizer-sidecar"
        ),
    }


def test_time_sliced_gpu_goes_to_the_first_holder() -> None:
    got = attributions(recorded("h100x2_mig"))
    shared = got["GPU-3fb06e55-5746-4ede-8c32-916369ad49d8"]
    assert shared.pod == "embed-svc-7d4b9c-4hq8n"  # sorted: stable from tick to tick
    assert shared.shared == (
        SharingPod(pod="embed-svc-7d4b9c-zt5mx", namespace="serving", container="server"),
    )
    # the MIG instances, each held by one pod, share with nobody
    assert got["MIG-68914221-dd79-45a4-b412-961c75951ef0"].shared is None


SLICED = "GPU-3fb06e55-5746-4ede-8c32-916369ad49d8"


def response(*pods: tuple[str, str, dict[str, list[str]]]) -> api_pb2.ListPodResourcesResponse:
    """A List answer: (namespace, pod, {container: device ids}) per pod, in the given order."""
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name=name,
                namespace=ns,
                containers=[
                    api_pb2.ContainerResources(
                        name=container,
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=device_ids
                            )
                        ],
                    )
                    for container, device_ids in containers.items()
                ],
            )
            for ns, name, containers in pods
        ]
    )


def test_four_pods_time_slicing_one_gpu() -> None:
    """The first pod is the attribution's pod; the other three, in order, share it."""
    got = attributions(
        response(  # in the kubelet's order, not sorted
            ("serving", "embed-c", {"server": [f"{SLICED}::2"]}),
            ("batch", "score-z", {"worker": [f"{SLICED}::0"]}),
            ("serving", "embed-a", {"server": [f"{SLICED}::3"]}),
            ("serving", "embed-b", {"server": [f"{SLICED}::1"], "metrics": [f"{SLICED}::4"]}),
        )
    )
    assert got == {
        SLICED: Attribution(
            pod="score-z",
            namespace="batch",
            container="worker",
            shared=(
                SharingPod(pod="embed-a", namespace="serving", container="server"),
                # one entry for the pod, its first container holding the GPU
                SharingPod(pod="embed-b", namespace="serving", container="metrics"),
                SharingPod(pod="embed-c", namespace="serving", container="server"),
            ),
        )
    }


def test_one_pod_holding_two_replicas_is_one_holder() -> None:
    got = attributions(
        response(
            ("serving", "embed-a", {"server": [f"{SLICED}::0", f"{SLICED}::1"]}),
            ("serving", "embed-b", {"sidecar": [f"{SLICED}::3"], "server": [f"{SLICED}::2"]}),
        )
    )
    assert got[SLICED].pod == "embed-a"
    assert got[SLICED].shared == (
        SharingPod(pod="embed-b", namespace="serving", container="server"),
    )
    # the first pod's other container is no other holder
    first_twice = attributions(
        response(
            ("serving", "embed-a", {"server": [f"{SLICED}::0"], "loader": [f"{SLICED}::1"]}),
            ("serving", "embed-b", {"server": [f"{SLICED}::2"]}),
        )
    )
    assert (first_twice[SLICED].container, first_twice[SLICED].shared) == (
        "loader",
        (SharingPod(pod="embed-b", namespace="serving", container="server"),),
    )
    assert attributions(
        response(("serving", "embed-a", {"server": [f"{SLICED}::0", f"{SLICED}::1"]}))
    ) == {SLICED: Attribution(pod="embed-a", namespace="serving", container="server")}
    two_containers = attributions(
        response(("serving", "embed-a", {"server": [f"{SLICED}::1"], "loader": [f"{SLICED}::0"]}))
    )
    assert two_containers == {
        SLICED: Attribution(pod="embed-a", namespace="serving", container="loader")
    }


def test_same_name_in_two_namespaces_is_two_pods() -> None:
    got = attributions(
        response(
            ("team-b", "notebook", {"main": [f"{SLICED}::1"]}),
            ("team-a", "notebook", {"main": [f"{SLICED}::0"]}),
        )
    )
    assert (got[SLICED].namespace, got[SLICED].shared) == (
        "team-a",
        (SharingPod(pod="notebook", namespace="team-b", container="main"),),
    )


def test_a_whole_gpu_held_by_one_pod_encodes_as_before() -> None:
    got = attributions(recorded("a100x8"))
    assert all(a.shared is None for a in got.values())
    worker = got["GPU-0f4aa467-64e2-4b77-b67a-73f91da3a124"]
    assert json.loads(encode(worker)) == {
        "pod": "bert-large-worker-0",
        "namespace": "ml-research",
        "container": "pytorch",
    }


def test_more_sharing_pods_than_kept_are_capped_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    many = MAX_SHARING_PODS + 6
    answer = response(
        *(("serving", f"embed-{i:03d}", {"server": [f"{SLICED}::{i}"]}) for i in range(many))
    )
    capped: set[str] = set()
    with caplog.at_level(logging.WARNING):
        got = attributions(answer, capped)
        again = attributions(answer, capped)  # the next tick: no second warning
    assert got == again
    assert got[SLICED].pod == "embed-000"
    shared = got[SLICED].shared
    assert shared is not None and len(shared) == MAX_SHARING_PODS
    assert [p.pod for p in shared] == [f"embed-{i:03d}" for i in range(1, MAX_SHARING_PODS + 1)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert SLICED in warnings[0] and f"{many} pods" in warnings[0]
    assert f"kept {MAX_SHARING_PODS + 1}" in warnings[0]
    # back under the cap, then over it again: warned again
    attributions(response(("serving", "embed-000", {"server": [f"{SLICED}::0"]})), capped)
    assert capped == set()
    with caplog.at_level(logging.WARNING):
        attributions(answer, capped)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    # exactly at the cap: all kept, no warning
    caplog.clear()
    at_cap = response(
        *(
            ("serving", f"embed-{i:03d}", {"server": [f"{SLICED}::{i}"]})
            for i in range(MAX_SHARING_PODS + 1)
        )
    )
    with caplog.at_level(logging.WARNING):
        kept = attributions(at_cap)
    assert len(kept[SLICED].shared or ()) == MAX_SHARING_PODS and not caplog.records


def nvml_settings(socket: Path) -> tuple[Settings, NvmlSettings]:
    nvml = NvmlSettings(node="gpu-node-1", pod_resources_socket=socket)
    return Settings(cluster="k8s-west"), nvml


def test_nvml_agent_attributes_each_gpu(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    fake = FakeNvml("a100x8")

    async def run() -> Any:
        async with kubelet(socket, recorded("a100x8")):
            producer = NvmlProducer(*nvml_settings(socket))
            try:
                return next(iter(await producer.poll()))
            finally:
                await producer.close()

    with fake.installed():
        sample = asyncio.run(run())
    pods = [
        (g.attribution.pod, g.attribution.container) if g.attribution else None for g in sample.gpus
    ]
    assert pods == [("bert-large-worker-0", "pytorch")] * 4 + [
        ("triton-llama-7b-5c9d7f6b8-9wq4t", "triton"),
        ("triton-llama-7b-5c9d7f6b8-9wq4t", "tokenizer-sidecar"),
        None,  # held by nobody: capacity nobody uses
        None,
    ]


def test_mig_pods_by_mig_uuid_and_by_the_older_id(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    fake = FakeNvml("h100x2_mig")

    async def run() -> Any:
        async with kubelet(socket, recorded("h100x2_mig")):
            producer = NvmlProducer(*nvml_settings(socket))
            try:
                return next(iter(await producer.poll()))
            finally:
                await producer.close()

    with fake.installed():
        sample = asyncio.run(run())
    pods = [g.attribution.pod if g.attribution else None for g in sample.gpus]
    assert pods == ["jupyter-alice", None, "jupyter-bob", None, "embed-svc-7d4b9c-4hq8n"]
    # the time-sliced GPU's sample names the other pod sharing it
    assert sample.gpus[-1].attribution.shared == (
        SharingPod(pod="embed-svc-7d4b9c-zt5mx", namespace="serving", container="server"),
    )
    assert [g.attribution.shared for g in sample.gpus[:-1] if g.attribution] == [None, None]


def test_kubelet_down_then_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    socket = tmp_path / "kubelet.sock"
    fake = FakeNvml("a100x8")

    async def run() -> list[int]:
        producer = NvmlProducer(*nvml_settings(socket))
        held = []
        try:
            # no socket at all: not a Kubernetes node (or the kubelet is not up): no noise
            held.append(await attributed(producer))
            async with kubelet(socket, recorded("a100x8")):
                held.append(await attributed(producer))
            socket.touch()  # the kubelet died and left its socket file behind
            held.append(await attributed(producer))
            held.append(await attributed(producer))
            socket.unlink()
            async with kubelet(socket, recorded("a100x8")):  # restarted: a new socket
                held.append(await attributed(producer))
        finally:
            await producer.close()
        return held

    async def attributed(producer: NvmlProducer) -> int:
        sample = next(iter(await producer.poll()))
        return sum(g.attribution is not None for g in sample.gpus)  # type: ignore[attr-defined]

    with fake.installed(), caplog.at_level(logging.WARNING):
        assert asyncio.run(run()) == [0, 6, 0, 0, 6]
    messages = [r.getMessage() for r in caplog.records if "pod-resources" in r.getMessage()]
    assert len(messages) == 2, messages  # one when it fails, one when it answers again
    assert "failed" in messages[0] and "answers again" in messages[1]


def test_recorded_fixtures_are_valid_responses() -> None:
    for path in FIXTURES.glob("*.json"):
        data = json.loads(path.read_text())
        assert recorded(path.stem).pod_resources, path
        assert len(recorded(path.stem).pod_resources) == len(data["podResources"])


def test_daemonset_mounts_the_socket_read_only_and_holds_no_gpu() -> None:
    import yaml

    manifest = yaml.safe_load(
        (Path(__file__).parents[3] / "deploy" / "nvml-agent.yaml").read_text()
    )
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [mount] = container["volumeMounts"]
    assert mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    resources = container["resources"]
    assert "nvidia.com/gpu" not in {**resources["requests"], **resources.get("limits", {})}
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUGAP_NVML_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
