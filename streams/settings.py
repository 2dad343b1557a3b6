"""``GPUGAP_WORKER_*``: the stream worker's own settings, read only here (the ground floor keeps
what two parts share: Kafka, ClickHouse, the idle policy the sink stamps too)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config


class WorkerSettings(BaseSettings):
    """``GPUGAP_WORKER_*``: the stream worker's state bounds (docs/worker.md#state-bounds)."""

    model_config = env_config("GPUGAP_WORKER_")

    node_idle_expiry_s: float = Field(
        default=3600.0,
        ge=0.0,
        le=365 * 86400.0,
        description="a node with no sample and no allocation event for this long (event time, "
        "against the worker's watermark) is forgotten once its minutes are emitted and no "
        "allocation runs on it; GPUs and pod attributions likewise; 0 = never (at least 60)",
    )
    max_nodes: int = Field(
        default=200_000,
        ge=0,
        le=100_000_000,
        description="nodes one worker holds at most: a record for a new node beyond is a dead "
        "letter with the reason; 0 = no cap",
    )
    max_gpus: int = Field(
        default=1_600_000,
        ge=0,
        le=800_000_000,
        description="GPUs one worker holds at most (over its nodes): a sample bringing a GPU "
        "beyond is a dead letter with the reason; 0 = no cap",
    )
    max_allocations: int = Field(
        default=400_000,
        ge=0,
        le=100_000_000,
        description="allocations one worker holds at most (over its nodes: running, or ended "
        "minutes ago): an event of one more is a dead letter with the reason; 0 = no cap",
    )
    max_allocations_per_node: int = Field(
        default=1_024,
        ge=1,
        le=1_000_000,
        description="allocations one node holds at most (running, or ended minutes ago): one "
        "more is a dead letter with the reason",
    )

    @field_validator("node_idle_expiry_s")
    @classmethod
    def _expiry(cls, value: float) -> float:
        if 0 < value < 60:
            raise ValueError("at least 60 seconds (or 0: never)")
        return value
