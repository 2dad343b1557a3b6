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
from fractions import Fraction

from gpugap.simulator.activity import Program
from gpugap.simulator.estate import Device, Estate, Node
from gpugap.simulator.resources import EVEN, PerGpu, Sampler, gpu_equivalent

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
    #: per node: the CPUs and memory (MiB) it holds there (resources.py)
    cpus: dict[str, Fraction] = field(default_factory=dict)
    memory_mib: dict[str, Fraction] = field(default_factory=dict)

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
    #: jobs and pods holding CPUs and memory of a GPU node and no GPU (``cpu_only``)
    cpu_only: list[Allocation] = field(default_factory=list)
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
    #: CPUs and memory per GPU-equivalent (default: drawn by the workload's sampler)
    per_gpu: PerGpu | None = None
    #: a CPU-only request (parts [0]): the CPUs and memory (MiB) it holds
    cpu_only: tuple[Fraction, Fraction] | None = None
    #: where ``_fit`` placed each part (for a CPU-only part, which has no devices)
    nodes: list[Node] = field(default_factory=list)
    sampler: Sampler | None = None


class Placer:
    def __init__(self, plan: Plan, seed: str) -> None:
        self.plan = plan
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = 0
        self._rng = random.Random(seed)
        #: the sampler of the workload submitting (set per pattern, then per request run)
        self.sampler: Sampler | None = None

    def submit(self, req: Request) -> None:
        self._seq += 1
        if req.sampler is None:
            req.sampler = self.sampler
        if req.per_gpu is None and req.parts and req.cpu_only is None:
            req.per_gpu = req.sampler.draw() if req.sampler is not None else EVEN
        heapq.heappush(self._heap, (req.start, self._seq, req))

    def at(self, t: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the placer reaches time ``t`` (e.g. release GPUs at t)."""
        self.submit(Request(t, [], [], lambda _t, _d: fn()))

    def run(self) -> None:
        while self._heap:
            t, _, req = heapq.heappop(self._heap)
            self.sampler = req.sampler  # what a request submits from its realize draws alike
            if not req.parts:
                req.realize(t, [])
                continue
            placed = self._fit(req, t)
            if placed is not None:
                req.realize(t, placed)
                self._claim(req, placed)
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
            max(
                sorted(d.free_at for d in node.devices)[size - 1] if size else t,
                self._room_from(node, t, node.devices[:size], req),
            )
            for node in req.pool
            if len(node.devices) >= size
        )
        if len(ready) < n:
            return None
        return max(ready[n - 1], t + 1)

    # --- CPUs and memory beside the GPUs (resources.py) ----------------------------------

    def _demand(self, node: Node, devices: list[Device], req: Request) -> tuple[Fraction, Fraction]:
        if req.cpu_only is not None:
            return req.cpu_only
        per = req.per_gpu or EVEN
        if all(d.parent_uuid is None for d in devices):  # whole GPUs (the common case: fast)
            return per.of(node, Fraction(len(devices)))
        return per.of(node, sum((gpu_equivalent(d) for d in devices), Fraction(0)))

    @staticmethod
    def _holders(node: Node, t: int) -> list[Allocation]:
        """The allocations holding some of ``node`` at ``t`` (while planning at ``t``)."""
        out: dict[int, Allocation] = {}
        for d in node.devices:
            if d.free_at > t and d.timeline and d.timeline[-1].alloc is not None:
                a = d.timeline[-1].alloc
                out[id(a)] = a
        for a in node.cpu_only:
            if a.start <= t < a.end:
                out[id(a)] = a
        return list(out.values())

    def _uneven(self, node: Node, req: Request) -> bool:
        """Whether CPUs or memory could be short: some allocation on the node, or this one,
        holds other than its GPUs' share (else the GPUs' fit implies theirs)."""
        return node.uneven or req.cpu_only is not None or not (req.per_gpu or EVEN).even

    def _room(
        self, node: Node, t: int, devices: list[Device], req: Request, extra: list[Fraction]
    ) -> bool:
        """Whether ``node`` has the CPUs and memory for a part on ``devices`` at ``t``, beside
        ``extra`` (what this request's other parts already take of it)."""
        if not self._uneven(node, req):
            return True
        cpus, mem = self._demand(node, devices, req)
        holders = self._holders(node, t)
        used_c = sum((a.cpus.get(node.name, 0) for a in holders), extra[0])
        used_m = sum((a.memory_mib.get(node.name, 0) for a in holders), extra[1])
        if used_c + cpus > node.cpus or used_m + mem > node.memory_mib:
            return False
        extra[0] += cpus
        extra[1] += mem
        return True

    def _room_from(self, node: Node, t: int, devices: list[Device], req: Request) -> int:
        """The earliest time from ``t`` at which the node could have the CPUs and memory for
        the part, all else equal: ``t``, or the next time an allocation on it ends."""
        if self._room(node, t, devices, req, [Fraction(0), Fraction(0)]):
            return t
        ends = [a.end for a in self._holders(node, t)]
        return min(ends) if ends else INF

    def _claim(self, req: Request, placed: list[list[Device]]) -> None:
        """Record what the allocations just placed hold of each node beside their GPUs."""
        for node, devs in zip(req.nodes, placed, strict=True):
            if not devs or devs[0].timeline[-1].alloc is None:
                continue  # CPU-only (the pattern records it), or unattributed use
            alloc = devs[0].timeline[-1].alloc
            cpus, mem = self._demand(node, devs, req)
            alloc.cpus[node.name] = alloc.cpus.get(node.name, Fraction(0)) + cpus
            alloc.memory_mib[node.name] = alloc.memory_mib.get(node.name, Fraction(0)) + mem
            if self._uneven(node, req):
                node.uneven = True

    def _fit(self, req: Request, t: int) -> list[list[Device]] | None:
        pool = req.pool
        if not pool:
            return None
        first = self._rng.randrange(len(pool))  # spread work over the nodes
        want = sorted(req.parts, reverse=True)
        got: list[list[Device]] = []
        req.nodes = []
        for i in range(len(pool)):
            node = pool[(first + i) % len(pool)]
            free = [d for d in node.devices if d.free_at <= t]
            extra = [Fraction(0), Fraction(0)]
            while (
                want and len(free) >= want[0] and self._room(node, t, free[: want[0]], req, extra)
            ):
                n = want.pop(0)
                got.append(free[:n])
                req.nodes.append(node)
                free = free[n:]
                if req.distinct_nodes:
                    break
            if not want:
                return got
        return None
