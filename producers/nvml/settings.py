"""``GPUGAP_NVML_*``: the NVML node agent's settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config, optional_path


class NvmlSettings(BaseSettings):
    """The NVML node agent (``gpugap produce nvml``)."""

    model_config = env_config("GPUGAP_NVML_")

    cluster: str | None = Field(default=None, description="cluster name (default GPUGAP_CLUSTER)")
    node: str | None = Field(
        default=None, description="node name (default: the host name; Kubernetes: spec.nodeName)"
    )
    interval_s: float = Field(default=10.0, ge=1.0, description="seconds between samples")
    rediscover_s: float = Field(default=60.0, gt=0, description="re-list GPUs and MIG devices")
    allow_no_gpu: bool = Field(default=False, description="no driver: wait instead of failing")
    pod_resources_socket: Path | None = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="kubelet PodResources socket; used when it exists (empty: never)",
    )
    pod_resources_timeout_s: float = Field(default=2.0, gt=0)
    job_mapping_dir: Path | None = Field(
        default=None, description="Slurm: dcgm-exporter hpc-job-mapping directory"
    )
    process_use: bool = Field(
        default=True,
        description="measure each pod's use of a whole GPU from its processes (one more NVML "
        "call per GPU per poll, plus reading /proc/<pid>/cgroup of each process on a GPU)",
    )
    proc_root: Path = Field(
        default=Path("/proc"),
        description="the host's /proc (PIDs -> pods via cgroups): needs hostPID or a mount",
    )

    _paths = field_validator("pod_resources_socket", "job_mapping_dir", mode="before")(
        optional_path
    )
