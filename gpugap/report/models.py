"""The report as data: what ``gpugap report --format json`` prints and ``--schema`` describes.

Every figure is in GPU-hours (DESIGN.md). A gap % is the gap over the *measured* allocated
GPU-hours (allocated time with telemetry): time without telemetry is reported as unmeasured,
never counted as idle or as consumed. Lists are ranked by absolute gap, never by percentage.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1
Dimension = Literal["class", "scheduler", "team", "cluster", "allocation"]
DIMENSIONS: tuple[str, ...] = ("class", "scheduler", "team", "cluster", "allocation")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Window(_Model):
    since: datetime | None = Field(description="start as asked (UTC); null: from the first data")
    until: datetime | None = Field(description="end as asked (UTC), exclusive; null: up to now")
    hour_from: datetime | None = Field(
        description="start widened to the whole hour (the views' grain); null: unbounded"
    )
    hour_to: datetime | None = Field(description="end widened to the whole hour, exclusive")
    data_from: datetime | None = Field(description="the first day any data exists")
    latest_minute: datetime | None = Field(
        description="the latest GPU-minute stored: what the 'now' sections are as of"
    )


class Gap(_Model):
    key: str = Field(description="the group's value ('all' for totals, 'other (N)' for the rest)")
    allocated_gpu_h: float
    measured_gpu_h: float = Field(description="allocated with telemetry")
    consumed_gpu_h: float
    gap_gpu_h: float = Field(description="measured - consumed")
    gap_pct: float | None = Field(description="100 * gap / measured; null when nothing measured")
    unmeasured_gpu_h: float = Field(description="allocated without telemetry")
    idle_gpu_h: float = Field(description="allocated GPU-minutes below the idle threshold")


class AllocationWaste(_Model):
    rank: int
    cluster: str
    allocation_id: str
    name: str = Field(description="Slurm job name, or namespace/pod; '' if unknown")
    scheduler: str
    workload_class: str
    owner: str
    team: str
    gpus_requested: int | None
    final_state: str | None = Field(description="null while it runs (or its end is unknown)")
    gap: Gap


class OwnerWaste(_Model):
    rank: int
    owner: str = Field(description="'' when the scheduler named nobody")
    teams: list[str]
    allocations: int
    gap: Gap


class Capacity(_Model):
    capacity_gpu_h: float = Field(description="GPU-hours of every GPU that reported: held + not")
    allocated_gpu_h: float
    unallocated_gpu_h: float = Field(description="GPU-hours no allocation held")
    unallocated_pct: float | None
    unattributed_gpu_h: float = Field(
        description="activity on GPUs no allocation held (missing events, or work outside "
        "the scheduler)"
    )


class NodeUse(_Model):
    cluster: str
    node: str
    unallocated_gpu_h: float
    unattributed_gpu_h: float


class PaddingRow(_Model):
    user: str
    account: str
    jobs: int
    median_limit_ratio: float = Field(description="time limit / elapsed, median over the jobs")
    padding_gpu_h: float = Field(description="GPUs x (limit - elapsed), summed")


class Padding(_Model):
    jobs: int = Field(description="finished Slurm jobs with a time limit, ended in the window")
    median_limit_ratio: float | None
    padding_gpu_h: float
    rows: list[PaddingRow] = Field(description="per user and account, most padding first")


class IdleAllocation(_Model):
    cluster: str
    allocation_id: str
    name: str
    scheduler: str
    workload_class: str
    owner: str
    team: str
    gpus: int
    activity: float = Field(description="consumed / measured over its idle window, 0..1")
    last_minute: datetime
    idle_minutes: int = Field(
        description="its idle window: every measured GPU-minute of its last idle_minutes of "
        "data was below idle_threshold (its idle rule's, else its class's; 10 by default)"
    )
    idle_threshold: float = Field(description="its idle threshold, 0..1 (0.05 by default)")


class IdleNow(_Model):
    allocations: int
    gpus: int
    rows: list[IdleAllocation] = Field(description="most GPUs first")


class PartialGang(_Model):
    cluster: str
    gang_id: str
    owner: str
    team: str
    workload_class: str
    running_pods: int | None
    pending_pods: int | None
    nodes: int
    opened_at: datetime
    held_gpu_h: float = Field(description="GPU-hours the running pods held idle so far")


class PartialGangsNow(_Model):
    gangs: int
    held_gpu_h: float
    rows: list[PartialGang] = Field(description="most GPU-hours held first")


class LostRow(_Model):
    key: str = Field(
        description="the cause, class, team ('' when the scheduler named none) or queue "
        "('cluster/partition' or 'cluster/namespace')"
    )
    runs: int = Field(description="runs (allocations) that ended so in the window")
    lost_gpu_h: float = Field(description="the GPU-hours they held: lost unless checkpointed")
    consumed_gpu_h: float = Field(description="what they consumed of them")


class LostWork(_Model):
    """Runs that did not finish by their own doing (v_lost_work), ended in the window."""

    runs: int
    lost_gpu_h: float = Field(description="every GPU-hour the runs held, wherever it fell")
    consumed_gpu_h: float
    by_cause: list[LostRow] = Field(
        description="preempted, requeued, node_failure, evicted, oom_killed: most lost first"
    )
    by_class: list[LostRow] = Field(description="per workload class, most lost first")
    by_team: list[LostRow] = Field(description="most lost first, the top teams")
    by_queue: list[LostRow] = Field(
        description="per Slurm partition or namespace, with its cluster: the top, most lost first"
    )


class StrandedRow(_Model):
    key: str = Field(description="the allocation ('cluster/allocation id') or the node")
    team: str = ""
    owner: str = ""
    stranded_cpu_gpu_h: float = Field(description="GPU-hours stranded by its CPUs beyond share")
    stranded_memory_gpu_h: float = Field(description="by its memory beyond share")


class Stranded(_Model):
    """Free GPUs nobody could use (v_stranded), polled in the window."""

    allocated_gpu_h: float
    usable_free_gpu_h: float = Field(description="free GPUs with CPUs and memory beside them")
    stranded_cpu_gpu_h: float
    stranded_memory_gpu_h: float
    unavailable_gpu_h: float = Field(description="free GPUs on down, drained, cordoned nodes")
    by_allocation: list[StrandedRow] = Field(description="who stranded them: the top")
    by_node: list[StrandedRow] = Field(description="where: the top nodes")


class SpreadRow(_Model):
    unit: str = Field(description="'cluster/run' or 'cluster/gang'")
    team: str
    owner: str
    nodes: int
    min_nodes: int = Field(description="nodes of the largest it ran on that would hold it")
    gpus: float
    allocated_gpu_h: float


class QueueRow(_Model):
    queue: str = Field(description="'cluster/kind/namespace/queue' (namespace: Kueue LocalQueue)")
    parent: str = Field(description="cohort, ClusterQueue or parent queue")
    entitled_gpu_h: float
    allocated_gpu_h: float = Field(description="held by the work it entitles")
    consumed_gpu_h: float
    unused_gpu_h: float = Field(description="entitlement nobody in the queue held")
    borrowed_gpu_h: float
    lent_gpu_h: float = Field(description="its unused entitlement its siblings borrowed")
    pending_workload_h: float = Field(description="workload-hours waiting to be admitted")
    waited_gpu_h: float = Field(description="GPU-hours its started work waited")


class BeyondIdle(_Model):
    """The waste beyond idle allocations (docs/architecture.md#stranded-gpus)."""

    stranded: Stranded
    spread: list[SpreadRow] = Field(description="work on more nodes than it needed: the top")
    queues: list[QueueRow] = Field(description="queues by unused entitlement, the top")


class DriftRow(_Model):
    """gpugap's allocated GPUs against the scheduler's own count at its latest poll
    (v_scheduler_drift), where they disagree."""

    cluster: str
    scope: str = Field(description="cluster, partition, account or user")
    name: str
    time: datetime = Field(description="the scheduler's poll")
    scheduler_gpus: float
    gpugap_gpus: float
    drift_gpus: float = Field(description="gpugap less the scheduler")


class Report(_Model):
    """Allocated vs consumed GPU-hours, and where the gap is."""

    schema_version: Literal[1] = SCHEMA_VERSION
    window: Window
    by: Dimension
    top: int = Field(description="how many rows each ranked list keeps")
    totals: Gap
    breakdown: list[Gap] = Field(
        description="per value of `by`, largest gap first; the rest summed in one 'other' row"
    )
    top_allocations: list[AllocationWaste]
    top_owners: list[OwnerWaste]
    capacity: Capacity
    unattributed_nodes: list[NodeUse] = Field(description="nodes by unattributed use")
    slurm_padding: Padding
    idle_now: IdleNow
    partial_gangs_now: PartialGangsNow
    lost_work: LostWork = Field(
        description="work lost to preemption, requeue, eviction, node failure and OOM"
    )
    beyond_idle: BeyondIdle = Field(
        description="stranded GPUs, work spread thin, quota held but unused"
    )
    scheduler_drift: list[DriftRow] = Field(
        default_factory=list,
        description="where gpugap's allocated GPUs and the scheduler's own count disagree, at "
        "its latest poll in the window (empty: they agree, or nothing polled it)",
    )


def report_schema() -> dict[str, Any]:
    """The JSON Schema of ``gpugap report --format json`` (``gpugap report --schema``)."""
    schema = Report.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"urn:gpugap:report:v{SCHEMA_VERSION}"
    schema["title"] = "gpugap report"
    return schema
