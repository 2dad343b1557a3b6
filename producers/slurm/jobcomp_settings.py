"""``GPUGAP_SLURM_JOBCOMP_*``: the consumer of Slurm's own jobcomp/kafka records
(``gpugap produce slurm-jobcomp``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AnyHttpUrl, Field, SecretStr
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config
from gpugap.schemas.types import MAX_INTERVAL_S


class SlurmJobcompSettings(BaseSettings):
    model_config = env_config("GPUGAP_SLURM_JOBCOMP_")

    cluster: str | None = Field(
        default=None,
        description="cluster name (default GPUGAP_CLUSTER, else the records' own `cluster`, "
        "which Slurm writes only where slurmdbd runs)",
    )
    topic: str | None = Field(
        default=None,
        description="the topic of end records, JobCompParams topic= (Slurm's default: the "
        "ClusterName)",
    )
    start_topic: str | None = Field(
        default=None,
        description="the topic of start records, JobCompParams topic_job_start= (Slurm's "
        "default: <ClusterName>-job-start)",
    )
    group: str | None = Field(
        default=None, description="consumer group (default gpugap-slurm-jobcomp-<cluster>)"
    )
    scontrol: str = Field(
        default="scontrol",
        description="asked (read-only) which GPUs a starting job holds and which run it is",
    )
    command_timeout_s: float = Field(
        default=10.0, gt=0, description="per scontrol call or slurmrestd request"
    )
    slurmrestd_url: AnyHttpUrl | None = Field(
        default=None,
        description="ask slurmrestd (auth/jwt) instead of scontrol: http://host:port",
    )
    slurmrestd_token: SecretStr | None = Field(
        default=None, description="a JWT for slurmrestd (`scontrol token`); read-only use"
    )
    slurmrestd_token_file: Path | None = Field(
        default=None, description="a file holding that JWT (read at start)"
    )
    slurmrestd_api: str = Field(
        default="v0.0.45", pattern=r"^v0\.0\.[0-9]{2}$", description="slurmrestd's API version"
    )
    state_file: Path | None = Field(
        default=None,
        description="runs, running jobs' starts and published ids: a restart re-sends nothing "
        "and an end finds its start's GPUs (without it, they are kept in memory only)",
    )
    end_check_s: float = Field(
        default=600.0,
        ge=10.0,
        le=MAX_INTERVAL_S,
        description="a start without an end this long is checked with scontrol: an end "
        "slurmctld reports is published from it",
    )
