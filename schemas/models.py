"""Every record on every topic and every warehouse row: the single source of truth.

Producers build these, streams read and emit them, sinks write them. Validation is strict
where a wrong value would corrupt the numbers (ratios, times, counts, enums, GPU ids) and
every error names the field it is about.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpugap.schemas.clock import MINUTE_S
from gpugap.schemas.types import (
    MAX_ALLOCATIONS_PER_NODE,
    MAX_GANG_SIZE,
    MAX_GPU_INDEX,
    MAX_GPUS_PER_JOB,
    MAX_GPUS_PER_NODE,
    MAX_INTERVAL_S,
    MAX_LABELS,
    MAX_NODE_CPUS,
    MAX_NODE_MEMORY_MIB,
    MAX_NODES_PER_JOB,
    MAX_PARTITIONS,
    MAX_QUEUE_GPUS,
    MAX_SHARING_PODS,
    MAX_UNSUPPORTED,
    ActivityMetric,
    AlertKind,
    AlertState,
    ClusterName,
    DeadLetterKind,
    DeliveryOutcome,
    EventId,
    EventSource,
    GpuCountScope,
    GpuUuid,
    LabelKey,
    LabelValue,
    LifecycleKind,
    Name,
    NonNegFloat,
    NonNegInt,
    PartitionKind,
    PersonName,
    PodEventKind,
    PodPhase,
    QueueKind,
    QueueName,
    Ratio,
    SampleSource,
    Scheduler,
    ShareSource,
    SlurmJobState,
    StrictBool,
    StrictFloat,
    StrictInt,
    TerminationReason,
    Text,
    UtcTime,
    Vendor,
    WorkloadClass,
    vendor_of,
)


class Record(BaseModel):
    """Base of all records: immutable, strictly typed numbers, unknown fields ignored.

    Unknown fields are ignored (not rejected) so that a consumer keeps working when a
    producer adds an optional field to the same topic version; anything breaking gets a
    new topic version instead.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")


# --- device telemetry ---------------------------------------------------------------------


class MigInstance(Record):
    parent_uuid: GpuUuid
    gpu_instance_id: NonNegInt
    compute_instance_id: NonNegInt | None = None
    profile: Text | None = Field(default=None, description="e.g. '1g.10gb'")


class DevicePartition(Record):
    """A part of a physical device that is a device of its own, one of ``count`` equal parts:
    each counts ``1/count`` of its device (docs/architecture.md#gpu-equivalents-and-identities)."""

    parent_uuid: GpuUuid = Field(description="the physical device (AMD-<uuid>, XPU-<uuid>)")
    partition_id: NonNegInt = Field(le=MAX_PARTITIONS - 1)
    kind: PartitionKind
    count: int = Field(
        ge=1, le=MAX_PARTITIONS, strict=True, description="equal parts the device is divided in"
    )
    mode: Text | None = Field(default=None, max_length=16, description="AMD: DPX, QPX, CPX...")

    @model_validator(mode="after")
    def _inside(self) -> Self:
        if self.partition_id >= self.count:
            raise ValueError(f"partition_id {self.partition_id} of only {self.count} partitions")
        return self

    @property
    def share(self) -> float:
        return 1.0 / self.count


class MeasuredUse(Record):
    """One holder's own use of a device over a sample's interval, measured from its processes
    (NVML process utilization, dcgm-exporter's per-pod rows, amdsmi's process list). An entry
    naming no pod is the use of processes no pod is known for: unattributed, never billed to
    the device's holders."""

    pod_uid: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="the pod's UID, from its processes' cgroups: its identity"
    )
    pod: Name | None = None
    namespace: Name | None = None
    activity: Ratio = Field(
        description="the holder's processes' busy share of the device over the interval, in "
        "the vendor's per-process scale: streams use it only in proportion to the others'"
    )
    memory_used_mib: NonNegFloat | None = None


class SharingPod(Record):
    """Another pod the device layer says holds the same GPU (time-slicing, MPS)."""

    pod: Name
    namespace: Name | None = None
    container: Name | None = None


class Attribution(Record):
    """Who the device layer says is using a GPU (kubelet PodResources, dcgm labels, job map)."""

    pod: Name | None = None
    namespace: Name | None = None
    container: Name | None = None
    slurm_job_id: Name | None = None
    shared: tuple[SharingPod, ...] | None = Field(
        default=None,
        max_length=MAX_SHARING_PODS,
        description="the other pods holding this GPU at once (a time-sliced or MPS-shared GPU): "
        "each holder's allocation is its share of the GPU",
    )


class GpuSample(Record):
    uuid: GpuUuid
    index: NonNegInt = Field(
        le=MAX_GPU_INDEX, description="device index on the node (MIG: the parent's index)"
    )
    model: Text | None = None
    mig: MigInstance | None = None
    activity: Ratio | None = Field(default=None, description="best activity metric, 0..1")
    activity_metric: ActivityMetric | None = None
    utilization: Ratio | None = Field(default=None, description="NVML/DCGM GPU_UTIL / 100")
    memory_used_mib: NonNegFloat | None = None
    memory_total_mib: NonNegFloat | None = None
    power_w: NonNegFloat | None = None
    energy_mj: NonNegInt | None = Field(default=None, description="energy counter since boot")
    sm_clock_mhz: NonNegInt | None = None
    unsupported: tuple[Text, ...] = Field(
        default=(),
        max_length=MAX_UNSUPPORTED,
        description="fields the device could not report (NotSupported, errors)",
    )
    attribution: Attribution | None = None
    vendor: Vendor | None = Field(
        default=None, description="who made it; None: the one its uuid's prefix names"
    )
    partition: DevicePartition | None = Field(
        default=None, description="an AMD compute partition or Intel tile that is a device"
    )
    measured_use: tuple[MeasuredUse, ...] | None = Field(
        default=None,
        max_length=MAX_SHARING_PODS + 1,
        description="use measured per holder from its processes over the interval (None: "
        "nothing measured per process; empty: measured, no process used it)",
    )

    @model_validator(mode="after")
    def _metric_named(self) -> Self:
        if self.activity is not None and self.activity_metric is None:
            raise ValueError("activity_metric is required when activity is set")
        if self.mig is not None and self.partition is not None:
            raise ValueError("a device is a MIG instance or a partition, not both")
        if self.vendor is not None and self.vendor is not vendor_of(self.uuid):
            raise ValueError(f"vendor {self.vendor} but uuid {self.uuid!r} names another")
        return self


class NodeSample(Record):
    """One node at one instant: all of its GPUs (one message per node per tick)."""

    cluster: ClusterName
    node: Name
    time: UtcTime
    source: SampleSource
    interval_s: NonNegFloat | None = Field(
        default=None, le=MAX_INTERVAL_S, description="sampling interval"
    )
    gpus: tuple[GpuSample, ...] = Field(max_length=MAX_GPUS_PER_NODE)

    @model_validator(mode="after")
    def _unique_gpus(self) -> Self:
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("gpus: each GPU uuid may appear once per node sample")
        return self


def slurm_run_id(job_id: str, run: int | None = None) -> str:
    """A job id and its run: ``12`` for the first run (run 0), ``12#1`` for the run after the
    first requeue. Slurm's ids never hold ``#``: the suffix cannot meet a real id."""
    return f"{job_id}#{run}" if run else job_id


def slurm_allocation_id(cluster: str, job_id: str, run: int | None = None) -> str:
    """The id every part uses for one run of a Slurm job: ``slurm/<cluster>/<job>`` for its
    first run (the ids before runs existed), ``slurm/<cluster>/<job>#<run>`` for a later one
    (``run``: Slurm's restart count, see docs/architecture.md#slurm-job-runs)."""
    return f"slurm/{cluster}/{slurm_run_id(job_id, run)}"


def k8s_allocation_id(cluster: str, uid: str) -> str:
    """The id every part uses for a Kubernetes pod's allocation."""
    return f"k8s/{cluster}/{uid}"


# --- scheduler events ---------------------------------------------------------------------


def _unique(values: tuple[Any, ...] | None, what: str) -> None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError(f"{what}: each GPU may appear once")


class NodeGpus(Record):
    node: Name
    gpu_indices: tuple[Annotated[NonNegInt, Field(le=MAX_GPU_INDEX)], ...] = Field(
        default=(), max_length=MAX_GPUS_PER_NODE
    )

    @model_validator(mode="after")
    def _unique_gpus(self) -> Self:
        _unique(self.gpu_indices, "gpu_indices")
        return self


class SlurmJobEvent(Record):
    """A Slurm job started or ended. Hooks and the poller emit identical event_ids."""

    event_id: EventId
    kind: LifecycleKind
    time: UtcTime = Field(description="event time: start_time for start, end_time for end")
    source: EventSource
    cluster: ClusterName
    job_id: Name = Field(description="Slurm's job id as printed, e.g. '1234', '1234_7', '1234+1'")
    run: NonNegInt | None = Field(
        default=None,
        description="the run: Slurm's restart count (requeues before it); None or 0: the "
        "first run. Each run is an allocation of its own",
    )
    array_job_id: NonNegInt | None = None
    array_task_id: NonNegInt | None = None
    het_job_id: NonNegInt | None = None
    het_job_offset: NonNegInt | None = None
    user: Name | None = None
    account: Name | None = None
    partition: Name | None = None
    qos: Name | None = None
    job_name: Text | None = None
    nodes: tuple[NodeGpus, ...] = Field(default=(), max_length=MAX_NODES_PER_JOB)
    gpus_total: NonNegInt = Field(default=0, le=MAX_GPUS_PER_JOB)
    time_limit_s: NonNegInt | None = Field(default=None, description="None = unlimited")
    submit_time: UtcTime | None = None
    eligible_time: UtcTime | None = Field(
        default=None,
        description="when the job could first start (after --begin, holds, dependencies): "
        "its wait for resources starts here",
    )
    start_time: UtcTime | None = None
    end_time: UtcTime | None = None
    state: SlurmJobState
    exit_code: StrictInt | None = None
    interactive: StrictBool = False
    workload_class: WorkloadClass | None = Field(default=None, description="explicit override")

    @property
    def allocation_id(self) -> str:
        return slurm_allocation_id(self.cluster, self.job_id, self.run)

    @model_validator(mode="after")
    def _times_for_kind(self) -> Self:
        if self.kind is LifecycleKind.START and self.start_time is None:
            raise ValueError("start_time is required for a start event")
        if self.kind is LifecycleKind.END and self.end_time is None:
            raise ValueError("end_time is required for an end event")
        return self


class K8sPodEvent(Record):
    """A pod transition that matters for GPU accounting (bound, running, terminated, deleted)."""

    event_id: EventId
    kind: PodEventKind
    time: UtcTime
    source: EventSource
    cluster: ClusterName
    uid: Name
    namespace: Name
    name: Name
    node: Name | None = None
    phase: PodPhase
    created_time: UtcTime | None = Field(
        default=None, description="metadata.creationTimestamp: its wait for a node starts here"
    )
    gpus: NonNegInt = Field(default=0, le=MAX_GPUS_PER_NODE, description="a pod runs on one node")
    gpu_resource: Text | None = Field(
        default=None, description="'nvidia.com/gpu', 'nvidia.com/mig-1g.10gb'"
    )
    reason: TerminationReason | None = None
    owner_kind: Text | None = None
    owner_name: Text | None = None
    workload_class: WorkloadClass | None = None
    owner: PersonName | None = None
    team: PersonName | None = None
    gang_id: Text | None = None
    gang_size: NonNegInt | None = Field(default=None, le=MAX_GANG_SIZE)
    queue: Name | None = Field(
        default=None,
        description="its queue manager's queue: Kueue LocalQueue, KAI or Volcano queue",
    )
    resource_version: Text | None = None
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description="the pod labels the producer carries (GPUGAP_K8S_CARRY_LABELS)",
    )

    @property
    def allocation_id(self) -> str:
        return k8s_allocation_id(self.cluster, self.uid)

    @model_validator(mode="after")
    def _node_when_bound(self) -> Self:
        if self.kind in (PodEventKind.BOUND, PodEventKind.RUNNING) and self.node is None:
            raise ValueError("node is required once a pod is bound")
        return self


# --- stream outputs -----------------------------------------------------------------------


class AllocationEvent(Record):
    """GPUs on one node taken or released by one allocation (re-keyed by node)."""

    event_id: EventId
    kind: LifecycleKind
    time: UtcTime
    cluster: ClusterName
    node: Name
    scheduler: Scheduler
    allocation_id: EventId = Field(
        description="'slurm/<cluster>/<job>' ('slurm/<cluster>/<job>#<run>' for a run after a "
        "requeue) or 'k8s/<cluster>/<uid>'"
    )
    gpus: NonNegInt = Field(le=MAX_GPUS_PER_NODE)
    gpu_indices: tuple[NonNegInt, ...] | None = Field(
        default=None, max_length=MAX_GPUS_PER_NODE, description="Slurm: indices"
    )
    gpu_uuids: tuple[GpuUuid, ...] | None = Field(
        default=None, max_length=MAX_GPUS_PER_NODE, description="when known"
    )
    workload_class: WorkloadClass
    owner: PersonName | None = None
    team: PersonName | None = None
    gang_id: Text | None = None
    gang_size: NonNegInt | None = Field(default=None, le=MAX_GANG_SIZE)
    name: Text | None = None
    namespace: Name | None = Field(default=None, description="Kubernetes: the pod's namespace")
    time_limit_s: NonNegInt | None = None
    partition: Name | None = Field(default=None, description="Slurm: the job's partition")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description="Kubernetes: the pod's carried labels; Slurm: slurm.account, slurm.qos",
    )

    @model_validator(mode="after")
    def _unique_gpus(self) -> Self:
        _unique(self.gpu_indices, "gpu_indices")
        _unique(self.gpu_uuids, "gpu_uuids")
        return self


class GpuMinute(Record):
    """One GPU, one minute (and one allocation, where the minute is split between several)."""

    cluster: ClusterName
    node: Name
    gpu_uuid: GpuUuid
    minute: UtcTime
    allocated_s: StrictFloat = Field(
        ge=0.0,
        le=float(MINUTE_S),
        description="GPU-equivalent seconds the allocation held it: seconds x gpu_share",
    )
    consumed_gpu_s: StrictFloat = Field(
        ge=0.0, le=float(MINUTE_S), description="GPU-equivalent seconds: activity x allocated_s"
    )
    unallocated_s: StrictFloat = Field(
        default=0.0,
        ge=0.0,
        le=float(MINUTE_S),
        description="rows without allocation_id: GPU-equivalent seconds no allocation held",
    )
    device_s: StrictFloat | None = Field(
        default=None,
        ge=0.0,
        le=float(MINUTE_S),
        description="seconds of the minute this row covers on the device itself (a MIG slice: "
        "slice-seconds; 0 for the part of a partitioned GPU in no slice); None from releases "
        "before shares: then allocated_s + unallocated_s",
    )
    gpu_share: Ratio = Field(
        default=1.0,
        description="the part of a physical GPU each second of this row counts for: a MIG "
        "slice's share of its GPU, a time-sliced GPU's share per holder (1: a whole GPU)",
    )
    physical_uuid: GpuUuid | None = Field(
        default=None,
        description="a MIG slice's or partition's physical GPU (None: gpu_uuid is the GPU)",
    )
    vendor: Vendor | None = Field(default=None, description="None: the one gpu_uuid names")
    share_source: ShareSource | None = Field(
        default=None,
        description="how a GPU several allocations held at once was split between them "
        "(None: held alone, or nobody's)",
    )
    activity_avg: Ratio | None = None
    activity_max: Ratio | None = None
    activity_metric: ActivityMetric | None = None
    memory_used_mib_avg: NonNegFloat | None = None
    power_w_avg: NonNegFloat | None = None
    sample_count: NonNegInt
    no_samples: StrictBool = Field(
        description="no activity reading for this minute (none, or samples without activity: "
        "NVML on a MIG slice): consumption unknown"
    )
    measured_s: StrictFloat | None = Field(
        default=None,
        ge=0.0,
        le=float(MINUTE_S),
        description="GPU-equivalent seconds of this row some sample with an activity reading "
        "covered (coverage by the second); the rest of its seconds are unmeasured, never zero "
        "use. None from releases before: the whole row, unless no_samples",
    )
    allocation_id: EventId | None = None
    scheduler: Scheduler | None = None
    workload_class: WorkloadClass | None = None
    owner: PersonName | None = None
    team: PersonName | None = None
    gang_id: Text | None = None
    idle_threshold: Ratio | None = Field(
        default=None, description="the idle policy the stream judged this minute by"
    )
    idle_after_minutes: NonNegInt | None = Field(
        default=None, description="idle minutes before an alert, by the same policy"
    )

    @model_validator(mode="after")
    def _minute_aligned(self) -> Self:
        if self.minute.second or self.minute.microsecond:
            raise ValueError("minute must be aligned to a whole minute")
        if self.consumed_gpu_s > self.allocated_s + 1e-9 and self.allocation_id is not None:
            raise ValueError("consumed_gpu_s cannot exceed allocated_s for an allocation")
        if self.measured_s is not None:
            if self.measured_s > self.allocated_s + self.unallocated_s + 1e-9:
                raise ValueError("measured_s cannot exceed the row's seconds")
            if self.consumed_gpu_s > self.measured_s + 1e-9:
                raise ValueError("consumed_gpu_s cannot exceed measured_s")
        return self

    @property
    def measured(self) -> float:
        """The row's measured GPU-equivalent seconds; rows from before coverage by the second
        (``measured_s`` None) are measured whole unless ``no_samples``."""
        if self.measured_s is not None:
            return self.measured_s
        return 0.0 if self.no_samples else self.allocated_s + self.unallocated_s


class IdlePolicy(Record):
    """The idle policy an idle-GPU alert was judged by: its class's, or a rule's over it."""

    threshold: Ratio
    minutes: NonNegInt = Field(description="idle minutes before the alert opened")
    remind_minutes: tuple[NonNegInt, ...] = Field(default=(), max_length=20)
    rule: Text | None = Field(default=None, description="the GPUGAP_IDLE_RULES rule that matched")


class Alert(Record):
    """An alert's lifecycle: the same alert_id opens, updates and resolves."""

    alert_id: EventId
    kind: AlertKind
    state: AlertState
    time: UtcTime
    opened_at: UtcTime
    resolved_at: UtcTime | None = None
    cluster: ClusterName
    scheduler: Scheduler
    allocation_id: EventId | None = None
    gang_id: Text | None = None
    owner: PersonName | None = None
    team: PersonName | None = None
    workload_class: WorkloadClass | None = None
    nodes: tuple[Name, ...] = Field(default=(), max_length=MAX_GANG_SIZE)
    gpus: tuple[GpuUuid, ...] = Field(default=(), max_length=MAX_GPUS_PER_JOB)
    idle_minutes: NonNegInt = 0
    idle_gpu_hours: NonNegFloat = 0.0
    pending_pods: NonNegInt | None = None
    running_pods: NonNegInt | None = None
    message: Text = ""
    policy: IdlePolicy | None = Field(default=None, description="idle GPUs: the policy applied")


def episode_start(alert: Alert) -> str:
    """When an idle episode began: the last part of its alert id (``idle_gpu/.../<start>``)."""
    return alert.alert_id.rsplit("/", 1)[1]


class AlertDelivery(Record):
    """One alert state sent to one notification target: the audit trail, and the ledger a
    restarted notifier reads so that nothing is sent twice to a direct target."""

    alert_id: EventId
    state: AlertState
    target: Name = Field(description="the notifier's name: alertmanager, slack, webhook, email")
    time: UtcTime = Field(description="when the target answered")
    outcome: DeliveryOutcome
    code: int | None = Field(default=None, ge=0, le=999, description="HTTP status, SMTP reply")
    detail: Text = ""
    attempts: int = Field(default=1, ge=1)
    reminder_minutes: int | None = Field(
        default=None, ge=1, description="a reminder at this many idle minutes (an update)"
    )
    alert: Alert = Field(description="what was sent (a restarted notifier re-sends open ones)")


class DeadLetter(Record):
    """A record that could not be processed, with everything needed to replay it."""

    time: UtcTime = Field(description="when it was dead-lettered")
    source_topic: Text
    partition: NonNegInt | None = None
    offset: NonNegInt | None = None
    key_b64: str | None = None
    value_b64: str
    kind: DeadLetterKind
    reason: Text
    consumer: Text | None = Field(default=None, description="which part routed it")


# --- recommendations ----------------------------------------------------------------------


class RecommendationTarget(Record):
    """What a recommendation is about: a Slurm job family (cluster, user, account, job name,
    partition) or partition, or a Kubernetes workload (namespace, owner kind and name)."""

    kind: Text = Field(description="slurm_job_family | slurm_partition | k8s_workload")
    scheduler: Scheduler
    cluster: ClusterName
    user: Text | None = None
    account: Text | None = None
    job_name: Text | None = None
    partition: Text | None = None
    namespace: Text | None = None
    owner_kind: Text | None = Field(default=None, description="Deployment, Notebook, PyTorchJob")
    owner_name: Text | None = None


class RecommendationChange(Record):
    parameter: Text = Field(
        description="time_limit_s, gpus, gpu_profile, idle_cull_minutes, replicas_by_hour, "
        "scheduler"
    )
    from_value: Text
    to_value: Text


class RecommendationEvidence(Record):
    """What the recommendation rests on: a query anyone can run and the sample it read."""

    query: Text = Field(description="SQL over the warehouse views, values inlined")
    since: UtcTime
    until: UtcTime
    history_days: NonNegFloat
    allocations: NonNegInt = Field(description="jobs or pods in the sample")
    samples: NonNegInt = Field(description="what the confidence counts: jobs, episodes")
    hours: NonNegFloat = Field(description="wall-clock hours of the sample")
    gpu_hours: NonNegFloat = Field(description="GPU-hours allocated in the sample")
    spread: NonNegFloat = Field(default=0.0, description="coefficient of variation of the basis")
    figures: dict[Text, float] = Field(default_factory=dict, max_length=32)


class Recommendation(Record):
    """A change for a person to review; gpugap never applies it. The same target and change
    always get the same id, so recomputing replaces, never duplicates."""

    id: EventId
    kind: Text = Field(
        description="slurm_time_limit, gpu_count, gpu_share, idle_culling, service_schedule, "
        "placement, gpu_model, cpus_per_gpu, pack_nodes"
    )
    target: RecommendationTarget
    workload_class: WorkloadClass
    change: RecommendationChange
    evidence: RecommendationEvidence
    saved_gpu_hours_per_week: NonNegFloat
    confidence: Ratio
    rationale: Text = ""
    apply: Text = Field(default="", description="what a person runs to apply it")
    computed_at: UtcTime


# --- boundary transfers (cost, docs/cost.md) ------------------------------------------------

#: bytes one transfer record may carry (1 EiB: far beyond any billing line or counter interval)
MAX_TRANSFER_BYTES = 1 << 60
#: seconds one transfer may span (a monthly billing line)
MAX_TRANSFER_INTERVAL_S = 31 * 86_400.0
Environment = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")]


class Transfer(Record):
    """Bytes moved between two environments (on-prem, a cloud, the internet) in one interval:
    a cloud billing egress line, or an interface counter's increase on a node. The event id
    makes a re-import or a re-delivery change nothing."""

    event_id: EventId
    time: UtcTime = Field(description="start of the interval the bytes were moved in")
    interval_s: NonNegFloat = Field(default=0.0, le=MAX_TRANSFER_INTERVAL_S)
    cluster: ClusterName
    from_env: Environment = Field(description="where the bytes left: 'onprem', 'cloud'...")
    to_env: Environment
    bytes: NonNegInt = Field(le=MAX_TRANSFER_BYTES)
    source: Name = Field(description="billing_csv, node_exporter")
    node: Name | None = None
    interface: Annotated[str, Field(max_length=64)] | None = None
    team: PersonName | None = None
    owner: PersonName | None = None
    allocation_id: EventId | None = None
    description: Text | None = Field(default=None, description="the billing line's usage type")
    billed_cost: NonNegFloat | None = Field(default=None, description="what the bill says")
    billed_currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] | None = None

    @model_validator(mode="after")
    def _two_sides(self) -> Self:
        if self.from_env == self.to_env:
            raise ValueError("from_env and to_env must differ (a transfer crosses a boundary)")
        return self


# --- node capacity and queues (the waste beyond idle: docs/architecture.md#stranded-gpus) -----


class NodeAllocation(Record):
    """What one allocation holds of one node: its GPUs (GPU-equivalents), CPUs and memory."""

    allocation_id: EventId
    gpus: NonNegFloat = Field(le=MAX_GPUS_PER_NODE, description="GPU-equivalents (a slice: 1/7)")
    cpus: NonNegFloat = Field(le=MAX_NODE_CPUS, description="Slurm: CPUs allocated; pods: requests")
    memory_mib: NonNegFloat = Field(le=MAX_NODE_MEMORY_MIB)


class NodeCapacity(Record):
    """One node's GPUs, CPUs and memory and what each allocation holds of them, at one instant
    (a poll of ``scontrol show node``/``-d show job``, or of the node's allocatable and its
    pods' requests). It stands for ``interval_s`` seconds from ``time``: stranded GPU-hours
    are its stranded GPUs times that (docs/architecture.md#stranded-gpus)."""

    cluster: ClusterName
    node: Name
    time: UtcTime
    interval_s: NonNegFloat = Field(gt=0, le=MAX_INTERVAL_S, description="until the next poll")
    scheduler: Scheduler
    source: Name = Field(description="slurm_scontrol, kubernetes")
    pool: Name | None = Field(
        default=None, description="Slurm: the node's partitions (comma-joined); K8s: node pool"
    )
    gpu_model: Text | None = Field(default=None, description="as the scheduler names it")
    gpu_memory_mib: NonNegFloat | None = Field(
        default=None,
        le=MAX_NODE_MEMORY_MIB,
        description="one GPU's memory, where known (GPU feature discovery's nvidia.com/gpu.memory)",
    )
    gpus: NonNegFloat = Field(le=MAX_GPUS_PER_NODE, description="physical GPUs it offers")
    cpus: NonNegFloat = Field(le=MAX_NODE_CPUS, description="schedulable CPUs")
    memory_mib: NonNegFloat = Field(le=MAX_NODE_MEMORY_MIB, description="schedulable memory")
    schedulable: StrictBool = Field(
        default=True,
        description="False: down, drained, cordoned or not ready: its free GPUs are "
        "unavailable, not stranded",
    )
    allocations: tuple[NodeAllocation, ...] = Field(default=(), max_length=MAX_ALLOCATIONS_PER_NODE)

    @model_validator(mode="after")
    def _unique_allocations(self) -> Self:
        ids = [a.allocation_id for a in self.allocations]
        if len(set(ids)) != len(ids):
            raise ValueError("allocations: each allocation may appear once per node")
        return self


class SchedulerGpuCount(Record):
    """The scheduler's own count of the GPUs its running jobs hold, at one instant, over one
    scope (slurmctld's OpenMetrics GPU gauges, Slurm 26.05+: ``slurm_partition_jobs_gpus_alloc``
    and the like). gpugap checks its own allocations against it (v_scheduler_drift)."""

    cluster: ClusterName
    time: UtcTime
    interval_s: NonNegFloat = Field(gt=0, le=MAX_INTERVAL_S, description="until the next poll")
    scheduler: Scheduler
    source: Name = Field(description="slurmctld_metrics")
    scope: GpuCountScope
    name: Name | None = Field(
        default=None, description="the partition, account, user or node; None for the cluster"
    )
    gpus_allocated: NonNegFloat = Field(le=MAX_QUEUE_GPUS)
    gpus_total: NonNegFloat | None = Field(
        default=None, le=MAX_QUEUE_GPUS, description="what the scope has (partitions, nodes)"
    )

    @model_validator(mode="after")
    def _named_unless_cluster(self) -> Self:
        if (self.scope is GpuCountScope.CLUSTER) != (self.name is None):
            raise ValueError("name: required for every scope but the cluster's, which has none")
        return self


class QueueQuota(Record):
    """A queue's GPU entitlement and, where its manager reports it, what it holds, at one
    instant: a Kueue ClusterQueue (per flavor) or LocalQueue, a KAI or Volcano Queue, a Slurm
    QOS or association with a ``gres/gpu`` GrpTRES. Allocations join it by their queue
    (docs/architecture.md#quota-held-but-unused)."""

    cluster: ClusterName
    time: UtcTime
    interval_s: NonNegFloat = Field(gt=0, le=MAX_INTERVAL_S, description="until the next poll")
    kind: QueueKind
    queue: QueueName = Field(
        description="the object's name; an association: account or account/user"
    )
    namespace: Name | None = Field(default=None, description="Kueue LocalQueue's namespace")
    parent: Name | None = Field(
        default=None,
        description="Kueue: the ClusterQueue's cohort or the LocalQueue's ClusterQueue; KAI: the "
        "parent queue; Volcano: the parent queue",
    )
    flavor: Name | None = Field(default=None, description="Kueue ResourceFlavor")
    resource: Text = Field(description="'nvidia.com/gpu', 'gres/gpu', 'gres/gpu:a100'")
    entitled_gpus: NonNegFloat | None = Field(
        default=None,
        le=MAX_QUEUE_GPUS,
        description="nominalQuota, KAI deserved quota, Volcano deserved (else guarantee), "
        "Slurm GrpTRES; None: no entitlement stated",
    )
    limit_gpus: NonNegFloat | None = Field(
        default=None,
        le=MAX_QUEUE_GPUS,
        description="the most it may hold: nominal + borrowingLimit, KAI limit, Volcano "
        "capability, Slurm GrpTRES",
    )
    held_gpus: NonNegFloat | None = Field(
        default=None, le=MAX_QUEUE_GPUS, description="what its manager says it holds"
    )
    borrowed_gpus: NonNegFloat | None = Field(default=None, le=MAX_QUEUE_GPUS)
    pending_workloads: NonNegInt | None = Field(default=None, description="waiting to be admitted")
    admitted_workloads: NonNegInt | None = None
