"""Which extended resources are accelerators (producers/kubernetes/gpu_resources.py): one
exact list for every Kubernetes producer, and what a unit of an AMD partition is worth of its
GPU. Resource and label names are the device plugins' own: ROCm/k8s-device-plugin (README,
"Resource Naming Strategy": ``amd.com/cpx_nps4``; node labeller
``amd.com/compute-memory-partition``, ``amd.com/gpu.product-name``), Intel's GPU plugin
(intel-device-plugins-for-kubernetes cmd/gpu_plugin README: ``gpu.intel.com/i915``,
``gpu.intel.com/xe``, the ``*_monitoring`` resources), Habana's ``habana.ai/gaudi``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpugap.producers.kubernetes.capacity import GpuShares
from gpugap.producers.kubernetes.gpu_resources import (
    AMD_PARTITION_LABEL,
    GPU_RESOURCES,
    MIG_PREFIX,
    MODEL_LABELS,
    amd_partition_share,
)
from gpugap.producers.kubernetes.poll_settings import CapacitySettings, QueueSettings
from gpugap.producers.kubernetes.resources import GpuRule, gpu_summary
from gpugap.producers.kubernetes.settings import KubernetesSettings

MI300X = "AMD_Instinct_MI300X_OAM"
MI300A = "AMD_Instinct_MI300A"


def _spec(*limits: dict[str, str]) -> dict[str, object]:
    return {"containers": [{"name": f"c{i}", "resources": {"limits": r}}
                           for i, r in enumerate(limits)]}  # fmt: skip


def test_every_producer_reads_the_same_default_list() -> None:
    lists = {
        tuple(s().gpu_resources) for s in (KubernetesSettings, CapacitySettings, QueueSettings)
    }
    assert lists == {GPU_RESOURCES}
    for name in ("nvidia.com/gpu", "amd.com/gpu", "amd.com/cpx_nps4", "gpu.intel.com/i915",
                 "gpu.intel.com/xe", "habana.ai/gaudi"):  # fmt: skip
        assert name in GPU_RESOURCES


def test_other_vendors_devices_count_as_nvidia_gpus_do() -> None:
    rule = GpuRule(GPU_RESOURCES, [MIG_PREFIX])
    for resource in ("amd.com/gpu", "amd.com/cpx_nps4", "gpu.intel.com/i915",
                     "gpu.intel.com/xe", "habana.ai/gaudi", "nvidia.com/gpu"):  # fmt: skip
        assert gpu_summary(rule.pod_gpus(_spec({"cpu": "2", resource: "4"}))) == (4, resource)
    # two containers, two vendors' resources: both counted, both named
    both = rule.pod_gpus(_spec({"amd.com/gpu": "1"}, {"gpu.intel.com/xe": "2"}))
    assert gpu_summary(both) == (3, "amd.com/gpu,gpu.intel.com/xe")


def test_neighbour_resources_that_are_not_devices_are_not_counted() -> None:
    """Exact names, never prefixes: the monitoring resource opens every GPU of the node to a
    monitoring agent, GAS's millicores and memory are shares of one, not devices."""
    rule = GpuRule(GPU_RESOURCES, [MIG_PREFIX])
    for resource in ("gpu.intel.com/i915_monitoring", "gpu.intel.com/xe_monitoring",
                     "gpu.intel.com/millicores", "gpu.intel.com/memory.max",
                     "gpu.intel.com/tiles", "amd.com/gpu-extra", "habana.ai/gaudi-x"):  # fmt: skip
        assert rule.pod_gpus(_spec({resource: "1"})) == {}, resource


def test_a_site_sets_its_own_list_and_a_prefix_in_it_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUGAP_K8S_GPU_RESOURCES", "nvidia.com/gpu,amd.com/gpu")
    assert KubernetesSettings().gpu_resources == ["nvidia.com/gpu", "amd.com/gpu"]
    monkeypatch.setenv("GPUGAP_K8S_CAPACITY_GPU_RESOURCES", '["habana.ai/gaudi"]')
    assert CapacitySettings().gpu_resources == ["habana.ai/gaudi"]
    for bad in ("amd.com/*", "gpu.intel.com/", "nvidia.com/mig-*"):
        monkeypatch.setenv("GPUGAP_K8S_GPU_RESOURCES", bad)
        with pytest.raises(ValidationError, match="list each resource exactly"):
            KubernetesSettings()


@pytest.mark.parametrize(
    ("resource", "labels", "model", "share"),
    [
        ("amd.com/gpu", {}, MI300X, 1.0),  # unpartitioned
        ("amd.com/gpu", {AMD_PARTITION_LABEL: "spx_nps1"}, MI300X, 1.0),
        ("amd.com/gpu", {AMD_PARTITION_LABEL: "cpx_nps4"}, MI300X, 1 / 8),
        ("amd.com/gpu", {AMD_PARTITION_LABEL: "CPX_NPS1"}, MI300A, 1 / 6),
        ("amd.com/gpu", {AMD_PARTITION_LABEL: "dpx_nps2"}, None, 1 / 2),
        ("amd.com/cpx_nps4", {}, MI300X, 1 / 8),
        ("amd.com/qpx_nps1", {}, None, 1 / 4),
        ("amd.com/tpx_nps1", {}, MI300A, 1 / 3),
        # a CPX GPU whose XCDs are unknown: counted as a whole device, never guessed
        ("amd.com/cpx_nps1", {}, None, 1.0),
        ("amd.com/gpu", {AMD_PARTITION_LABEL: "cpx_nps1"}, "AMD_Radeon_PRO_W7900", 1.0),
        ("gpu.intel.com/i915", {AMD_PARTITION_LABEL: "cpx_nps4"}, MI300X, 1.0),
    ],
)
def test_an_amd_partition_is_its_share_of_its_gpu(
    resource: str, labels: dict[str, object], model: str | None, share: float
) -> None:
    assert amd_partition_share(resource, labels, model) == pytest.approx(share)


def test_node_shares_read_the_model_from_either_vendors_label() -> None:
    shares = GpuShares.of(GPU_RESOURCES, [MIG_PREFIX], MODEL_LABELS)
    amd = {"amd.com/gpu.product-name": MI300X, AMD_PARTITION_LABEL: "cpx_nps4"}
    assert shares.model(amd) == MI300X
    assert shares.gpus({"amd.com/gpu": 64, "cpu": 192}, amd) == pytest.approx(8.0)
    nvidia = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert shares.model(nvidia) == "NVIDIA-H100-80GB-HBM3"
    assert shares.gpus({"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 7}, nvidia) == 9.0
    intel = {"gpu.intel.com/i915": 4, "gpu.intel.com/i915_monitoring": 1}
    assert shares.gpus(intel, {}) == 4.0
    assert shares.model({}) is None
