"""Records, topics and the codec shared by producers, streams and sinks."""

from gpugap.schemas.codec import decode, encode
from gpugap.schemas.models import (
    Alert,
    AlertDelivery,
    AllocationEvent,
    Attribution,
    DeadLetter,
    DevicePartition,
    GpuMinute,
    GpuSample,
    K8sPodEvent,
    MeasuredUse,
    MigInstance,
    NodeGpus,
    NodeSample,
    Record,
    SharingPod,
    SlurmJobEvent,
)
from gpugap.schemas.topics import TOPICS, Topic, by_name
from gpugap.schemas.types import format_utc, to_utc, utc_now

__all__ = [
    "TOPICS",
    "Alert",
    "AlertDelivery",
    "AllocationEvent",
    "Attribution",
    "DeadLetter",
    "DevicePartition",
    "GpuMinute",
    "GpuSample",
    "K8sPodEvent",
    "MeasuredUse",
    "MigInstance",
    "NodeGpus",
    "NodeSample",
    "Record",
    "SharingPod",
    "SlurmJobEvent",
    "Topic",
    "by_name",
    "decode",
    "encode",
    "format_utc",
    "to_utc",
    "utc_now",
]
