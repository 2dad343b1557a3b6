"""The shapes of the worker's state: what a checkpoint holds, in one place.

TypedDicts, not classes: the state is the JSON a snapshot writes (streams/join.py), and a
checkpoint written by an earlier release must restore into this one, so the dicts stay plain
dicts and the key order stays the order they are built in (the snapshot bytes depend on it).
Keys marked ``NotRequired`` are added later in a state's life, or were added in a later
release, so a state restored from an older checkpoint may lack them.

Times are epoch milliseconds (``schemas.clock``); ids are the records' own.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from gpugap.schemas.models import AllocationEvent
from gpugap.streams.window import Sample

#: an idle run of one GPU of one allocation: [first idle minute (ms), idle minutes so far,
#: their GPU-equivalent seconds] (runs kept before shares lack the third: whole GPUs)
IdleRun = list[Any]
#: a spell of samples naming one pod (namespace/name) on one GPU: [first, last sample time]
Span = list[int]


class AllocState(TypedDict):
    """One allocation on one node, as its events described it."""

    id: str
    cluster: str
    scheduler: str  # a Scheduler value
    cls: str  # a WorkloadClass value
    owner: str | None
    team: str | None
    gang_id: str | None
    name: str | None
    namespace: str | None
    gpus: int
    indices: list[int] | None  # Slurm's GPU indices on this node
    uuids: list[str] | None
    start: int | None
    end: int | None
    #: the end event (its JSON) of an allocation whose start has not been seen yet: refused
    #: once its minute closes with still no start
    orphan: dict[str, Any] | None
    events: list[str]  # event ids applied (duplicates are ignored)
    #: only when the event gave them (snapshots of allocations without stay as they were)
    partition: NotRequired[str]
    labels: NotRequired[dict[str, str]]


def new_alloc_state(ev: AllocationEvent) -> AllocState:
    st: AllocState = {
        "id": ev.allocation_id,
        "cluster": ev.cluster,
        "scheduler": ev.scheduler.value,
        "cls": ev.workload_class.value,
        "owner": ev.owner,
        "team": ev.team,
        "gang_id": ev.gang_id,
        "name": ev.name,
        "namespace": ev.namespace,
        "gpus": ev.gpus,
        "indices": list(ev.gpu_indices) if ev.gpu_indices is not None else None,
        "uuids": list(ev.gpu_uuids) if ev.gpu_uuids else None,
        "start": None,
        "end": None,
        "orphan": None,
        "events": [],
    }
    if ev.partition is not None:
        st["partition"] = ev.partition
    if ev.labels:
        st["labels"] = dict(ev.labels)
    return st


class Episode(TypedDict):
    """One node's idle episode of one allocation (overlapping runs of its GPUs)."""

    alloc: str
    start: int  # the first idle minute
    end: int  # the end of the last idle minute
    opened: int  # the end of the minute its first run reached N idle minutes
    gpus: list[str]
    done_s: float  # idle GPU-equivalent seconds of the runs that have ended


class IdleState(TypedDict, total=False):
    runs: dict[str, IdleRun]  # "allocation|gpu" -> its current idle run
    episodes: dict[str, Episode]  # allocation id -> its open episode


class NodeState(TypedDict):
    """One node's core (``streams.core.NodeCore``)."""

    cluster: str
    node: str
    max_ms: int | None  # max event time seen
    first_ms: int | None  # earliest data before anything closed
    closed_ms: int | None  # every minute before this is closed
    interval_ms: int | None
    index: dict[str, str]  # str(gpu index) -> uuid (non-MIG GPUs)
    known: dict[str, int]  # uuid -> first millisecond it reported (capacity from there on)
    samples: dict[str, list[Sample]]  # uuid -> its buffered samples, sorted by time
    #: "namespace/pod" -> {uuid: its spells, oldest first}: the samples' attribution names a
    #: pod, not its UID; a pod allocation holds the GPUs its name was seen on in its own
    #: lifetime (a pod recreated under the name is another allocation: streams.rows.held).
    #: Before spans, a checkpoint held {uuid: last sample time} (upgrade_node_state)
    attrib: dict[str, dict[str, list[Span]]]
    #: MIG slice uuid -> [its physical GPU's uuid, its share of it] (a whole GPU: absent)
    slices: NotRequired[dict[str, list[Any]]]
    allocs: dict[str, AllocState]
    #: allocation id -> end, of allocations no longer held in "allocs"
    ended: NotRequired[dict[str, int]]
    idle: IdleState
    counts: dict[str, int]
    judged_ms: NotRequired[int]  # every minute before this has been through the idle alerts
    #: the latest node sample's time, and the last few gaps between node samples (ms): the
    #: idle alerts wait one observed interval for a minute's covering sample (core.alert_wait)
    sampled_ms: NotRequired[int]
    gaps: NotRequired[list[int]]


def new_node_state(cluster: str, node: str) -> NodeState:
    return {
        "cluster": cluster,
        "node": node,
        "max_ms": None,
        "first_ms": None,
        "closed_ms": None,
        "interval_ms": None,
        "index": {},
        "known": {},
        "samples": {},
        "attrib": {},
        "allocs": {},
        "ended": {},
        "idle": {},
        "counts": {},
    }


def upgrade_node_state(s: NodeState) -> NodeState:
    """A node's state as an earlier release wrote it, in this release's shape (in place).

    Pod attributions were ``{uuid: last sample time}``: the time the name was first seen on
    the GPU was not kept. Each becomes one span from the earliest start of the allocations
    of that name held (else its last time) to its last time: the allocations of the name
    that had started by then hold the GPU (up to their GPU count), as before the restore;
    what is seen after it is matched by lifetime."""
    attrib: dict[str, Any] = s["attrib"]
    for key, gpus in attrib.items():
        if not any(type(v) is int for v in gpus.values()):
            continue
        starts = [
            a["start"]
            for a in s["allocs"].values()
            if a["start"] is not None and f"{a['namespace'] or ''}/{a['name']}" == key
        ]
        first = min(starts, default=None)
        for u, last in gpus.items():
            if type(last) is int:
                gpus[u] = [[min(first, last) if first is not None else last, last]]
    return s


#: one bound pod of a gang: [bound at (ms), node, GPUs]
BoundPod = list[int | str]


class GangAlert(TypedDict):
    opened: int
    since: int  # when the gang became partial
    gpus: int  # GPUs held when the alert opened


class Gang(TypedDict):
    bound: dict[str, BoundPod]  # pod uid -> where it holds GPUs
    ended: list[str]  # uids of pods that terminated or were deleted
    events: list[str]  # event ids applied
    alert: GangAlert | None
    since: int | None  # when the current partial spell began
    size: int
    meta: dict[str, Any]  # the gang's first pod event (its JSON): what alerts name


class GangsState(TypedDict):
    gangs: dict[str, Gang]  # "cluster/gang id" -> the gang, while it is being watched
    done: dict[str, int]  # gangs complete or gone -> when (later events are ignored)
    max_ms: int | None


class MergedNode(TypedDict):
    """What one node's episode last reported."""

    gpus: list[str]
    idle_h: float  # idle GPU-hours
    open: bool  # not resolved yet


class Merged(TypedDict):
    """One allocation's idle episode merged over its nodes (``streams.merge_alerts``)."""

    start: str  # wire-format times (schemas.types.format_utc): they are the alert id's
    end: str
    pending: bool  # every node's episode is over: resolve once no run can join any more
    nodes: dict[str, MergedNode]
    last: dict[str, Any]  # the last alert (its JSON)
    opened: NotRequired[str]
    #: the start its alert id was made from, once an earlier start came in after it opened
    id: NotRequired[str]
    time: NotRequired[str]  # the latest time its alert has carried


class ProcessorState(TypedDict):
    nodes: dict[str, NodeState]  # "cluster/node" -> its core
    gangs: GangsState | None  # None only until the Processor has built its tracker
    max_ms: int | None
    merge: NotRequired[dict[str, Merged]]  # allocation id -> its merged episode
    #: allocation id -> [start, end] of its last resolved episodes (replays are dropped)
    merged: NotRequired[dict[str, list[list[str]]]]
    #: shard -> [its last watermark (None: it holds no node), final], for the merger
    marks: NotRequired[dict[str, list[Any]]]
    sources: NotRequired[int]  # how many shards send marks
    #: totals of the nodes dropped (streams.process: the node expiry), and the shard's own
    counts: NotRequired[dict[str, int]]
    #: the latest closed frontier of a node dropped: a node not held starts there at the
    #: earliest (the minutes before may have been emitted by a dropped node)
    expired_ms: NotRequired[int]
