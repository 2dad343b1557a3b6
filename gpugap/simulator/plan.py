"""The plan: every allocation of the simulated window, placed on concrete GPUs.

Workload patterns (``patterns.py``) submit requests; the placer starts each as soon as GPUs
are free (all parts at once: multi-node jobs and gangs are all-or-nothing), in start order,
like a scheduler that knows the future. A request that cannot start before the horizon never
starts (a pending job that emits nothing). The result is the simulator's model: holdings per
device, from which both the events and the ground truth are derived.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gpugap.simulator.activity import Program
from gpugap.simulator.estate import Device, Estate, Node

INF = 10**12  # "does not end within the horizon"


@dataclass(eq=False, slots=True)
class Holding:
    """One device held (or used without an allocation) from ``start`` to ``end``."""

    device: Device
    start: int
    end: int
    program: Program
    memory_mib: float
    alloc: Allocation | None  # None: unattributed use on a GPU nobody holds
    #: ',"attribution":{...}' as dcgm-exporter's pod labels would say it (Kubernetes only)
    attribution: bytes = b""
    #: activity (thousandths) -> this device's JSON in a node sample, for the fast path
    cache: dict[int, bytes] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class SlurmJob:
    job_id: str
    partition: str
    qos: str
    job_name: str
    limit_s: int
    submit: int
    state: str
    exit_code: int | None
    interactive: bool = False
    array_job_id: int | None = None
    array_task_id: int | None = None


@dataclass(eq=False, slots=True)
class Pod:
    uid: str
    namespace: str
    name: str
    owner_kind: str
    owner_name: str
    gpu_resource: str
    gpus: int
    container: str = "main"
    gang_id: str | None = None
    gang_size: int | None = None
    running_at: int | None = None
    terminated_at: int | None = None
    deleted_at: int | None = None
    reason: str | None = None  # TerminationReason
    end_phase: str = "Succeeded"


@dataclass(eq=False, slots=True)
class Allocation:
    id: str  # 'slurm/<cluster>/<job>' or 'k8s/<cluster>/<uid>' (as AllocationEvent)
    scheduler: str
    cluster: str
    pattern: str
    workload_class: str
    owner: str
    team: str
    name: str
    start: int
    end: int
    holdings: list[Holding] = field(default_factory=list)
    job: SlurmJob | None = None
    pod: Pod | None = None

    @property
    def devices(self) -> list[Device]:
        return [h.device for h in self.holdings]


@dataclass(eq=False, slots=True)
class Gang:
    """A distributed training job whose pods were not all scheduled at once."""

    id: str
    cluster: str
    namespace: str
    owner: str
    team: str
    size: int
    pods: list[Allocation] = field(default_factory=list)
    pending: list[Pod] = field(default_factory=list)  # never bound
    partial_from: int = 0
    partial_to: int = INF  # all bound, or the gang deleted
    gave_up: bool = False


@dataclass(eq=False)
class Plan:
    estate: Estate
    horizon: int
    allocations: list[Allocation] = field(default_factory=list)
    unattributed: list[Holding] = field(default_factory=list)
    gangs: list[Gang] = field(default_factory=list)
    never_started: int = 0

    def hold(self, alloc: Allocation | None, device: Device, h: Holding) -> None:
        device.timeline.append(h)
        device.free_at = h.end
        if alloc is not None:
            alloc.holdings.append(h)
        else:
            self.unattributed.append(h)


Realize = Callable[[int, list[list[Device]]], None]


@dataclass(eq=False, slots=True)
class Request:
    """GPUs wanted at once: ``parts`` devices on one node each (distinct nodes if asked)."""

    start: int
    pool: list[Node]
    parts: list[int]
    realize: Realize
    distinct_nodes: bool = True
    deadline: int = INF
    on_drop: Callable[[], None] | None = None


class Placer:
    def __init__(self, plan: Plan, seed: str) -> None:
        self.plan = plan
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = 0
        self._rng = random.Random(seed)

    def submit(self, req: Request) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (req.start, self._seq, req))

    def at(self, t: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the placer reaches time ``t`` (e.g. release GPUs at t)."""
        self.submit(Request(t, [], [], lambda _t, _d: fn()))

    def run(self) -> None:
        while self._heap:
            t, _, req = heapq.heappop(self._heap)
            if not req.parts:
                req.realize(t, [])
                continue
            placed = self._fit(req, t)
            if placed is not None:
                req.realize(t, placed)
                continue
            later = self._earliest(req, t)
            if later is None or later > min(req.deadline, self.plan.horizon):
                self.plan.never_started += 1
                if req.on_drop is not None:
                    req.on_drop()
                continue
            req.start = later
            self.submit(req)

    def _earliest(self, req: Request, t: int) -> int | None:
        """The first time after ``t`` at which, all else equal, the request fits: the
        n-th earliest node on which the largest part fits (jumping there directly instead of
        retrying at every GPU release keeps a saturated cluster cheap to plan)."""
        size, n = max(req.parts), len(req.parts)
        ready = sorted(
            sorted(d.free_at for d in node.devices)[size - 1]
            for node in req.pool
            if len(node.devices) >= size
        )
        if len(ready) < n:
            return None
        return max(ready[n - 1], t + 1)

    def _fit(self, req: Request, t: int) -> list[list[Device]] | None:
        pool = req.pool
        if not pool:
            return None
        first = self._rng.randrange(len(pool))  # spread work over the nodes
        want = sorted(req.parts, reverse=True)
        got: list[list[Device]] = []
        for i in range(len(pool)):
            node = pool[(first + i) % len(pool)]
            free = [d for d in node.devices if d.free_at <= t]
            while want and len(free) >= want[0]:
                n = want.pop(0)
                got.append(free[:n])
                free = free[n:]
                if req.distinct_nodes:
                    break
            if not want:
                return got
        return None
