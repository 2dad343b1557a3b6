"""kube-state-metrics' resource label back to the resource (producers/backfill/ksm.py): every
configured GPU resource, whoever made it, and the query that finds their pods. The label values
are kube-state-metrics v2's (every character outside ``[a-zA-Z0-9_]`` becomes ``_``:
``kube_pod_container_resource_requests{resource="nvidia_com_gpu",unit="integer"}``)."""

from __future__ import annotations

from gpugap.producers.backfill.ksm import PodView, resource_name, resource_names
from gpugap.producers.kubernetes.gpu_resources import GPU_RESOURCES, MIG_PREFIX
from gpugap.producers.kubernetes.resources import GpuRule, gpu_summary

KNOWN = resource_names(GPU_RESOURCES)


def test_each_configured_resource_is_read_back_exactly() -> None:
    for name in GPU_RESOURCES:
        assert resource_name(name.replace(".", "_").replace("/", "_"), KNOWN) == name
    # "gpu_intel_com_i915" has no <vendor>_<tld>_<name> shape: only the list can say
    assert resource_name("gpu_intel_com_i915", KNOWN) == "gpu.intel.com/i915"
    assert resource_name("amd_com_cpx_nps4", KNOWN) == "amd.com/cpx_nps4"
    assert resource_name("nvidia_com_mig_1g_10gb", KNOWN) == "nvidia.com/mig-1g.10gb"
    # not configured, or not a GPU: left as it is, so no rule counts it
    assert resource_name("gpu_intel_com_i915_monitoring", KNOWN) == "gpu_intel_com_i915_monitoring"
    assert resource_name("amd_com_gpu", resource_names(["nvidia.com/gpu"])) == "amd_com_gpu"
    assert resource_name("cpu", KNOWN) == "cpu"


def test_a_pod_view_requests_other_vendors_devices() -> None:
    view = PodView("u1")
    view.add("info", {"namespace": "ml", "pod": "p", "uid": "u1", "node": "n1"}, 1)
    for resource, n in (("gpu_intel_com_xe", 2), ("amd_com_gpu", 1), ("cpu", 4)):
        view.add("requests", {"container": "main", "resource": resource,
                              "unit": "integer" if resource != "cpu" else "core"}, n)  # fmt: skip
    view.add("requests", {"container": "mon", "resource": "gpu_intel_com_xe_monitoring",
                          "unit": "integer"}, 1)  # fmt: skip
    pod = view.pod({}, [], KNOWN)
    assert pod is not None
    rule = GpuRule(GPU_RESOURCES, [MIG_PREFIX])
    assert gpu_summary(rule.pod_gpus(pod["spec"])) == (3, "amd.com/gpu,gpu.intel.com/xe")
