"""Field types shared by every record: UTC times, GPU ids, names, enums."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, Field, PlainSerializer, Strict, StringConstraints

from gpugap.schemas.clock import HOUR_S, MILLISECOND_US

_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
#: A device's identity, its vendor named by its prefix (docs/architecture.md#one-busy-scale):
#: NVIDIA ``GPU-<uuid>``, ``MIG-<uuid>`` (R470+ drivers) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (older
#: drivers); AMD ``AMD-<uuid>`` (a GPU, or a compute partition with a UUID of its own: ROCm 7.0
#: on) or ``AMD-<uuid>/<partition>`` (a partition of the GPU with that UUID); Intel
#: ``XPU-<uuid>`` (a card) or ``XPU-<uuid>/<tile>`` (a tile that is a device of its own).
GPU_UUID_PATTERN = (
    rf"^(GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/\d+/\d+"
    rf"|AMD-{_HEX_UUID}(/\d{{1,2}})?|XPU-{_HEX_UUID}(/\d{{1,2}})?)$"
)


def _require_utc_ms(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            "timestamp must be timezone-aware (UTC, e.g. '2026-01-01T00:00:00Z'), got a naive time"
        )
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond - value.microsecond % MILLISECOND_US)


def format_utc(value: datetime) -> str:
    """ISO 8601 with millisecond precision and a ``Z``: the one wire format for times."""
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // MILLISECOND_US:03d}Z"


#: A timezone-aware UTC instant with millisecond precision; naive times are rejected.
UtcTime = Annotated[
    datetime,
    AfterValidator(_require_utc_ms),
    PlainSerializer(format_utc, return_type=str, when_used="json"),
]

# --- names: one normal form, compared and shown alike ---------------------------------------

#: characters no name shows: controls, format (zero-width, bidi, word joiner), separators of
#: lines and paragraphs, surrogates, private use
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
#: a cluster name: what a Kafka topic name may hold (deploy/kafka-acls/kafka-acls.sh), from a
#: letter or digit
CLUSTER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def normal_text(value: str) -> str:
    """A name as it is compared and shown: NFKC (full-width and compatibility forms as their
    plain letters, a no-break space as a space), invisible characters dropped, controls and
    line breaks as spaces, runs of whitespace as one space, none at the ends."""
    if value.isascii() and value.isprintable() and value.strip() == value and "  " not in value:
        return value  # the common case, untouched
    out = []
    for ch in unicodedata.normalize("NFKC", value):
        category = unicodedata.category(ch)
        if category in ("Cf", "Cs", "Co"):
            continue
        out.append(" " if category in _INVISIBLE or ch.isspace() else ch)
    return " ".join("".join(out).split())


def _normal_name(value: str) -> str:
    """A name of a thing (node, user, namespace...): its normal form, which must be one word
    of visible characters."""
    normal = normal_text(value)
    if any(ch.isspace() for ch in normal):
        raise ValueError(f"a name holds no whitespace or control characters: {value!r}")
    return normal


GpuUuid = Annotated[str, StringConstraints(pattern=GPU_UUID_PATTERN)]
#: Node, user, namespace... names: in normal form (normal_text), one word, non-empty, no '/'
#: (used in keys).
Name = Annotated[
    str,
    AfterValidator(_normal_name),
    StringConstraints(min_length=1, max_length=253, pattern=r"^[^/\s][^/]*$"),
]
#: A queue's name: a Name, or ``account/user`` for a Slurm user's association
QueueName = Annotated[
    str,
    AfterValidator(_normal_name),
    StringConstraints(min_length=1, max_length=512, pattern=r"^[^/\s][^/]*(/[^/]+)?$"),
]
#: A cluster's name: a Name that is also a topic name's part (CLUSTER_PATTERN).
ClusterName = Annotated[
    str,
    AfterValidator(_normal_name),
    StringConstraints(min_length=1, max_length=253, pattern=CLUSTER_PATTERN),
]
#: Who and which team (from labels, annotations, Slurm): free text in normal form.
PersonName = Annotated[str, AfterValidator(normal_text), StringConstraints(max_length=4096)]
Text = Annotated[str, StringConstraints(max_length=4096)]
# Numbers are strict: a string where a number belongs is a producer bug, not data to coerce.
Ratio = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0.0)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
StrictInt = Annotated[int, Strict()]
StrictFloat = Annotated[float, Strict()]
StrictBool = Annotated[bool, Strict()]
EventId = Annotated[str, StringConstraints(min_length=1, max_length=512)]
#: a label's key and value (Kubernetes: prefix/name up to 253+1+63, values up to 63)
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]
LabelValue = Annotated[str, StringConstraints(max_length=256)]

# Bounds of what a real estate produces; a record past one is invalid (a dead letter with the
# field named), so one record can never make the stream fabricate unbounded output.
#: GPUs on one node (a DGX B200 has 8; 8 GPUs x 7 MIG slices = 56; room for denser nodes)
MAX_GPUS_PER_NODE = 256
#: pods sharing one time-sliced GPU (the device plugin's replicas; 48 is the most we know of)
MAX_SHARING_PODS = 64
#: partitions of one device (an 8-XCD MI300X in CPX has 8; Intel Max has 2 tiles)
MAX_PARTITIONS = 64
#: GPU index on a node (MIG slices carry their parent's index)
MAX_GPU_INDEX = 1023
#: nodes in one Slurm job (the largest machines have ~10,000 nodes)
MAX_NODES_PER_JOB = 65_536
#: GPUs of one Slurm job over all its nodes
MAX_GPUS_PER_JOB = 1_000_000
#: members of one gang (training job) and nodes or GPUs one alert names
MAX_GANG_SIZE = 100_000
#: seconds one sample may describe: agents sample every 1-60 s; beyond an hour is no sample
MAX_INTERVAL_S = float(HOUR_S)
#: fields one GPU sample may list as unsupported
MAX_UNSUPPORTED = 64
#: labels carried on one pod or allocation (the ones the idle policy's rules may match)
MAX_LABELS = 32
#: allocations one node capacity record may list (Kubernetes' default is 110 pods a node)
MAX_ALLOCATIONS_PER_NODE = 1024
#: CPUs, MiB of memory and GPUs a node or a queue may state (far beyond any machine or quota)
MAX_NODE_CPUS = 1 << 20
MAX_NODE_MEMORY_MIB = float(1 << 40)
MAX_QUEUE_GPUS = float(MAX_GPUS_PER_JOB)


def utc_now() -> datetime:
    return _require_utc_ms(datetime.now(UTC))


def to_utc(value: datetime) -> datetime:
    """Validate and normalise a time exactly as records do (aware, UTC, milliseconds)."""
    return _require_utc_ms(value)


class Scheduler(StrEnum):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


class WorkloadClass(StrEnum):
    BATCH = "batch"
    SERVICE = "service"
    INTERACTIVE = "interactive"


class Vendor(StrEnum):
    """Who made a device: named by its identity's prefix (``vendor_of``)."""

    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"


_VENDOR_PREFIX = {"GPU-": Vendor.NVIDIA, "MIG-": Vendor.NVIDIA, "AMD-": Vendor.AMD}
_VENDOR_PREFIX["XPU-"] = Vendor.INTEL


def vendor_of(uuid: str) -> Vendor:
    """The vendor a device identity names (GPU_UUID_PATTERN); NVIDIA for anything else, as
    every identity was before other vendors."""
    return _VENDOR_PREFIX.get(uuid[:4], Vendor.NVIDIA)


class ActivityMetric(StrEnum):
    """Which device metric an activity value came from (DESIGN.md; one busy scale:
    docs/architecture.md#one-busy-scale). NVIDIA's best first."""

    SM_ACTIVE = "sm_active"  # DCGM_FI_PROF_SM_ACTIVE
    GR_ENGINE_ACTIVE = "gr_engine_active"  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
    UTILIZATION = "utilization"  # NVML utilization.gpu or DCGM_FI_DEV_GPU_UTIL, / 100
    #: AMD: the GFX engine's busy percent / 100 (amdsmi gfx_activity, gpu_gfx_activity)
    GFX_ACTIVITY = "gfx_activity"
    #: AMD compute partition: its XCCs' instantaneous busy percent, averaged, / 100
    #: (amdsmi xcp_stats gfx_busy_inst, gpu_gfx_busy_instantaneous): only partition 0 has
    #: gfx_activity
    GFX_BUSY_INST = "gfx_busy_inst"
    #: Intel: the compute engine group's active time over the interval (XPU Manager
    #: engine_group_ratio type=compute, hw_gpu_task=compute-all; Level Zero COMPUTE_ALL)
    COMPUTE_ENGINE_GROUP = "compute_engine_group"
    #: Intel, where the compute group is not reported: any engine active (engine_ratio,
    #: hw_gpu_task=all)
    ALL_ENGINES = "all_engines"


class SampleSource(StrEnum):
    NVML = "nvml"
    DCGM = "dcgm"
    #: AMD's node agent (producers/amdsmi) and device-metrics-exporter (producers/amd_exporter)
    AMDSMI = "amdsmi"
    AMD_EXPORTER = "amd_exporter"
    #: Intel XPU Manager's exporter, 1.x (xpum_*) or 2.x (hw_*) (producers/xpum)
    XPUM = "xpum"
    SIMULATOR = "simulator"


class PartitionKind(StrEnum):
    """A part of a physical device that is a device of its own (NVIDIA's MIG has MigInstance)."""

    #: an AMD Instinct compute partition (DPX/QPX/CPX): some of the device's XCDs
    AMD_COMPUTE = "amd_compute"
    #: one tile of an Intel Data Center GPU Max, where tiles are devices (FLAT hierarchy)
    INTEL_TILE = "intel_tile"


class ShareSource(StrEnum):
    """How a GPU held by several allocations at once was split between them (GpuMinute)."""

    #: each holder its equal share of each moment: nothing per process was measured
    EVEN = "even"
    #: busy time by what each holder's processes measured, the rest by holding
    MEASURED = "measured"
    #: part of the row's seconds measured, part even
    MIXED = "mixed"


class EventSource(StrEnum):
    """Who observed a scheduler event: several may report the same one (dedupe is by event_id)."""

    HOOK = "hook"
    POLLER = "poller"
    #: Slurm's own jobcomp/kafka records (producers/slurm/jobcomp_producer.py)
    JOBCOMP = "jobcomp"
    WATCH = "watch"
    SIMULATOR = "simulator"


class LifecycleKind(StrEnum):
    """Start/end of something that holds GPUs (a Slurm job, an allocation)."""

    START = "start"
    END = "end"


class SlurmJobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    #: the run was requeued (scontrol requeue, RequeueExit, a federation requeue): it ended,
    #: and the job runs again as its next run (a new allocation, see SlurmJobEvent.run)
    REQUEUED = "REQUEUED"


class PodEventKind(StrEnum):
    BOUND = "bound"  # scheduled onto a node: from here the pod holds its GPUs
    RUNNING = "running"
    TERMINATED = "terminated"
    DELETED = "deleted"


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class TerminationReason(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    OOM_KILLED = "oom_killed"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    #: its node no longer exists: the pod garbage collector deleted it (DisruptionTarget
    #: DeletionByPodGC, kube-controller-manager's podgc), or Kueue evicted its workload for its
    #: nodes' failure (TerminationTarget WorkloadEvictedDueToNodeFailures): a node failure
    NODE_LOST = "node_lost"
    DELETED = "deleted"
    UNKNOWN = "unknown"


class QueueKind(StrEnum):
    """The object that entitles a queue to GPUs (docs/architecture.md#quota-held-but-unused)."""

    KUEUE_CLUSTER_QUEUE = "kueue_cluster_queue"
    KUEUE_LOCAL_QUEUE = "kueue_local_queue"
    KAI_QUEUE = "kai_queue"
    VOLCANO_QUEUE = "volcano_queue"
    SLURM_QOS = "slurm_qos"
    SLURM_ASSOCIATION = "slurm_association"


class GpuCountScope(StrEnum):
    """What a scheduler's own count of allocated GPUs is over (SchedulerGpuCount)."""

    CLUSTER = "cluster"
    PARTITION = "partition"
    ACCOUNT = "account"
    USER = "user"
    NODE = "node"


class AlertKind(StrEnum):
    IDLE_GPU = "idle_gpu"
    PARTIAL_GANG = "partial_gang"


class AlertState(StrEnum):
    OPEN = "open"
    UPDATE = "update"
    RESOLVED = "resolved"


class DeliveryOutcome(StrEnum):
    """What became of one alert state sent to one notification target."""

    DELIVERED = "delivered"  # the target acknowledged it (2xx, SMTP 250)
    REFUSED = "refused"  # the target refused it for good (4xx, a bad address): dead-lettered


class DeadLetterKind(StrEnum):
    MALFORMED = "malformed"  # not JSON
    SCHEMA = "schema"  # JSON that breaks the topic's schema
    UNKNOWN_TOPIC = "unknown_topic"  # a topic or version this build does not know
    LATE = "late"  # valid but later than the allowed lateness
    REJECTED = "rejected"  # valid but refused by a processing step (reason says why)
    UNTRUSTED = "untrusted"  # valid, but claims a cluster its topic may not speak for
