"""Which extended resources are accelerators: the one list every Kubernetes producer reads
(the pod watcher, node capacity, queue quotas, the kube-state-metrics backfill).

Each name is matched exactly, never as a prefix: device plugins register neighbours that are
not devices (Intel's ``gpu.intel.com/i915_monitoring`` hands a container every GPU of the node
for monitoring; ``gpu.intel.com/millicores`` and ``gpu.intel.com/memory.max`` are GPU Aware
Scheduling's shares of one). A pod holds as many devices as it requests of a listed resource,
whoever made them: an AMD compute partition (``amd.com/gpu`` under the plugin's "single"
naming, ``amd.com/cpx_nps4`` under "mixed") or an Intel tile (FLAT mode) is one device, and
what it is worth of its card comes from the samples' partition (``GpuSample.partition``).
NVIDIA's MIG profiles are the only prefix (``nvidia.com/mig-``, "mixed" strategy: one resource
per profile, too many to list).

``habana.ai/gaudi`` is listed: a Gaudi held is an accelerator held, so its allocations, queue
waits and stranding count. gpugap reads no Gaudi telemetry, so all of its time is unmeasured
(docs/architecture.md); leave it out of ``*_GPU_RESOURCES`` to not count Gaudi at all.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import CommaList, comma_list

NVIDIA_GPU = "nvidia.com/gpu"
#: NVIDIA's device plugin, MIG "mixed" strategy: one resource per profile
MIG_PREFIX = "nvidia.com/mig-"
AMD_GPU = "amd.com/gpu"
#: AMD's device plugin (ROCm/k8s-device-plugin) with ``resource_naming_strategy=mixed`` names a
#: partitioned GPU's partitions after their compute and memory modes (8 MI300X in CPX-NPS4:
#: ``amd.com/cpx_nps4: 64``); unpartitioned GPUs stay ``amd.com/gpu``
AMD_COMPUTE_MODES = ("spx", "dpx", "tpx", "qpx", "cpx")
AMD_MEMORY_MODES = ("nps1", "nps2", "nps4")
AMD_PARTITION_RESOURCES = tuple(
    f"amd.com/{compute}_{memory}" for compute in AMD_COMPUTE_MODES for memory in AMD_MEMORY_MODES
)
#: Intel's GPU plugin: a GPU under the i915 or the xe kernel driver
INTEL_GPU_RESOURCES = ("gpu.intel.com/i915", "gpu.intel.com/xe")
#: Intel Gaudi (Habana's device plugin): counted, never measured (see above)
GAUDI = "habana.ai/gaudi"
GPU_RESOURCES = (NVIDIA_GPU, AMD_GPU, *AMD_PARTITION_RESOURCES, *INTEL_GPU_RESOURCES, GAUDI)
#: node labels naming the GPU model, first present wins: NVIDIA's GPU feature discovery
#: ("NVIDIA-H100-80GB-HBM3"), AMD's node labeller ("AMD_Instinct_MI300X_OAM")
MODEL_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name")

# a resource name as Kubernetes validates it: an optional DNS-subdomain prefix, then a name
_RESOURCE = re.compile(
    r"^(?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _exact_names(value: list[str]) -> list[str]:
    for name in value:
        if not _RESOURCE.match(name):
            raise ValueError(
                f"{name!r} is not a resource name: list each resource exactly "
                "(prefixes go in GPU_RESOURCE_PREFIXES)"
            )
    return value


class GpuResourceSettings(BaseSettings):
    """``GPU_RESOURCES`` and ``GPU_RESOURCE_PREFIXES`` under each producer's own prefix."""

    gpu_resources: CommaList = Field(
        default_factory=lambda: list(GPU_RESOURCES),
        description="extended resources counted as accelerators, each named exactly",
    )
    gpu_resource_prefixes: CommaList = Field(
        default_factory=lambda: [MIG_PREFIX],
        description="resource name prefixes counted too (NVIDIA's MIG profiles)",
    )

    _gpu_lists = field_validator("gpu_resources", "gpu_resource_prefixes", mode="before")(
        comma_list
    )
    _gpu_names = field_validator("gpu_resources")(_exact_names)


#: AMD's node labeller, on a node whose GPUs share one partition mode ("cpx_nps4")
AMD_PARTITION_LABEL = "amd.com/compute-memory-partition"
#: partitions one GPU makes in each compute mode; CPX makes one per XCD (accelerator complex
#: die): 6 on an MI300A, 8 on the MI300X, MI325X, MI350X and MI355X
_PARTITIONS = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4}
_CPX_XCDS = (("MI300A", 6), ("MI3", 8))


def amd_partition_share(resource: str, node_labels: dict[str, object], model: str | None) -> float:
    """What one unit of an AMD resource is worth of its GPU: 1 unpartitioned, 1/N for a
    partition (mode from the mixed name, else from the node labeller's label); 1 where the
    mode or a CPX GPU's XCD count is unknown (the unit is then counted as a whole device)."""
    if resource == AMD_GPU:
        label = node_labels.get(AMD_PARTITION_LABEL)
        mode = label.lower() if isinstance(label, str) else ""
    elif resource in AMD_PARTITION_RESOURCES:
        mode = resource.removeprefix("amd.com/")
    else:
        return 1.0
    compute = mode.partition("_")[0]
    if compute == "cpx":
        name = (model or "").upper()
        parts = next((n for key, n in _CPX_XCDS if key in name), None)
    else:
        parts = _PARTITIONS.get(compute)
    return 1.0 / parts if parts else 1.0
