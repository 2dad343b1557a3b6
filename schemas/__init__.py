"""Records, topics and the codec shared by producers, streams and sinks."""

from .codec import decode, encode
from .models import (
    Alert,
    AllocationEvent,
    Attribution,
    DeadLetter,
    GpuMinute,
    GpuSample,
    K8sPodEvent,
    MigInstance,
    NodeGpus,
    NodeSample,
    Record,
    SlurmJobEvent,
)
from .topics import TOPICS, Topic, by_name
from .types import format_utc, to_utc, utc_now

__all__ = [
    "TOPICS",
    "Alert",
    "AllocationEvent",
    "Attribution",
    "DeadLetter",
    "GpuMinute",
    "GpuSample",
    "K8sPodEvent",
    "MigInstance",
    "NodeGpus",
    "NodeSample",
    "Record",
    "SlurmJobEvent",
    "Topic",
    "by_name",
    "decode",
    "encode",
    "format_utc",
    "to_utc",
    "utc_now",
]
