"""``GPUGAP_SLURM_*``: the Slurm hook's and poller's settings (the hook itself reads them
with the standard library: hook.py ``HookConfig``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config


class SlurmSettings(BaseSettings):
    """The Slurm hook (``gpugap slurm-hook``) and poller (``gpugap produce slurm``).

    The hook reads the same variables without pydantic (producers/slurm/hook_command.py HookConfig):
    slurmctld runs it on every job start and end, so it imports only the standard library.
    """

    model_config = env_config("GPUGAP_SLURM_")

    cluster: str | None = Field(
        default=None, description="cluster name (default GPUGAP_CLUSTER, else Slurm's ClusterName)"
    )
    spool_dir: Path = Field(
        default=Path("/var/spool/gpugap/slurm"),
        description="hook: events Kafka did not take, and running jobs' start events",
    )
    hook_timeout_s: float = Field(
        default=2.0, gt=0, description="hook: the most it may delay a job (scontrol + Kafka)"
    )
    end_hook: Literal["jobcomp", "epilog"] = Field(
        default="jobcomp", description="which hook reports job ends (jobcomp/script is exact)"
    )
    source: Literal["auto", "pyslurm", "squeue", "scontrol"] = Field(
        default="auto", description="poller: pyslurm when it matches, else squeue --json"
    )
    scontrol: str = "scontrol"
    squeue: str = "squeue"
    sacct: str = "sacct"
    command_timeout_s: float = Field(default=30.0, gt=0, description="poller: per command")
    interval_s: float = Field(default=30.0, gt=0, description="poller: seconds between polls")
    state_file: Path | None = Field(
        default=None, description="poller: ledger of reported events (a restart re-sends nothing)"
    )
    drain_spool: bool = Field(
        default=True, description="poller: also ship the hook's spool when it is on this host"
    )
    since: datetime | None = Field(
        default=None, description="poller: first backfill history from sacct since this time"
    )
