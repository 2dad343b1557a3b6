"""``GPUGAP_SLURM_CAPACITY_*`` and ``GPUGAP_SLURM_QUOTAS_*``: the two read-only Slurm polls
(node capacity, QOS and association GPU limits). Each has its own prefix, so one environment
can run them beside the job poller (``GPUGAP_SLURM_*``) with their own intervals."""

from __future__ import annotations

from pydantic import Field
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
