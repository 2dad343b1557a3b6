"""The per-job report as data: what ``gpugap job ID --format json`` prints and the page's
``/api/job`` answers. Every figure is in GPU-hours (physical GPU-equivalents, as the views);
the allocation's totals are its rows of ``v_capacity_gap_daily`` summed (``v_top_waste``'s)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Candidate(_Model):
    cluster: str
    allocation_id: str
    job: str = Field(description="the id as its user knows it: 12345, 12345_7#1, ns/pod")
    scheduler: str
    name: str
    owner: str
    gpus_requested: int
    start_time: datetime | None
    end_time: datetime | None
    final_state: str | None


class Ambiguous(_Model):
    """The id names several allocations (runs of a job, clusters, pods of one name)."""

    match: Literal["ambiguous"] = "ambiguous"
    id: str
    cluster: str | None
    matches: int = Field(description="how many allocations it names (the first 20 listed)")
    candidates: list[Candidate]


class Unknown(_Model):
    match: Literal["unknown"] = "unknown"
    id: str
    cluster: str | None
    message: str


class Allocation(_Model):
    cluster: str
    allocation_id: str
    job: str
    scheduler: str
    name: str = Field(description="Slurm job name, or namespace/pod")
    owner: str
    team: str
    workload_class: str
    partition: str
    qos: str
    namespace: str
    queue: str
    gang_id: str
    gpus_requested: int
    nodes: list[str]
    time_limit_s: int | None = Field(description="null: none or unlimited")
    submit_time: datetime | None
    eligible_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None = Field(description="null while it runs")
    elapsed_s: float | None
    final_state: str | None
    exit_code: int | None


class Figures(_Model):
    allocated_gpu_h: float
    measured_gpu_h: float = Field(description="allocated with telemetry")
    consumed_gpu_h: float
    gap_gpu_h: float = Field(description="measured - consumed")
    gap_pct: float | None = Field(description="100 * gap / measured; null: nothing measured")
    unmeasured_gpu_h: float
    idle_gpu_h: float = Field(description="GPU-minutes below the idle threshold, by share")
    first_day: date | None
    last_day: date | None


class GpuFigures(_Model):
    gpu_uuid: str
    node: str
    physical_uuid: str
    allocated_gpu_h: float
    measured_gpu_h: float
    consumed_gpu_h: float
    gap_gpu_h: float
    unmeasured_gpu_h: float
    idle_gpu_h: float
    utilisation: float | None = Field(description="consumed / measured")
    idle_share: float | None = Field(description="idle / measured")
    peak_activity: float | None = Field(description="p99 of its hours' highest minute")
    peak_memory_mib: float | None = Field(description="its highest minute's memory")
    needed: bool = Field(description="busy: idle in under 90 % of its measured minutes")


class GpuSeries(_Model):
    gpu_uuid: str
    node: str
    utilisation: list[float | None] = Field(description="per bucket; null: not measured")
    memory_mib: list[float | None] = Field(description="per bucket, the highest minute's")


class Series(_Model):
    start: datetime = Field(description="the first bucket's start")
    step_s: int
    points: int
    gpus: list[GpuSeries]


class Stretch(_Model):
    start: datetime
    end: datetime = Field(description="exclusive")
    minutes: int
    gpu_h: float


class Idle(_Model):
    measured_minutes: int = Field(description="minutes of the allocation with telemetry")
    idle_minutes: int = Field(description="of them, with every GPU idle")
    idle_share: float | None
    stretches: int = Field(description="idle stretches: minutes in a row, every GPU idle")
    listed_from_minutes: int
    longest: list[Stretch]


class Padding(_Model):
    time_limit_s: int
    elapsed_s: float
    limit_ratio: float
    padding_gpu_h: float = Field(description="GPUs x (limit - elapsed), v_slurm_padding")


class QueueWait(_Model):
    queue: str = Field(description="the Slurm partition, or the pod's namespace")
    waiting_since: datetime | None
    start_time: datetime | None
    wait_s: float
    gpu_h_waited: float = Field(description="GPUs x wait (a gang's: every member's GPUs)")
    held_gpu_h: float = Field(description="GPUs its gang's bound members held meanwhile")
    gang: bool


class Advice(_Model):
    kind: Literal["gpu_count", "time_limit", "gpu_share", "gpu_model", "idle_culling"]
    say: str = Field(description="the advice in a few words: 'ask for 1 GPU'")
    parameter: str
    from_value: str
    to_value: str
    apply: str = Field(description="what to write in the job script or the pod spec")
    why: str
    saved_gpu_h: float = Field(description="GPU-hours this allocation would have freed")


class OpenRecommendation(_Model):
    id: str
    kind: str
    parameter: str
    from_value: str
    to_value: str
    saved_gpu_h_per_week: float
    confidence: float
    rationale: str


class JobReport(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    match: Literal["one"] = "one"
    allocation: Allocation
    figures: Figures
    gpus: list[GpuFigures]
    series: Series | None = Field(description="null: no minute of it is stored")
    idle: Idle | None
    padding: Padding | None = Field(description="finished Slurm jobs with a limit")
    queue: QueueWait | None = Field(description="null: no submit time known")
    advice: list[Advice]
    recommendations: list[OpenRecommendation] = Field(
        description="open recommendations (gpugap recommend) for its job family or workload"
    )
    notes: list[str]


Outcome = JobReport | Ambiguous | Unknown
