"""Processes to pods by cgroup, and the AMD device plugin's ids to device identities."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gpugap.producers.amdsmi.pod_resources import device_names, translate
from gpugap.producers.kubelet_cgroup import pod_uid_of_cgroup, pod_uid_of_pid
from gpugap.producers.nvml.kubelet import api_pb2
from gpugap.producers.nvml.pod_resources import attributions
from gpugap.schemas import DevicePartition
from gpugap.schemas.types import PartitionKind

UID = "6f1c2a4e-1b2d-4c3e-9f10-0a1b2c3d4e5f"


def test_cgroup_forms() -> None:
    v1 = f"12:memory:/kubepods/burstable/pod{UID}/0123abcd\n4:cpu:/kubepods/burstable/pod{UID}/x"
    guaranteed = f"0::/kubepods/pod{UID}/0123abcd"
    v2 = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-0123.scope"
    )
    v2_guaranteed = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-9.scope"
    static = "0::/kubepods/besteffort/pod0123456789abcdef0123456789abcdef/c1"
    for text in (v1, guaranteed, v2, v2_guaranteed):
        assert pod_uid_of_cgroup(text) == UID
    assert pod_uid_of_cgroup(static) == "0123456789abcdef0123456789abcdef"
    for text in ("0::/user.slice/user-1000.slice/session-3.scope", "0::/system.slice/x.service",
                 f"0::/docker/pod{UID}", ""):  # fmt: skip
        assert pod_uid_of_cgroup(text) is None


def test_pid_lookup_reads_the_proc_root(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/c\n")
    assert pod_uid_of_pid(42, tmp_path) == UID
    assert pod_uid_of_pid(43, tmp_path) is None  # gone meanwhile


def device(
    index: int, bdf: str, identity: str, node: int, pid: int | None = None
) -> SimpleNamespace:
    part = (
        None
        if pid is None
        else DevicePartition(
            parent_uuid=identity.split("/", maxsplit=1)[0], partition_id=pid,
            kind=PartitionKind.AMD_COMPUTE, count=8, mode="CPX",
        )
    )  # fmt: skip
    return SimpleNamespace(index=index, bdf=bdf, identity=identity, kfd_node=node, partition=part)


def test_device_plugin_ids_name_devices(tmp_path: Path) -> None:
    """ROCm/k8s-device-plugin GetAMDGPUs: a GPU by its PCI address, further partitions by
    their platform device amdgpu_xcp_N, whose render node is a KFD node's drm_render_minor."""
    parent = "AMD-7bff74a1-0000-1000-80e9-b4f8e1b0b8cd"
    whole = "AMD-0cff74a1-0000-1000-8047-f09ed7fb6fd7"
    devices = [
        device(0, "0000:0c:00.0", whole, 1),
        device(1, "0000:1c:00.0", f"{parent}/0", 2, 0),
        device(2, "0000:1c:00.0", f"{parent}/1", 3, 1),
    ]
    for node, minor in ((1, 128), (2, 136), (3, 137)):
        d = tmp_path / "class/kfd/kfd/topology/nodes" / str(node)
        d.mkdir(parents=True)
        (d / "properties").write_text(f"cpu_cores_count 0\ndrm_render_minor {minor}\n")
    (tmp_path / "devices/platform/amdgpu_xcp_30/drm/renderD137").mkdir(parents=True)
    (tmp_path / "devices/platform/amdgpu_xcp_31/drm/renderD200").mkdir(parents=True)
    names = device_names(devices, tmp_path)  # type: ignore[arg-type]
    assert names == {
        "0000:0c:00.0": whole,
        "0000:1c:00.0": f"{parent}/0",
        "amdgpu_xcp_30": f"{parent}/1",
    }

    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="train-0", namespace="ml",
                containers=[api_pb2.ContainerResources(name="main", devices=[
                    api_pb2.ContainerDevices(resource_name="amd.com/cpx_nps4",
                                             device_ids=["amdgpu_xcp_30"]),
                ])],
            ),
            api_pb2.PodResources(
                name="infer-1", namespace="ml",
                containers=[api_pb2.ContainerResources(name="srv", devices=[
                    api_pb2.ContainerDevices(resource_name="amd.com/gpu",
                                             device_ids=["0000:0c:00.0"]),
                    api_pb2.ContainerDevices(resource_name="example.com/nic", device_ids=["eth1"]),
                ])],
            ),
        ]
    )  # fmt: skip
    holders = attributions(translate(response, names))
    assert set(holders) == {whole, f"{parent}/1"}
    assert holders[f"{parent}/1"].pod == "train-0" and holders[whole].container == "srv"
