"""``GPUGAP_SLURM_CAPACITY_*``, ``GPUGAP_SLURM_QUOTAS_*`` and ``GPUGAP_SLURM_METRICS_*``: the
read-only Slurm polls (node capacity, QOS and association GPU limits, slurmctld's own GPU
counts). Each has its own prefix, so one environment
can run them beside the job poller (``GPUGAP_SLURM_*``) with their own intervals."""

from __future__ import annotations

from pydantic import AnyHttpUrl, Field
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config
from gpugap.schemas.types import MAX_INTERVAL_S


class _SlurmPoll(BaseSettings):
    cluster: str | None = Field(
        default=None, description="cluster name (default GPUGAP_CLUSTER, else Slurm's ClusterName)"
    )
    scontrol: str = "scontrol"
    command_timeout_s: float = Field(default=30.0, gt=0, description="per command")


class SlurmCapacitySettings(_SlurmPoll):
    """Node capacity (``gpugap produce slurm-capacity``)."""

    model_config = env_config("GPUGAP_SLURM_CAPACITY_")

    squeue: str = "squeue"
    interval_s: float = Field(default=60.0, ge=1.0, le=MAX_INTERVAL_S, description="between polls")


class SlurmQuotaSettings(_SlurmPoll):
    """QOS and association GPU limits (``gpugap produce slurm-quotas``)."""

    model_config = env_config("GPUGAP_SLURM_QUOTAS_")

    sacctmgr: str = "sacctmgr"
    interval_s: float = Field(default=300.0, ge=1.0, le=MAX_INTERVAL_S, description="between polls")


class SlurmMetricsSettings(BaseSettings):
    """slurmctld's own GPU counts (``gpugap produce slurm-metrics``)."""

    model_config = env_config("GPUGAP_SLURM_METRICS_")

    cluster: str | None = Field(
        default=None,
        description="cluster name, as the Slurm producers name it (default GPUGAP_CLUSTER)",
    )
    url: AnyHttpUrl = Field(
        default=AnyHttpUrl("http://127.0.0.1:6817/metrics"),
        description="slurmctld's metrics root: http://<SlurmctldHost>:<SlurmctldPort>/metrics",
    )
    interval_s: float = Field(default=60.0, ge=1.0, le=MAX_INTERVAL_S, description="between polls")
    timeout_s: float = Field(default=10.0, gt=0, description="per page")
    max_page_bytes: int = Field(default=16 << 20, gt=0, description="a larger page is refused")
