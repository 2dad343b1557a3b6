"""``GPUGAP_AMDSMI_*``: the AMD node agent's settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config, optional_path


class AmdSmiSettings(BaseSettings):
    """The AMD node agent (``gpugap produce amdsmi``)."""

    model_config = env_config("GPUGAP_AMDSMI_")

    cluster: str | None = Field(default=None, description="cluster name (default GPUGAP_CLUSTER)")
    node: str | None = Field(
        default=None, description="node name (default: the host name; Kubernetes: spec.nodeName)"
    )
    interval_s: float = Field(default=10.0, ge=1.0, description="seconds between samples")
    rediscover_s: float = Field(default=60.0, gt=0, description="re-list GPUs and partitions")
    allow_no_gpu: bool = Field(default=False, description="no driver: wait instead of failing")
    pod_resources_socket: Path | None = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="kubelet PodResources socket; used when it exists (empty: never)",
    )
    pod_resources_timeout_s: float = Field(default=2.0, gt=0)
    job_mapping_dir: Path | None = Field(
        default=None, description="Slurm: one file per GPU index holding the job id"
    )
    proc_root: Path = Field(
        default=Path("/proc"),
        description="where /proc/<pid>/cgroup is read to find each GPU process's pod (in a "
        "container: the host's /proc mounted here, with hostPID)",
    )
    sys_root: Path = Field(
        default=Path("/sys"),
        description="sysfs, to name the AMD device plugin's partition ids (amdgpu_xcp_N)",
    )
    processes: bool = Field(
        default=True, description="read the process list for per-pod measured use"
    )

    _paths = field_validator("pod_resources_socket", "job_mapping_dir", mode="before")(
        optional_path
    )
